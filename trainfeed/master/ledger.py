"""The task ledger of one job: which partitions of the current epoch are todo, pending, done or
failed, who holds which lease, and when epochs roll over.

A pure state machine (Paddle's todo/pending/done queues): every method takes the current time as an
argument and touches no clock, socket or thread. The gRPC servicer, the lease timer and the state
store wrap it; that is what makes it property-testable and restorable after a restart.

Epoch protocol: a reader asks for tasks of epoch `e`.
- `e` below the current epoch, or `e` current and complete: EPOCH_DONE (the reader's pass ends).
- `e` current and todo non-empty: up to `max_tasks` tasks are leased.
- `e` current, todo empty but leases outstanding: WAIT (they may expire and come back).
- `e` above the current epoch: once the current epoch is complete, the ledger rolls over to `e`
  (a fresh shuffle of every partition); until then WAIT.
"""
from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

STATE_VERSION = 1
# A partition that fails this many times in one epoch is given up on for that epoch: a poisoned
# shard must not stall training, and three tries ride out transient storage errors.
DEFAULT_MAX_FAILURES = 3


class LeaseStatus(enum.Enum):
    TASKS = "tasks"
    WAIT = "wait"
    EPOCH_DONE = "epoch_done"


@dataclass(frozen=True)
class LeaseResult:
    status: LeaseStatus
    epoch: int
    partitions: tuple[int, ...] = ()


@dataclass
class Lease:
    worker: str
    deadline: float


def epoch_order(num_partitions: int, seed: int, epoch: int) -> list[int]:
    """The partition order of an epoch: a permutation derived from (seed, epoch) alone."""
    return [int(p) for p in np.random.default_rng((seed, epoch)).permutation(num_partitions)]


