"""The task ledger of one job: which partitions of the current epoch are todo, pending, done or
failed, who holds which lease, and when epochs roll over.

A pure state machine (Paddle's todo/pending/done queues): every method takes the current time as an
argument and touches no clock, socket or thread. The gRPC servicer, the lease timer and the state
store wrap it; that is what makes it property-testable and restorable after a restart.

Its parts, one concern each (this module decides; they hold, guard, rewind and save):
- trainfeed.master.core.ledger_state: `LedgerState`, the fields and the journaled ops that change
  them (what the journal holds and a replay rebuilds); `Ledger` subclasses it.
- trainfeed.master.core.ledger_fencing: lease tokens and `Fencing`, which reports and held leases
  still count.
- trainfeed.master.core.ledger_resume: `Resume`, a restored reader's checkpoint, vouched for and
  rewound.
- trainfeed.master.core.ledger_saved: the saved form (`state`, `from_state`).

Epoch protocol: a reader asks for tasks of epoch `e`.
- `e` below the current epoch, or `e` current and complete: EPOCH_DONE (the reader's pass ends).
- `e` current and todo non-empty: up to `max_tasks` tasks are leased.
- `e` current, todo empty but leases outstanding: WAIT (they may expire and come back).
- `e` above the current epoch: once the current epoch is complete, the ledger rolls over to `e`
  (a fresh shuffle of every partition); until then WAIT.

Fencing: every lease gets a token; a report counts only from the partition's latest holder with
that lease's token (`check_report`, see trainfeed.master.core.ledger_fencing); anything else is
refused and changes nothing.

Balance (issue 13): a reader that finds todo empty while others hold leases they have not started
(no progress reported) may ask for them back (`unstarted`; which ones,
trainfeed.master.core.stealing): the holder hands back, with a RELEASED report (`report_released`),
those whose records it has not begun to hand to its trainer, and they go to the front of todo
(`lease(reserved=...)` keeps them from readers they were not given back for).

Synchronous epochs (a `group` of world_size ranks taking batch_size records per step): each rank
must get the same number of records, so an epoch keeps `keep` = world_size × steps × batch_size
records, steps = records // (world_size × batch_size). The partitions past the cut in the epoch's
order are dropped at once (done, by nobody: `dropped`); the partition the cut falls in delivers
only its first `limits[p]` records. A rank leases by records (`lease(max_records=...)`) and hands
back what it does not need of its last partition (RELEASED with the count it keeps).

Costs: leasing, reporting and renewing are O(tasks touched), not O(partitions) or O(workers):
deadlines are per worker (a heartbeat renews all of a worker's leases at once) and expiries come
from a heap, so 1,000 workers over 100,000 partitions cost the same per call as one over ten.
"""
from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfeed.master.core.ledger_fencing import (
    TOKEN_BITS,
    Fencing,
    Outcome,
    Verdict,
    lease_token,
)
from trainfeed.master.core.ledger_resume import Resume
from trainfeed.master.core.ledger_saved import STATE_VERSION, check_version, restore, saved_form
from trainfeed.master.core.ledger_state import DEFAULT_MAX_FAILURES, LedgerState

# The ledger's vocabulary, importable from here as before the split into parts.
__all__ = ["DEFAULT_MAX_FAILURES", "STATE_VERSION", "TOKEN_BITS", "LeaseResult", "LeaseStatus",
           "Ledger", "Outcome", "Verdict", "lease_token"]


class LeaseStatus(enum.Enum):
    TASKS = "tasks"
    WAIT = "wait"
    EPOCH_DONE = "epoch_done"


@dataclass(frozen=True)
class LeaseResult:
    status: LeaseStatus
    epoch: int
    partitions: tuple[int, ...] = ()


