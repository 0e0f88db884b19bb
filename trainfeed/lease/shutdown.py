"""Handing work back when a worker is told to stop (SIGTERM: pod eviction, pre-emption).

Without this, Python dies on SIGTERM at once and its leases sit until they expire
(`--lease-timeout`). With it, every open worker session sends its finished-task reports and hands
its unfinished tasks back (LeaveJob), then the process dies of SIGTERM exactly as it would have,
so supervisors see the usual exit status. The handler is installed only from the main thread and
only where nobody installed one before: a training script's own SIGTERM handling wins (it can call
`reader.close()` itself).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self) -> None: ...


_SESSIONS: weakref.WeakSet[Closable] = weakref.WeakSet()
_installed = False


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
    for session in sessions:
        try:
            session.close()
        except Exception as e:  # dying anyway; the leases will expire
            logger.warning("could not hand tasks back: %s", e)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