class Ledger:
    """Todo / pending / done / failed partitions of one job's current epoch.

    Not thread-safe: the master calls it from one event loop. Idempotent where the wire can
    repeat: reporting a partition done twice, or releasing a worker twice, changes nothing.
    """

    def __init__(self, num_partitions: int, seed: int = 0,
                 max_failures: int = DEFAULT_MAX_FAILURES, epoch: int = 0):
        if num_partitions < 1:
            raise ValueError(f"a job needs at least one partition, got {num_partitions}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be ≥ 1, got {max_failures}")
        self.num_partitions = num_partitions
        self.seed = seed
        self.max_failures = max_failures
        self._start_epoch(epoch)

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.todo: deque[int] = deque(epoch_order(self.num_partitions, self.seed, epoch))
        self.pending: dict[int, Lease] = {}
        self.done: set[int] = set()
        self.failed: dict[int, str] = {}
        self.failures: dict[int, int] = {}
        # Records of a partition already handed to a trainer (reported progress): whoever
        # leases it next skips them.
        self.progress: dict[int, int] = {}

    @property
    def complete(self) -> bool:
        """Every partition of the current epoch is done or failed."""
        return not self.todo and not self.pending

    def join_epoch(self) -> int:
        """The epoch a newly arriving reader should work on: this one, or the next if complete."""
        return self.epoch + 1 if self.complete else self.epoch

    def lease(self, worker: str, epoch: int, max_tasks: int, now: float,
              lease_timeout: float, sharers: int = 1) -> LeaseResult:
        """Leases up to `max_tasks` partitions of `epoch` to `worker` until now + lease_timeout.

        `sharers` is how many workers share the job: one call takes at most its fair share
        (todo / sharers, rounded up), so that a reader with a deep prefetch window cannot take a
        small epoch away from the others.
        """
        self.expire(now)
        if epoch < self.epoch or (epoch == self.epoch and self.complete):
            return LeaseResult(LeaseStatus.EPOCH_DONE, self.epoch)
        if epoch > self.epoch:
            if not self.complete:
                return LeaseResult(LeaseStatus.WAIT, self.epoch)
            self._start_epoch(epoch)
        if not self.todo:
            return LeaseResult(LeaseStatus.WAIT, self.epoch)
        share = -(-len(self.todo) // max(1, sharers))
        taken: list[int] = []
        while self.todo and len(taken) < max(1, min(max_tasks, share)):
            partition = self.todo.popleft()
            self.pending[partition] = Lease(worker, now + lease_timeout)
            taken.append(partition)
        return LeaseResult(LeaseStatus.TASKS, self.epoch, tuple(taken))

    def report_done(self, epoch: int, partition: int) -> bool:
        """Marks a partition of `epoch` done, whoever reports it (a late report of an expired
        lease still saves the work). Returns whether anything changed."""
        if epoch != self.epoch or partition in self.done or partition in self.failed:
            return False
        self._check_partition(partition)
        if self.pending.pop(partition, None) is None:
            try:
                self.todo.remove(partition)
            except ValueError:
                return False
        self.done.add(partition)
        self.progress.pop(partition, None)
        return True

    def report_progress(self, epoch: int, partition: int, consumed: int) -> bool:
        """Records that `consumed` records of a partition were handed to a trainer. Monotonic:
        a smaller figure (a late or reordered report) changes nothing. Returns whether it did."""
        if (epoch != self.epoch or partition in self.done or partition in self.failed
                or consumed <= self.progress.get(partition, 0)):
            return False
        self._check_partition(partition)
        self.progress[partition] = consumed
        return True

    def skip(self, partition: int) -> int:
        """How many leading records of `partition` a new holder skips."""
        return self.progress.get(partition, 0)

    def report_failed(self, epoch: int, partition: int, reason: str) -> bool:
        """Counts a failed attempt; after `max_failures` the partition is failed for this epoch,
        else it goes back to the front of todo. Returns whether anything changed."""
        if epoch != self.epoch or partition not in self.pending:
            return False
        del self.pending[partition]
        self.failures[partition] = self.failures.get(partition, 0) + 1
        if self.failures[partition] >= self.max_failures:
            self.failed[partition] = reason
        else:
            self.todo.appendleft(partition)
        return True

    def renew(self, worker: str, now: float, lease_timeout: float) -> int:
        """Pushes back the deadline of every lease `worker` holds; returns how many."""
        renewed = 0
        for lease in self.pending.values():
            if lease.worker == worker:
                lease.deadline = now + lease_timeout
                renewed += 1
        return renewed

    def expire(self, now: float) -> list[int]:
        """Returns overdue leases' partitions to the front of todo; returns them."""
        overdue = [p for p, lease in self.pending.items() if lease.deadline <= now]
        for partition in overdue:
            del self.pending[partition]
        self.todo.extendleft(reversed(overdue))
        return overdue

    def release(self, worker: str) -> list[int]:
        """Hands every lease of `worker` back to the front of todo (a clean leave)."""
        held = [p for p, lease in self.pending.items() if lease.worker == worker]
        for partition in held:
            del self.pending[partition]
        self.todo.extendleft(reversed(held))
        return held

    def held_by(self, worker: str) -> list[int]:
        return [p for p, lease in self.pending.items() if lease.worker == worker]

    def counts(self) -> dict[str, int]:
        return {"todo": len(self.todo), "pending": len(self.pending), "done": len(self.done),
                "failed": len(self.failed)}

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} out of range [0, {self.num_partitions})")

    # -- the state contract ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """A JSON-serializable snapshot; `Ledger.from_state` restores it exactly."""
        return {
            "version": STATE_VERSION, "num_partitions": self.num_partitions, "seed": self.seed,
            "max_failures": self.max_failures, "epoch": self.epoch, "todo": list(self.todo),
            "pending": {str(p): [lease.worker, lease.deadline]
                        for p, lease in self.pending.items()},
            "done": sorted(self.done),
            "failed": {str(p): reason for p, reason in self.failed.items()},
            "failures": {str(p): n for p, n in self.failures.items()},
            "progress": {str(p): n for p, n in self.progress.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ledger:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"ledger state version {state.get('version')!r}, "
                             f"expected {STATE_VERSION}")
        ledger = cls(state["num_partitions"], state["seed"], state["max_failures"],
                     state["epoch"])
        ledger.todo = deque(state["todo"])
        ledger.pending = {int(p): Lease(w, d) for p, (w, d) in state["pending"].items()}
        ledger.done = set(state["done"])
        ledger.failed = {int(p): r for p, r in state["failed"].items()}
        ledger.failures = {int(p): n for p, n in state["failures"].items()}
        ledger.progress = {int(p): n for p, n in state.get("progress", {}).items()}
        return ledger

    def refresh_deadlines(self, now: float, lease_timeout: float,
                          workers: Iterable[str] | None = None) -> None:
        """Gives every outstanding lease a fresh deadline (after a master restart the clock
        that set the old deadlines may be another machine's)."""
        for lease in self.pending.values():
            if workers is None or lease.worker in workers:
                lease.deadline = now + lease_timeout
