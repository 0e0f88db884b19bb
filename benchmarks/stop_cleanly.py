"""A benchmark stopped by SIGTERM or SIGINT (Ctrl-C, `kill`, a CI timeout) still stops the
servers it started and removes their data.

The servers (a private PostgreSQL, a master, tf.data service peers, reader processes) and their
temporary folders are all held by `with` blocks and `finally` clauses, which an exception runs
but SIGTERM's default action (the process ends on the spot) does not: `pack_throughput.py
--rows 1000000` stopped by SIGTERM left its PostgreSQL running with 7.9 GB in a temp folder.
:func:`exit_cleanly_on_signals` turns SIGTERM into SystemExit (and SIGINT into the usual
KeyboardInterrupt) in the main thread, so those blocks run; a second signal during the clean-up
is ignored (with a line saying so) rather than cutting the clean-up short. SIGKILL stays the
way to abandon it.
"""
from __future__ import annotations

import signal
import sys
from types import FrameType

__all__ = ["exit_cleanly_on_signals"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_cleanly_on_signals() -> None:
    """Installs the handlers; call first thing in a benchmark's main() (main thread only)."""
    for signum in _SIGNALS:
        signal.signal(signum, _stop)


def _stop(signum: int, frame: FrameType | None) -> None:
    for other in _SIGNALS:
        signal.signal(other, _cleaning_up)
    name = signal.Signals(signum).name
    print(f"{name}: stopping the servers this benchmark started and removing their data "
          f"(further signals are ignored; SIGKILL abandons the clean-up)", file=sys.stderr,
          flush=True)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _cleaning_up(signum: int, frame: FrameType | None) -> None:
    print(f"{signal.Signals(signum).name} ignored: still cleaning up", file=sys.stderr,
          flush=True)
