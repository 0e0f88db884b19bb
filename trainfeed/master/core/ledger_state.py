"""The state of one job's ledger (trainfeed.master.core.ledger) and the journaled ops that
change it.

`LedgerState` holds what the ledger knows: the current epoch's todo / pending / done / failed
partitions, progress, leases and their tokens, deadlines and a synchronous epoch's cut. Its one
way to change is `_apply`, one small JSON-able op at a time; `Ledger` (a subclass) decides which
op a call deserves, this module only performs it. So what the journal holds and what a replay
rebuilds are written down in one place, next to the fields they touch.

Journal: every change is also appended to `journal` (see `_apply`), which the master drains to its
state store after each call. Replaying a snapshot's ops through `replay` rebuilds the ledger
exactly, so the store never has to save the whole ledger per change. Lease deadlines are not
journaled: a restarted master gives every lease a fresh one anyway.

Costs: deadlines are per worker (a heartbeat renews all of a worker's leases at once) and expiries
come from a heap, so a call costs O(tasks touched), not O(partitions) or O(workers).

A base class rather than a part the ledger holds: the shells, the stealer and the tests read these
fields as `ledger.todo`, `ledger.pending` and so on, and a restore (trainfeed.master.core.
ledger_saved) fills them in place.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from trainfeed.master.core.ledger_fencing import lease_token
from trainfeed.planning.order import epoch_order

__all__ = ["DEFAULT_MAX_FAILURES", "LedgerState"]

# A partition that fails this many times in one epoch is given up on for that epoch: a poisoned
# shard must not stall training, and three tries ride out transient storage errors.
DEFAULT_MAX_FAILURES = 3


class LedgerState:
    """The fields of one job's ledger and the ops of its journal. Pure: no clock, socket or
    thread; not thread-safe (the master calls it from one event loop)."""

    def __init__(self, num_partitions: int, seed: int = 0,
                 max_failures: int = DEFAULT_MAX_FAILURES, epoch: int = 0,
                 token_key: bytes | None = None):
        if num_partitions < 1:
            raise ValueError(f"a job needs at least one partition, got {num_partitions}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be ≥ 1, got {max_failures}")
        self.num_partitions = num_partitions
        self.seed = seed
        self.max_failures = max_failures
        # Ops not yet handed to the state store (see `take_journal`).
        self.journal: list[list[Any]] = []
        # Partitions whose lease expired since this object was made: a metric, not state (not
        # saved; a restarted master counts from 0, as Prometheus counters may).
        self.expired_leases = 0
        # The counter of the fencing token the next lease gets (never reused, across epochs too).
        self.next_token = 1
        # Keys the tokens (see `lease_token`): None gives the counter itself.
        self.token_key = token_key
        # The partitions the previous epoch gave up on, with reasons: a reader whose pass of
        # that epoch ends after another reader started the next one must still be told.
        self.previous_failed: dict[int, str] = {}
        # Records per partition (the plan's; not state: the servicer sets it from the plan before
        # any replay). Needed by record budgets and synchronous cuts; None: unknown.
        self.sizes: tuple[int, ...] | None = None
        # (world_size, batch_size) of a synchronous job: the next epoch started is cut for it.
        self.group: tuple[int, int] | None = None
        self._start_epoch(epoch)

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.todo: deque[int] = deque(epoch_order(self.num_partitions, self.seed, epoch))
        self.pending: dict[int, str] = {}  # partition -> worker holding its lease
        self.by_worker: dict[str, dict[int, None]] = {}  # worker -> its leases, in lease order
        self.deadlines: dict[str, float] = {}  # worker -> when its leases expire
        self._expiry: list[tuple[float, str]] = []  # heap; stale entries are skipped
        self.done: dict[int, str] = {}  # partition -> worker that reported it
        self.failed: dict[int, str] = {}  # partition -> reason of the last failure
        self.failures: dict[int, int] = {}
        # Records of a partition already handed to a trainer (reported progress): whoever
        # leases it next skips them.
        self.progress: dict[int, int] = {}
        # Which worker's trainer reported that progress: a restore undoes its worker's progress
        # made after the checkpoint, also where the partition went back to todo unfinished.
        self.progress_by: dict[int, str] = {}
        # partition -> (worker, token) of its latest lease this epoch; kept after an expiry or a
        # hand-back until the partition is leased again (see `Fencing.check_report`).
        self.leases: dict[int, tuple[str, int]] = {}
        # partition -> every worker that held a lease of it this epoch: whose checkpoint may
        # rewind it (see `Resume.vouched`).
        self.holders: dict[int, set[str]] = {}
        # A synchronous epoch's cut: records it delivers (None: all), the partition the cut falls
        # in -> its records delivered, and how many records were dropped.
        self.keep: int | None = None
        self.limits: dict[int, int] = {}
        self.dropped = 0

    def _cut(self, keep: int) -> None:
        """Drops what a synchronous epoch does not deliver: past `keep` records in its order."""
        # mutmut: the message's text is equivalent (an assert on the servicer's own setup).
        assert self.sizes is not None, "a synchronous epoch needs the partition sizes"
        self.keep = keep
        total = 0
        for p in list(self.todo):
            size = self.sizes[p]
            if total >= keep:
                self.todo.remove(p)
                self.done[p] = ""  # dropped: done by nobody
                self.dropped += size
            elif total + size > keep:
                self.limits[p] = keep - total
                # mutmut: `=` is equivalent: the cut comes before every whole drop (dropped is 0).
                self.dropped += total + size - keep
            total += size

    # -- what the state says -------------------------------------------------------------------
    def keep_for(self, group: tuple[int, int] | None) -> int | None:
        """Records a synchronous epoch of `group` (world_size, batch_size) keeps; None: all."""
        if group is None or self.sizes is None:
            return None
        world_size, batch_size = group
        return sum(self.sizes) // (world_size * batch_size) * world_size * batch_size

    def deliverable(self, partition: int) -> int:
        """Records of `partition` this epoch delivers (its size, or the cut's limit)."""
        size = self.sizes[partition] if self.sizes is not None else 0
        return self.limits.get(partition, size)

    def remaining(self, partition: int) -> int:
        """Records of `partition` still to deliver this epoch (after its progress)."""
        return max(0, self.deliverable(partition) - self.progress.get(partition, 0))

    @property
    def untouched(self) -> bool:
        """Nothing of the current epoch was leased, reported or skipped yet."""
        return (not self.pending and not self.progress and not self.failures
                and all(w == "" for w in self.done.values()) and not self.leases)

    @property
    def complete(self) -> bool:
        """Every partition of the current epoch is done or failed."""
        return not self.todo and not self.pending

    def _still_open(self, partition: int) -> bool:
        return partition not in self.done and partition not in self.failed

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"partition {partition} out of range [0, {self.num_partitions})")

    def _set_deadline(self, worker: str, deadline: float) -> None:
        self.deadlines[worker] = deadline
        heapq.heappush(self._expiry, (deadline, worker))

    # -- the journal ---------------------------------------------------------------------------
    def _apply(self, op: list[Any], record: bool = True) -> None:
        """Performs one journaled change. Ops (all fields JSON-able):
        ["E", epoch(, keep)]    start `epoch`: a fresh shuffle, every queue empty (keep: the
                                synchronous cut, see `_cut`)
        ["L", worker, [p…]]     lease these todo partitions to worker (the first ones of todo,
                                but for those reserved for another worker)
        ["D", p, worker]        p done (from pending, or from todo: a late report)
        ["P", p, n(, worker)]   the first n records of p were handed to worker's trainer
        ["F", p, reason]        a failed attempt at pending p
        ["B", [p…]]             pending partitions back to the front of todo, in this order
        ["U", [p…]]             partitions (done, pending or todo) back to the front of todo
        """
        handler = self._OPS.get(op[0])
        if handler is None:
            raise ValueError(f"unknown ledger op {op!r}")
        handler(self, op)
        if record:
            self.journal.append(op)

    def _op_epoch(self, op: list[Any]) -> None:
        if op[1] != self.epoch:  # (a restart of the same epoch, for a new group, keeps it)
            self.previous_failed = dict(self.failed) if op[1] == self.epoch + 1 else {}
        self._start_epoch(op[1])
        if len(op) > 2 and op[2] is not None:
            self._cut(op[2])

    def _op_lease(self, op: list[Any]) -> None:
        worker, taken = op[1], op[2]
        held = self.by_worker.setdefault(worker, {})
        for partition in taken:
            self.todo.remove(partition)  # mostly the front of todo: O(1) for a deque
            self.pending[partition] = worker
            held[partition] = None  # mutmut: any value is equivalent (an ordered set)
            self._fence(partition, worker)
            self.holders.setdefault(partition, set()).add(worker)

    def _op_done(self, op: list[Any]) -> None:
        partition = op[1]
        if not self._unlease(partition):
            self.todo.remove(partition)
        self.done[partition] = op[2]
        self.progress.pop(partition, None)
        self.progress_by.pop(partition, None)

    def _op_progress(self, op: list[Any]) -> None:
        self.progress[op[1]] = op[2]
        if len(op) > 3:
            self.progress_by[op[1]] = op[3]
        else:
            self.progress_by.pop(op[1], None)

    def _op_failed(self, op: list[Any]) -> None:
        partition = op[1]
        self._unlease(partition)
        self.failures[partition] = self.failures.get(partition, 0) + 1
        if self.failures[partition] >= self.max_failures:
            self.failed[partition] = op[2]
            self.progress.pop(partition, None)
            self.progress_by.pop(partition, None)
        else:
            self.todo.appendleft(partition)

    def _op_back(self, op: list[Any]) -> None:
        back = op[1]
        if op[0] == "U":  # a rewind: the old holder's reports must not count any more
            for partition in back:
                self.leases.pop(partition, None)
        for partition in back:
            if not self._unlease(partition) and self.done.pop(partition, None) is None:
                self.todo.remove(partition)
        self.todo.extendleft(reversed(back))

    _OPS: dict[str, Callable[[LedgerState, list[Any]], None]] = {
        "E": _op_epoch, "L": _op_lease, "D": _op_done, "P": _op_progress, "F": _op_failed,
        "B": _op_back, "U": _op_back,
    }

    def _unlease(self, partition: int) -> bool:
        worker = self.pending.pop(partition, None)
        if worker is None:
            return False
        held = self.by_worker[worker]
        del held[partition]
        if not held:
            del self.by_worker[worker]
            self.deadlines.pop(worker, None)
        return True

    def _fence(self, partition: int, worker: str) -> None:
        """Gives the lease of `partition` just made to `worker` the next token (within `_apply`,
        so replaying the journal gives every lease the token it had)."""
        self.leases[partition] = (worker, lease_token(self.token_key, self.next_token))
        self.next_token += 1

    def take_journal(self) -> list[list[Any]]:
        """The ops since the last call, for the state store; clears them."""
        ops, self.journal = self.journal, []
        return ops

    def replay(self, ops: Iterable[list[Any]]) -> None:
        """Re-applies journaled ops on top of a restored snapshot (not journaled again)."""
        for op in ops:
            self._apply(op, record=False)  # mutmut: record=None is equivalent (falsy)
