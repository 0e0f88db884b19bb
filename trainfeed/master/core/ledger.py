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

Journal: every change is also appended to `journal` as a small JSON-able op (see `_apply`), which
the master drains to its state store after each call. Replaying a snapshot's ops through `replay`
rebuilds the ledger exactly, so the store never has to save the whole ledger per change. Lease
deadlines are not journaled: a restarted master gives every lease a fresh one anyway.

Fencing: every lease gets a token (`leases`, from a counter that is part of the state, so replay
gives the same tokens). With a `token_key` (the master gives every job a random one, saved with the
state) a token is a keyed hash of the counter, 63 bits that nobody without the key can guess;
without one (tests, old states) the token is the counter itself. A report counts only from the
partition's latest holder with that lease's token (`check_report`); anything else is refused and
changes nothing, so a reader whose lease expired and went to another reader can neither finish, fail
nor advance the partition.

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
import hashlib
import heapq
import hmac
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfeed.planning.order import epoch_order

STATE_VERSION = 4
# A partition that fails this many times in one epoch is given up on for that epoch: a poisoned
# shard must not stall training, and three tries ride out transient storage errors.
DEFAULT_MAX_FAILURES = 3


class LeaseStatus(enum.Enum):
    TASKS = "tasks"
    WAIT = "wait"
    EPOCH_DONE = "epoch_done"


class Verdict(enum.Enum):
    """What a report deserves (see `Ledger.check_report`)."""

    APPLY = "apply"  # from the holder with its token: apply it
    REPEAT = "repeat"  # from the holder, but already in effect (a retried call): nothing to do
    REFUSE = "refuse"  # not from the partition's latest holder with its token, or a past epoch
    INVALID = "invalid"  # names a partition or epoch that cannot exist


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    PROGRESS = "progress"
    RELEASED = "released"


@dataclass(frozen=True)
class LeaseResult:
    status: LeaseStatus
    epoch: int
    partitions: tuple[int, ...] = ()


# Fencing tokens travel as uint64 and JSON integers: 63 bits keep them positive everywhere.
TOKEN_BITS = 63


def lease_token(key: bytes | None, counter: int) -> int:
    """The fencing token of the `counter`-th lease: HMAC-SHA256(key, counter) cut to TOKEN_BITS
    bits (never 0, which means "no lease"), or `counter` itself without a key. Deterministic, so
    a replayed journal gives every lease the token it had; unguessable without the key."""
    if key is None:
        return counter
    digest = hmac.new(key, counter.to_bytes(8, "big"), hashlib.sha256).digest()
    return (int.from_bytes(digest[:8], "big") >> (64 - TOKEN_BITS)) or 1


