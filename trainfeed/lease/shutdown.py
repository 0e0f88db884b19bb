"""Handing work back when a worker stops: told to (SIGTERM), or at the end of its script.

- **SIGTERM** (pod eviction, pre-emption). Without this, Python dies on SIGTERM at once and its
  leases sit until they expire (`--lease-timeout`). With it, every open worker session sends its
  finished-task reports and hands its unfinished tasks back (LeaveJob), then the process dies of
  SIGTERM exactly as it would have, so supervisors see the usual exit status. The handler is
  installed only from the main thread and only where nobody installed one before: a training
  script's own SIGTERM handling wins (it can call `reader.close()` itself).
- **A normal exit without `reader.close()`** (the README's train.py: read the epochs, return).
  The reporter is a daemon thread and a Reader sits in a reference cycle, so nothing else sends
  the last DONE reports: the master would see a rank go silent inside an epoch it never saw end,
  and call a finished synchronous group broken (issue 38). An `atexit` hook closes every session
  this process opened, so its reports reach the master and it leaves the job. A forked child
  (a DataLoader worker) forgets its parent's sessions: closing a copy would make the master think
  the parent left.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import weakref
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)


class Closable(Protocol):
    # close() returns within this many seconds, whatever the master does.
    close_bound_s: float

    def close(self) -> None: ...


_SESSIONS: weakref.WeakSet[Closable] = weakref.WeakSet()
_installed = False
# Closing at exit says so when it takes longer than this (no silent waits): a master that does
# not answer holds each session's close for up to its hand-back bound.
SAY_AFTER_S = 5.0


def register(session: Closable) -> None:
    """Closes `session` on SIGTERM (installing the handler on first use, where allowed)."""
    global _installed
    _SESSIONS.add(session)
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    sessions = list(_SESSIONS)
    logger.warning("SIGTERM: handing the tasks of %d reader(s) back to the master",
                   len(sessions))
    _close_each(sessions, "")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _close_all_at_exit() -> None:
    """Closes every session still open when the interpreter exits (see the module docstring)."""
    sessions = list(_SESSIONS)
    if not sessions:
        return
    started = time.time()
    latest = started + sum(session.close_bound_s for session in sessions)
    timer = threading.Timer(SAY_AFTER_S, logger.warning, args=(
        "exiting: still handing the tasks of %d reader(s) back to the master (reports, then "
        "LeaveJob) since %s; a master that does not answer is given up by %s at the latest "
        "(its leases then expire)", len(sessions), time.strftime("%H:%M:%S",
        time.localtime(started)), time.strftime("%H:%M:%S", time.localtime(latest))))
    timer.daemon = True
    timer.start()
    try:
        _close_each(sessions, " at exit")
    finally:
        timer.cancel()


def _close_each(sessions: list[Closable], when: str) -> None:
    """Closes every session; one that fails is said and the others still close (the process
    ends anyway, and a lease not handed back expires)."""
    for session in sessions:
        try:
            session.close()
        except Exception as e:
            logger.warning("could not hand tasks back%s: %s", when, e)


atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_SESSIONS.clear)