class Ledger(LedgerState):
    """Todo / pending / done / failed partitions of one job's current epoch: the decisions
    (`LedgerState` holds the fields and performs the ops decided here).

    Not thread-safe: the master calls it from one event loop. Idempotent where the wire can
    repeat: reporting a partition done twice, or releasing a worker twice, changes nothing.
    """

    def __init__(self, num_partitions: int, seed: int = 0,
                 max_failures: int = DEFAULT_MAX_FAILURES, epoch: int = 0,
                 token_key: bytes | None = None):
        super().__init__(num_partitions, seed, max_failures, epoch, token_key)
        self._fencing = Fencing(self)
        self._resume = Resume(self)

    def set_group(self, group: tuple[int, int] | None) -> bool:
        """Makes the job synchronous for `group` (or not, for None) from the next epoch on; the
        current one is cut again at once if nobody touched it yet. Returns whether it did."""
        if group == self.group:
            return False
        self.group = group
        if self.untouched:
            self._apply(["E", self.epoch, self.keep_for(group)])
        return True

    def unstarted(self, worker: str) -> list[int]:
        """`worker`'s leases whose records none of its trainers was reported to have had: the
        candidates to ask back for an idle reader (the holder decides; see the module doc)."""
        return [p for p in self.by_worker.get(worker, ()) if p not in self.progress]

    def failed_in(self, epoch: int) -> dict[int, str] | None:
        """The partitions `epoch` gave up on (partition -> reason): this epoch's or the one
        before it; None for an epoch this ledger no longer knows."""
        if epoch == self.epoch:
            return dict(self.failed)
        if epoch == self.epoch - 1:
            return dict(self.previous_failed)
        return None

    def join_epoch(self) -> int:
        """The epoch a newly arriving reader should work on: this one, or the next if complete."""
        return self.epoch + 1 if self.complete else self.epoch

    # -- changes: each public method decides, `_apply` mutates and journals --------------------
    def lease(self, worker: str, epoch: int, max_tasks: int, now: float,
              lease_timeout: float, sharers: int = 1, max_records: int = 0,
              reserved: Mapping[int, str] | None = None) -> LeaseResult:
        """Leases up to `max_tasks` partitions of `epoch` to `worker` until now + lease_timeout.

        `sharers` is how many workers share the job: one call takes at most its fair share
        (todo / sharers, rounded up), so that a reader with a deep prefetch window cannot take a
        small epoch away from the others. `max_records` > 0 (a synchronous rank's remaining quota,
        with known sizes): no more partitions than cover that many records still to deliver.
        `reserved`: todo partitions given back for a reader (partition -> worker, see
        trainfeed.master.core.stealing): only that reader may take them, first and beyond its fair
        share; another one WAITs if nothing else is in todo.
        """
        self.expire(now)
        if epoch < self.epoch or (epoch == self.epoch and self.complete):
            return LeaseResult(LeaseStatus.EPOCH_DONE, self.epoch)
        if epoch > self.epoch:
            if not self.complete:
                return LeaseResult(LeaseStatus.WAIT, self.epoch)
            keep = self.keep_for(self.group)
            self._apply(["E", epoch] if keep is None else ["E", epoch, keep])
        free: Sequence[int] = self.todo
        own = 0
        if reserved:
            mine = [p for p in self.todo if reserved.get(p) == worker]
            free, own = mine + [p for p in self.todo if p not in reserved], len(mine)
        if not free:
            return LeaseResult(LeaseStatus.WAIT, self.epoch)
        share = own + -(-(len(free) - own) // max(1, sharers))
        count = self._within(free, min(len(free), max(1, min(max_tasks, share))), max_records)
        taken = [free[i] for i in range(count)]
        self._apply(["L", worker, taken])
        self._set_deadline(worker, now + lease_timeout)
        return LeaseResult(LeaseStatus.TASKS, self.epoch, tuple(taken))

    def _within(self, free: Sequence[int], count: int, max_records: int) -> int:
        """How many of the first `count` of `free` a lease takes when it may cover at most
        `max_records` records still to deliver (0: no bound, or sizes unknown)."""
        if max_records <= 0 or self.sizes is None:
            return count
        budget, limit, count = max_records, count, 0
        while count < limit and budget > 0:
            budget -= self.remaining(free[count])
            count += 1
        return count

    def report_done(self, epoch: int, partition: int, worker: str = "") -> bool:
        """Marks a partition of `epoch` done, whoever reports it (a late report of an expired
        lease still saves the work). Returns whether anything changed."""
        if epoch != self.epoch or partition in self.done or partition in self.failed:
            return False
        self._check_partition(partition)
        self._apply(["D", partition, worker])
        return True

    def report_progress(self, epoch: int, partition: int, consumed: int,
                        worker: str = "") -> bool:
        """Records that `consumed` records of a partition were handed to a trainer. Monotonic:
        a smaller figure (a late or reordered report) changes nothing. Returns whether it did."""
        if (epoch != self.epoch or partition in self.done or partition in self.failed
                or consumed <= self.progress.get(partition, 0)):
            return False
        self._check_partition(partition)
        self._apply(["P", partition, consumed, worker] if worker else ["P", partition, consumed])
        return True

    def report_released(self, epoch: int, partition: int, consumed: int, worker: str) -> bool:
        """`worker` hands back its pending lease of `partition`, `consumed` records of which its
        trainer has (or will have: a synchronous rank's kept part) had: the rest goes to the front
        of todo. Returns whether anything changed.

        A hand-back that comes after the lease went back to todo (it expired, or a call that
        overtook this one did not list it) and before anyone leased the partition again still
        counts its `consumed`, as a late PROGRESS does: a synchronous rank's cut delivers them
        whatever the master did meanwhile, so they must not be read again, nor the rank's
        quota left short (see `check_report`)."""
        if epoch != self.epoch or not worker:
            return False
        if self.pending.get(partition) != worker:
            if (self.leases.get(partition, ("",))[0] != worker or partition in self.pending
                    or not self._still_open(partition)
                    or consumed <= self.progress.get(partition, 0)):
                return False
            self._apply(["P", partition, consumed, worker])
            return True
        if consumed > self.progress.get(partition, 0):
            self._apply(["P", partition, consumed, worker])
        self._apply(["B", [partition]])
        return True

    def skip(self, partition: int) -> int:
        """How many leading records of `partition` a new holder skips."""
        return self.progress.get(partition, 0)

    def report_failed(self, epoch: int, partition: int, reason: str) -> bool:
        """Counts a failed attempt; after `max_failures` the partition is failed for this epoch,
        else it goes back to the front of todo. Returns whether anything changed."""
        if epoch != self.epoch or partition not in self.pending:
            return False
        self._apply(["F", partition, reason])
        return True

    def renew(self, worker: str, now: float, lease_timeout: float) -> int:
        """Pushes back the deadline of every lease `worker` holds; returns how many."""
        held = self.by_worker.get(worker)
        if not held:
            return 0
        self._set_deadline(worker, now + lease_timeout)
        return len(held)

    def expire(self, now: float) -> list[int]:
        """Returns overdue leases' partitions to the front of todo; returns them."""
        overdue: list[int] = []
        while self._expiry and self._expiry[0][0] <= now:
            deadline, worker = heapq.heappop(self._expiry)
            if self.deadlines.get(worker) == deadline:  # a worker with a deadline holds leases
                overdue.extend(self.by_worker[worker])
                del self.deadlines[worker]
        if overdue:
            self._apply(["B", overdue])
            self.expired_leases += len(overdue)
        return overdue

    def release(self, worker: str) -> list[int]:
        """Hands every lease of `worker` back to the front of todo (a clean leave)."""
        held = list(self.by_worker.get(worker, ()))
        if held:
            self._apply(["B", held])  # its last lease gone, `_unlease` drops its deadline
        return held

    def reconcile(self, worker: str, held: Iterable[tuple[int, int]]) -> list[int]:
        """Hands back every lease of `worker` in the current epoch that is not among the
        (epoch, partition) pairs it says it `held`: leases whose answer never reached it."""
        keep = {p for e, p in held if e == self.epoch}
        orphans = [p for p in self.by_worker.get(worker, ()) if p not in keep]
        if orphans:
            self._apply(["B", orphans])
        return orphans

    def held_by(self, worker: str) -> list[int]:
        return list(self.by_worker.get(worker, ()))

    def counts(self) -> dict[str, int]:
        return {"todo": len(self.todo), "pending": len(self.pending), "done": len(self.done),
                "failed": len(self.failed)}

    def refresh_deadlines(self, now: float, lease_timeout: float,
                          workers: Iterable[str] | None = None) -> None:
        """Gives every outstanding lease a fresh deadline (after a master restart the clock
        that set the old deadlines may be another machine's)."""
        chosen = self.by_worker if workers is None else [w for w in workers
                                                         if w in self.by_worker]
        for worker in chosen:
            self._set_deadline(worker, now + lease_timeout)

    # -- fencing (trainfeed.master.core.ledger_fencing) ----------------------------------------
    def token_of(self, partition: int) -> int:
        """The fencing token of the latest lease of `partition` this epoch (0: never leased)."""
        return self._fencing.token_of(partition)

    def check_report(self, worker: str, epoch: int, partition: int, token: int,
                     outcome: Outcome, consumed: int = 0) -> Verdict:
        """Whether a report of `worker` on (`epoch`, `partition`) with lease `token` may count
        (see `Fencing.check_report`). Pure: changes nothing."""
        return self._fencing.check_report(worker, epoch, partition, token, outcome, consumed)

    def revoked(self, worker: str, held: Iterable[tuple[int, int, int]]) -> list[
            tuple[int, int, int]]:
        """Of the (epoch, partition, token) leases `worker` says it holds, those that are not
        its own any more (see `Fencing.revoked`). Pure."""
        return self._fencing.revoked(worker, held)

    # -- resume (trainfeed.master.core.ledger_resume) ------------------------------------------
    def rewind(self, epoch: int, worker: str, keep_done: Iterable[int],
               positions: dict[int, int]) -> list[int]:
        """Puts a restored reader's partitions back where its checkpoint saw them (see
        `Resume.rewind`); returns the partitions put back."""
        return self._resume.rewind(epoch, worker, keep_done, positions)

    def vouched_resume(self, epoch: int, worker: str, keep_done: Iterable[int],
                       positions: Mapping[int, int]) -> tuple[list[int], dict[int, int], list[int]]:
        """What of a restored reader's checkpoint this ledger can vouch for, as `rewind`'s
        arguments: (keep_done, positions, the partitions whose claim was cut or dropped) (see
        `Resume.vouched`). Pure."""
        return self._resume.vouched(epoch, worker, keep_done, positions)

    # -- the state contract (trainfeed.master.core.ledger_saved) -------------------------------
    def state(self) -> dict[str, Any]:
        """A JSON-serializable snapshot; `Ledger.from_state` restores it exactly (but for lease
        deadlines, which `refresh_deadlines` sets afresh)."""
        return saved_form(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ledger:
        check_version(state)
        ledger = cls(state["num_partitions"], state["seed"], state["max_failures"],
                     state["epoch"])
        restore(ledger, state)
        return ledger
