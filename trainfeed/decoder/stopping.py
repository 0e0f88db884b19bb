"""A decoder's life until SIGTERM or SIGINT, and its drain after (issue 37; the decisions are
trainfeed.decoder.drain's).

On the first signal the decoder refuses new calls (trainers ask another decoder), ends its
registration (the master takes it off its list at once, not after its silence timeout), and waits
for the calls in flight, for at most the grace, saying after LOG_AFTER_S what it waits for and
until when. A second signal stops the wait.

Exit status: 0 when every call in flight finished (the stop asked for is done: a rollout or a
scale-down is not an error to Kubernetes or to a supervisor); 128 + the signal (143 for SIGTERM,
as if the signal had killed it) when the grace ran out and calls were cut, so that an operator
sees a stop that was not clean. Cut calls lose nothing: their trainers ask another decoder for
the rest, from the last record received.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Protocol

from trainfeed.decoder.drain import Drain

logger = logging.getLogger(__name__)

__all__ = ["serve_until_stopped"]

# How often the wait checks the calls in flight (a finished drain exits within this).
POLL_S = 0.1


class _Server(Protocol):
    def drain(self) -> None: ...
    def in_flight(self) -> int: ...
    def close(self) -> None: ...


class _Registration(Protocol):
    def close(self) -> None: ...


class _Signals:
    """The signals received (set from the handler, read by the main thread: no locks in a
    handler)."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.count = 0
        self.event = threading.Event()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.first is None:
            self.first = signum
        self.event.set()


def serve_until_stopped(server: _Server, drain: Drain,
                        registration: _Registration | None) -> int:
    """Serves (the server runs on its own threads) until SIGTERM or SIGINT, then drains;
    returns the exit status (see the module docstring), or exits the process at once with it
    when calls had to be cut (shutting the server down would wait for them). Main thread only:
    it installs the signal handlers."""
    signals = _Signals()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signals)
    while not signals.event.wait(1.0):
        pass
    name = signal.Signals(signals.first or signal.SIGTERM).name
    server.drain()
    drain.begin(time.monotonic())
    logger.warning("%s: stopping: new calls are refused (trainers ask another decoder), %d in "
                   "flight may finish until %s (--drain-s %g)", name, server.in_flight(),
                   drain.until(time.monotonic()), drain.grace_s)
    if registration is not None:
        registration.close()  # (the master takes it off its list when the stream ends)
    status = _wait(server, drain, signals)
    if status:
        _exit_now(status)
    server.close()
    logger.info("%s: every call in flight finished: stopped", name)
    return 0


def _wait(server: _Server, drain: Drain, signals: _Signals) -> int:
    """Waits for the drain; its exit status (0: nothing left in flight)."""
    while True:
        now = time.monotonic()
        if signals.count > 1:
            drain.cut(now)
        left = server.in_flight()
        if drain.over(now, left):
            break
        if drain.log_due(now):
            logger.warning("still draining: %d call(s) in flight; waiting for them until %s, "
                           "then they are cut (their trainers ask another decoder for the "
                           "rest)", left, drain.until(now))
        time.sleep(POLL_S)
    if not left:
        return 0
    why = "a second signal" if signals.count > 1 else f"the {drain.grace_s:g} s grace is over"
    logger.warning("%s with %d call(s) in flight: cut (their trainers ask another decoder for "
                   "the rest, from the last record received)", why, left)
    return 128 + (signals.first or signal.SIGTERM)


def _exit_now(status: int) -> None:
    """Ends the process now: a Flight server's shutdown waits for its calls in flight, which
    would hold the decoder past its grace (the pod is then SIGKILLed anyway)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
