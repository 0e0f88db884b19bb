"""The state store contract and what every store shares: the saved form of a job, and the
loop that waits for the leadership.

A job's state is a snapshot plus a journal: every state change (a lease, a report, an expiry, an
epoch rollover) is appended as a small op before the master answers the call that made it, and
every so often the master writes a fresh snapshot, which drops the journal before it. Appending a
few ops costs the same whatever the job's size, where saving the whole ledger per change grew
with the number of partitions (74 round trips/s at 100,000 partitions).

Leadership: two masters serving the same state would hand every task out twice. `acquire` blocks
until this process is the only master of the store (an etcd lease-backed key; an exclusive file
lock beside a SQLite file), and a store that loses it raises LeadershipError on the next write.
Each store knows how to try once; :func:`wait_for_leadership` is the waiting around it, the same
for all of them.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from trainfeed.errors import LeadershipError
from trainfeed.master.core.saved_job import SavedJob

__all__ = ["ACQUIRE_POLL_S", "SavedJob", "StateStore", "wait_for_leadership"]

logger = logging.getLogger(__name__)

# How often a master waiting for the leadership looks again.
ACQUIRE_POLL_S = 0.5


class StateStore(Protocol):
    """Durable job state. Implementations are called from one thread at a time."""

    url: str

    @classmethod
    def from_url(cls, url: str) -> StateStore:
        """Opens the store `url` names (its scheme chose this class in `STORES`)."""
        ...

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        """Blocks until `owner` is the only master serving from this store.

        Raises LeadershipError if another master still holds it after `wait_s` seconds
        (None: wait for ever, as a standby master does)."""
        ...

    def leading(self) -> bool:
        """Whether this store still holds the leadership it acquired (an etcd lease can be lost
        without a write noticing; the master polls this and stops)."""
        ...

    def load_jobs(self) -> dict[str, SavedJob]:
        """Every saved job, by name."""
        ...

    def append(self, job: str, ops: Sequence[Any]) -> None:
        """Durably appends JSON-serializable `ops` to the journal of `job` before returning."""
        ...

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        """Durably appends several jobs' ops in ONE transaction (the journal writer's group
        commit): all of them, or none (then it raises)."""
        ...

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        """Atomically replaces the snapshot of `job` and drops its journal (which the snapshot
        includes)."""
        ...

    def close(self) -> None:
        """Releases the store and its leadership; safe to call twice."""
        ...


def wait_for_leadership(try_acquire: Callable[[], str | None], wait_s: float | None, *,
                        refusal: Callable[[str], str], waiting: Callable[[str], str],
                        transient: tuple[type[Exception], ...] = ()) -> None:
    """Calls `try_acquire` every ACQUIRE_POLL_S until it takes the leadership.

    Args:
        try_acquire: One attempt: None once this process holds the leadership, else a
            description of who holds it.
        wait_s: Give up after this many seconds (None: wait for ever, as a standby does).
        refusal: The LeadershipError's message, given the holder, when `wait_s` runs out.
        waiting: The warning logged, given the holder, when a (new) holder is seen.
        transient: Errors of an attempt that are waited out like a holder (an etcd that is
            restarting); after `wait_s` the last one is raised.

    Raises:
        LeadershipError: another master still holds it after `wait_s`.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    logged_holder: str | None = None
    while True:
        try:
            holder = try_acquire()
        except transient as e:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            logger.warning("%s; retrying", e)
            time.sleep(ACQUIRE_POLL_S)
            continue
        if holder is None:
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise LeadershipError(refusal(holder))
        if holder != logged_holder:
            logger.warning("%s", waiting(holder))
            logged_holder = holder
        time.sleep(ACQUIRE_POLL_S)
