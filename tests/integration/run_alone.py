"""A readers-writer lock between the pytest-xdist workers of one run, on two files.

A test whose assertions are about wall-clock time (a lease outlived, a share of the work, a wait
under 2 s) takes it exclusively and so runs alone, as in a serial run; every other test takes it
shared and runs beside any other but those. It prefers the writer: while a timing test waits
for the running tests to end, no new test starts (``gate``), so it cannot be starved.

flock(2) locks belong to an open file, so each worker's own open files make the workers'
claims distinct, and the kernel drops them if a worker dies.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


class RunAloneLock:
    """The lock, under ``folder`` (one for all the workers of a run)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._gate = -1
        self._rw = -1

    def __enter__(self) -> RunAloneLock:
        self._gate = os.open(self.folder / "run-alone.gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._rw = os.open(self.folder / "run-alone.lock", os.O_RDWR | os.O_CREAT, 0o600)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for fd in (self._gate, self._rw):
            os.close(fd)  # releases whatever this worker still held

    @contextmanager
    def alone(self, test: str) -> Iterator[None]:
        """Run ``test`` with no other test of the run running."""
        self._take(self._gate, fcntl.LOCK_EX, "another test that runs alone to end")
        try:
            (self.folder / "run-alone.holder").write_text(test)
            self._take(self._rw, fcntl.LOCK_EX, "the tests running on other workers to end")
            try:
                yield
            finally:
                fcntl.flock(self._rw, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    @contextmanager
    def beside_others(self) -> Iterator[None]:
        """Run a test beside any other but one that runs alone."""
        self._take(self._gate, fcntl.LOCK_EX, "a test that runs alone to end")
        try:
            self._take(self._rw, fcntl.LOCK_SH, "a test that runs alone to end")
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._rw, fcntl.LOCK_UN)

    def _take(self, fd: int, operation: int, what: str) -> None:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        holder = self.folder / "run-alone.holder"
        test = holder.read_text() if holder.exists() else "?"
        # No deadline of its own: the other test's 300 s pytest-timeout bounds it.
        log.warning("waiting for %s (the last to run alone: %s), as long as it takes", what,
                    test)
        started = time.monotonic()
        fcntl.flock(fd, operation)
        log.warning("waited %.1f s for %s", time.monotonic() - started, what)