class Ledger:
    """Todo / pending / done / failed partitions of one job's current epoch.

    Not thread-safe: the master calls it from one event loop. Idempotent where the wire can
    repeat: reporting a partition done twice, or releasing a worker twice, changes nothing.
    """

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
        # hand-back until the partition is leased again (see `check_report`).
        self.leases: dict[int, tuple[str, int]] = {}
        # partition -> every worker that held a lease of it this epoch: whose checkpoint may
        # rewind it (see `vouched_resume`).
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

    @property
    def complete(self) -> bool:
        """Every partition of the current epoch is done or failed."""
        return not self.todo and not self.pending

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

    def rewind(self, epoch: int, worker: str, keep_done: Iterable[int],
               positions: dict[int, int]) -> list[int]:
        """Puts a restored reader's partitions back where its checkpoint saw them.

        A trainer restarted from a checkpoint lost every record it consumed after it, and had
        every record it consumed before. So, in `epoch`: each partition in `keep_done` (done at
        checkpoint time) is done, even if its report never arrived; each other partition
        `worker` completed or still holds goes back to the front of todo, as does each partition
        in `positions` (in the trainer's hands at checkpoint time), which restarts after exactly
        that many records (the others at 0). Returns the partitions put back; nothing if `epoch`
        is over.
        """
        if epoch != self.epoch:
            return []
        keep = {p for p in keep_done if 0 <= p < self.num_partitions}
        for p in sorted(keep):
            if p not in self.done and p not in self.failed:
                self._apply(["D", p, worker])
        back = self._rewound(worker, keep, positions)
        if not back:
            return []
        self._apply(["U", back])
        for p in back:
            self._apply(["P", p, max(0, positions.get(p, 0))])
        return back

    def _rewound(self, worker: str, keep: set[int], positions: dict[int, int]) -> list[int]:
        """What `rewind` puts back, in this order: what `worker` completed (but `keep`), what
        it holds, the partitions of `positions`, what its trainer made progress on."""
        back: dict[int, None] = {}  # an ordered set
        for p, w in self.done.items():
            if w == worker and p not in keep:
                back[p] = None
        for p in self.by_worker.get(worker, ()):
            back[p] = None
        open_ = self._still_open
        for p in positions:
            if open_(p) and 0 <= p < self.num_partitions:
                back[p] = None
        for p, w in self.progress_by.items():
            if w == worker and p not in keep and open_(p):
                back[p] = None
        return list(back)

    def _still_open(self, partition: int) -> bool:
        return partition not in self.done and partition not in self.failed

    def vouched_resume(self, epoch: int, worker: str, keep_done: Iterable[int],
                       positions: Mapping[int, int]) -> tuple[list[int], dict[int, int], list[int]]:
        """What of a restored reader's checkpoint this ledger can vouch for, as `rewind`'s
        arguments: a resume may re-deliver records, never mark as consumed a record that no
        fenced report showed consumed, and never touch a partition `worker` did not hold.

        Of `keep_done` and `positions`, only partitions `worker` held a lease of in `epoch`
        count. A partition kept done must be done here (else it resumes where its reports left
        it); a position is cut to the records reported consumed (a done partition's: any). Returns
        (keep_done, positions, the partitions whose claim was cut or dropped), all sorted; nothing
        when `epoch` is not the current one (then `rewind` does nothing either). Pure.
        """
        if epoch != self.epoch:
            return [], {}, []
        ours = {p for p, workers in self.holders.items() if worker in workers}
        keep = sorted({p for p in keep_done if p in ours and p in self.done})
        cut = sorted({p for p in keep_done if p not in keep}
                     | {p for p in positions if p not in ours})
        vouched: dict[int, int] = {}
        for p in sorted(p for p in keep_done if p in ours and p not in self.done):
            vouched[p] = self.progress.get(p, 0)  # claimed whole: as far as reports showed
        cut += self._vouch_positions(positions, ours, vouched)
        return keep, vouched, sorted(set(cut))

    def _vouch_positions(self, positions: Mapping[int, int], ours: set[int],
                         vouched: dict[int, int]) -> list[int]:
        """Adds to `vouched` each position of a partition in `ours` (not vouched already), cut
        to the records reported consumed (a done partition's: any); returns those cut."""
        cut = []
        for p, n in sorted(positions.items()):
            if p not in ours or p in vouched:
                continue
            known = n if p in self.done else self.progress.get(p, 0)
            vouched[p] = min(n, known)
            if n > known:
                cut.append(p)
        return cut

    def held_by(self, worker: str) -> list[int]:
        return list(self.by_worker.get(worker, ()))

    def counts(self) -> dict[str, int]:
        return {"todo": len(self.todo), "pending": len(self.pending), "done": len(self.done),
                "failed": len(self.failed)}

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

    _OPS: dict[str, Callable[[Ledger, list[Any]], None]] = {
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

    # -- fencing -------------------------------------------------------------------------------
    def _fence(self, partition: int, worker: str) -> None:
        """Gives the lease of `partition` just made to `worker` the next token (within `_apply`,
        so replaying the journal gives every lease the token it had)."""
        self.leases[partition] = (worker, lease_token(self.token_key, self.next_token))
        self.next_token += 1

    def token_of(self, partition: int) -> int:
        """The fencing token of the latest lease of `partition` this epoch (0: never leased)."""
        lease = self.leases.get(partition)
        return lease[1] if lease is not None else 0

    def check_report(self, worker: str, epoch: int, partition: int, token: int,
                     outcome: Outcome, consumed: int = 0) -> Verdict:
        """Whether a report of `worker` on (`epoch`, `partition`) with lease `token` may count.

        INVALID for a partition out of [0, num_partitions) or an epoch out of [0, current].
        REFUSE unless the partition's latest lease this epoch is `worker`'s with `token`: a past
        epoch, a partition never leased, leased to another, or leased again since (a stale
        token). From the latest holder: APPLY while it is pending; after an expiry or a
        hand-back that nobody followed with a new lease, DONE and PROGRESS still APPLY (nobody
        else reads it, and it saves re-reading what the trainer had), and so does a RELEASED
        whose `consumed` goes past the partition's progress (a synchronous rank's cut, whose
        kept records its trainer gets: see `report_released`); FAILED and any other RELEASED are
        a REPEAT (it is in todo already); on a done or failed partition any report is a REPEAT
        (a retried call). Pure: changes nothing.
        """
        if not 0 <= partition < self.num_partitions or not 0 <= epoch <= self.epoch:
            return Verdict.INVALID
        # mutmut: `token < 0` is equivalent: no lease has token 0 (tokens start at 1).
        if epoch != self.epoch or token <= 0 or self.leases.get(partition) != (worker, token):
            return Verdict.REFUSE
        if self.pending.get(partition) == worker:
            return Verdict.APPLY
        if partition in self.done or partition in self.failed or outcome is Outcome.FAILED:
            return Verdict.REPEAT
        if outcome is Outcome.RELEASED and consumed <= self.progress.get(partition, 0):
            return Verdict.REPEAT
        return Verdict.APPLY

    def revoked(self, worker: str, held: Iterable[tuple[int, int, int]]) -> list[
            tuple[int, int, int]]:
        """Of the (epoch, partition, token) leases `worker` says it holds, those that are not
        its own any more: a past epoch, leased to another since, or back in todo (expired or
        handed back). Not those it finished itself (a DONE sent by a concurrent call). Pure."""
        return [(e, p, t) for e, p, t in held
                if e != self.epoch or self.leases.get(p) != (worker, t)
                or (self.pending.get(p) != worker and p not in self.done
                    and p not in self.failed)]

    def take_journal(self) -> list[list[Any]]:
        """The ops since the last call, for the state store; clears them."""
        ops, self.journal = self.journal, []
        return ops

    def replay(self, ops: Iterable[list[Any]]) -> None:
        """Re-applies journaled ops on top of a restored snapshot (not journaled again)."""
        for op in ops:
            self._apply(op, record=False)  # mutmut: record=None is equivalent (falsy)

    # -- the state contract ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """A JSON-serializable snapshot; `Ledger.from_state` restores it exactly (but for lease
        deadlines, which `refresh_deadlines` sets afresh)."""
        return {
            "version": STATE_VERSION, "num_partitions": self.num_partitions, "seed": self.seed,
            "max_failures": self.max_failures, "epoch": self.epoch, "todo": list(self.todo),
            "pending": {str(p): worker for p, worker in self.pending.items()},
            "done": {str(p): worker for p, worker in self.done.items()},
            "failed": {str(p): reason for p, reason in self.failed.items()},
            "previous_failed": {str(p): r for p, r in self.previous_failed.items()},
            "failures": {str(p): n for p, n in self.failures.items()},
            "progress": {str(p): n for p, n in self.progress.items()},
            "progress_by": {str(p): w for p, w in self.progress_by.items()},
            "next_token": self.next_token,
            "token_key": self.token_key.hex() if self.token_key is not None else None,
            "leases": {str(p): [worker, token] for p, (worker, token) in self.leases.items()},
            "holders": {str(p): sorted(w) for p, w in self.holders.items()},
            "keep": self.keep, "limits": {str(p): n for p, n in self.limits.items()},
            "dropped": self.dropped,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ledger:
        version = state.get("version")
        if version not in (1, 2, 3, STATE_VERSION):
            raise ValueError(f"ledger state version {version!r}, expected {STATE_VERSION}")
        ledger = cls(state["num_partitions"], state["seed"], state["max_failures"],
                     state["epoch"])
        ledger.todo = deque(state["todo"])
        for p, holder in state["pending"].items():
            worker = holder[0] if version == 1 else holder  # v1: [worker, deadline]
            ledger.pending[int(p)] = worker
            # mutmut: any value is equivalent (by_worker's dicts are ordered sets).
            ledger.by_worker.setdefault(worker, {})[int(p)] = None
        done = state["done"]
        ledger.done = ({int(p): "" for p in done} if version == 1
                       else {int(p): w for p, w in done.items()})
        ledger.failed = {int(p): r for p, r in state["failed"].items()}
        ledger.previous_failed = {int(p): r
                                  for p, r in state.get("previous_failed", {}).items()}
        ledger.failures = {int(p): n for p, n in state["failures"].items()}
        ledger.progress = {int(p): n for p, n in state.get("progress", {}).items()}
        ledger.progress_by = {int(p): w for p, w in state.get("progress_by", {}).items()}
        ledger.keep = state.get("keep")
        ledger.limits = {int(p): n for p, n in state.get("limits", {}).items()}
        ledger.dropped = state.get("dropped", 0)
        ledger._restore_fencing(state)
        return ledger

    def _restore_fencing(self, state: dict[str, Any]) -> None:
        """Tokens from a v3 state; a v1/v2 state had none: its pending leases get fresh ones
        (in partition order, so that every restore of the same state agrees)."""
        self.next_token = state.get("next_token", 1)
        key = state.get("token_key")
        self.token_key = bytes.fromhex(key) if key else None
        self.leases = {int(p): (worker, token)
                       for p, (worker, token) in state.get("leases", {}).items()}
        for p in sorted(self.pending):
            if p not in self.leases:
                self._fence(p, self.pending[p])
        holders = state.get("holders")
        if holders is None:  # a state older than it: the holders it still names
            self.holders = {}
            for p, (worker, _) in self.leases.items():
                self.holders.setdefault(p, set()).add(worker)
            for p, worker in (*self.done.items(), *self.progress_by.items()):
                if worker:
                    self.holders.setdefault(p, set()).add(worker)
        else:
            self.holders = {int(p): set(w) for p, w in holders.items()}

    def refresh_deadlines(self, now: float, lease_timeout: float,
                          workers: Iterable[str] | None = None) -> None:
        """Gives every outstanding lease a fresh deadline (after a master restart the clock
        that set the old deadlines may be another machine's)."""
        chosen = self.by_worker if workers is None else [w for w in workers
                                                         if w in self.by_worker]
        for worker in chosen:
            self._set_deadline(worker, now + lease_timeout)
