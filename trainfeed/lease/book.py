"""A reader's book of its leases: the pure core of the lease protocol's reader side.

What a reader holds, what its trainer began, what it handed back, how far its trainer got inside
each partition (its `progress`, a `Progress` of trainfeed.lease.progress, which the shell tells of
the trainer's records directly), which leases the master took away, and which reports wait to go.
Like the master's `Ledger` (trainfeed.master.core.ledger) it is a plain state machine: every
method that needs the time takes it as an argument; it reads no clock, starts no thread, makes no
call and knows no gRPC type. `WorkerSession` (trainfeed.lease.session) is its shell: it owns the
client, the lock and the threads, translates the master's answers into `Answer`s and the book's
`Report`s into messages. That split is what lets `tests/lease/test_lease_book.py` drive it through
every interleaving Hypothesis finds.

Rules the book keeps (each an invariant of its state machine test):
- A lease the trainer began (`claim`) is never handed back (`give_back`), and a lease handed back
  is never claimed: its records come from the reader it went to.
- A lease the master took away (`answered`/`told` with `revoked`) is never reported DONE by a
  `done()` that came after: its records are dropped, another reader delivers them. (A DONE queued
  before the revocation still goes: the master takes it if nobody leased the partition since.)
- A DONE stays "held and started" until the master confirmed it: a DONE delayed by a master
  restart must not make the lease look unstarted to a give-back, or its partition is delivered
  twice (tests/integration/test_give_back_after_done.py).
- Every queued report names a lease the master granted this book.
- A synchronous rank's cut (RELEASED, keeping its first records) is listed as held until the
  master confirmed it, as a DONE is: a call that overtakes it must not orphan the lease
  (tests/master/test_sync_quota.py).
- Only an answer to the reader's own call renews its leases (`sure_until`); what the master
  pushes on the Watch stream (`told`) never does: the fencing rules do not depend on the stream.

Not thread-safe: the shell calls it under its lock.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from trainfeed.io.prefetch import TaskRef
from trainfeed.lease.progress import PROGRESS_INTERVAL_S as PROGRESS_INTERVAL_S
from trainfeed.lease.progress import PROGRESS_MIN_RECORDS as PROGRESS_MIN_RECORDS
from trainfeed.lease.progress import Progress

# (epoch, partition, lease token): one lease. A partition given back and leased again is a new
# lease, which an old one's end must not touch.
Lease = tuple[int, int, int]
Key = tuple[int, int]  # (epoch, partition)

# How long a report may wait for the producer's next GetTasks to carry it (it asks as soon as
# enough prefetch slots free up) before the reporter sends it alone.
COALESCE_S = 0.05
# How often progress within partitions goes, and from how many records on: PROGRESS_INTERVAL_S
# and PROGRESS_MIN_RECORDS, with the progress they pace (trainfeed.lease.progress).
# Lease depth follows consumption: a reader holds leases for about this many seconds of what its
# trainer consumes (measured over the last LEASE_RATE_WINDOW partitions), at least MIN_LEASES,
# so that it never sits on work another reader could start now.
LEASE_HORIZON_S = 2.0
LEASE_RATE_WINDOW = 16
MIN_LEASES = 2
# A report's `reason` is cut to this many characters (the master's limit on a report).
MAX_REASON_CHARS = 2000


class Outcome(enum.Enum):
    """What a report says of its lease (TaskReport.Outcome on the wire)."""

    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"  # handed back: given back, or a synchronous rank's cut (`consumed`)
    PROGRESS = "progress"  # the trainer had the first `consumed` records


@dataclass(frozen=True)
class Report:
    """One report for the master, as the shell translates it into a TaskReport."""

    epoch: int
    partition: int
    outcome: Outcome
    lease: int
    consumed: int = 0
    reason: str = ""

    @property
    def key(self) -> Key:
        return (self.epoch, self.partition)

    @property
    def names(self) -> Lease:
        return (self.epoch, self.partition, self.lease)


@dataclass(frozen=True)
class Answer:
    """What the master said about this reader's leases, from an answer to one of its calls
    (GetTasks, Report) or an event of its Watch stream, translated by the shell."""

    revoked: tuple[Lease, ...] = ()
    give_back: tuple[Lease, ...] = ()
    revoked_why: str = ""
    group_broken: str = ""
    superseded: str = ""
    # Watch only: an epoch the master announced complete (None: no such news).
    epoch_complete: int | None = None


@dataclass
class Applied:
    """What an answer changed: leases taken away (`gone`), handed back (`given`), and whether
    this answer broke the group or superseded the reader (the shell raises and logs)."""

    gone: list[Key] = dataclasses.field(default_factory=list)
    given: int = 0
    broke: bool = False
    superseded: bool = False


class LeaseBook:
    """The leases one reader session holds, and what it owes the master about them.

    Args:
        lease_timeout_s: the master's lease timeout (OpenJobResponse.lease_timeout_s).
        now: the time the session opened (monotonic seconds; the leases are surely alive until
            a lease timeout after it).
    """

    def __init__(self, lease_timeout_s: float, now: float):
        self.lease_timeout_s = lease_timeout_s
        # (epoch, partition) leased to this reader whose DONE/FAILED the master has not yet
        # confirmed, with the lease's token: sent with each call so that the master can drop
        # leases we never saw (and tell which of ours it took away).
        self.held: dict[Key, int] = {}
        # Leases whose records the trainer began to get: never given back.
        self.started: set[Lease] = set()
        # Leases this reader handed back on its own (a synchronous rank's partition cut at its
        # quota): their kept records are still delivered, but no DONE is sent.
        self.released: set[Lease] = set()
        # Of those, the ones whose RELEASED the master has not confirmed: still listed as held
        # with every call (`held_now`), as a DONE not yet confirmed is. A call that overtakes the
        # RELEASED (the reporter drained it, then the next pass's GetTasks arrived first) must
        # not look as if it forgot the lease: the master would hand the whole partition back
        # and refuse the RELEASED's count, and the records this rank kept went to another rank
        # while the rest stayed in todo for nobody (the epoch never ended).
        self.releasing: dict[Key, int] = {}
        # Leases the master took away, and those handed back (given back, or cut to nothing):
        # their undelivered records are dropped.
        self.revoked: set[Lease] = set()
        self.given: set[Lease] = set()
        # Leases whose every record the trainer had, their DONE queued or in flight: taken away
        # meanwhile (their epoch ended with that very DONE, on another call) they lose nothing.
        self.finishing: set[Lease] = set()
        self.reports: list[Report] = []
        self.oldest_report = 0.0  # when the oldest unsent report was queued
        # Records the trainer had per held partition, and what of that the master was sent.
        # It reads `held` live: `held` is never replaced, only changed.
        self.progress = Progress(self.held)
        self.outstanding = 0  # partitions handed to the consumer and not yet acknowledged
        # When the trainer finished each of the last partitions: the rate that sizes the depth.
        self.finished_at: deque[float] = deque(maxlen=LEASE_RATE_WINDOW)
        # A synchronous pass: records still to lease this pass for the rank's quota (None: not
        # synchronous), and the records each held lease of it keeps.
        self.need: int | None = None
        self.keeps: dict[Key, int] = {}
        # Until when the master surely still holds our leases: the start of the last call that
        # renewed them plus a lease timeout. Past it (this process was frozen, or the master
        # unreachable) records are handed over only after a heartbeat confirmed the lease.
        self.sure_until = now + lease_timeout_s
        self.last_contact = now  # when a call of ours last reached the master
        self.broken = ""  # why the synchronous group broke, once the master said so
        self.superseded = ""  # who took over this reader's work, once the master said so
        self.completed_epoch = -1  # the last epoch the Watch stream announced complete
        # mutmut: any negative start is equivalent (its reader asks `0 <= epoch <= completed`).
        # When the master asked back a lease the trainer had begun (it learns which leases are
        # begun only from our calls): the next Report goes at once and says so, instead of the
        # master asking again until our next heartbeat (issue 28: the epoch's tail). None: no
        # such ask unanswered.
        self.begun_asked_at: float | None = None

    # -- leases -------------------------------------------------------------------------------
    def lost(self, lease: Lease) -> bool:
        """Whether `lease`'s undelivered records must be dropped (revoked or handed back)."""
        return lease in self.revoked or lease in self.given

    def holds(self, lease: Lease) -> bool:
        return self.held.get(lease[:2]) == lease[2]

    def held_now(self) -> tuple[list[Lease], set[Lease]]:
        """Every lease held, sorted, and those of them the trainer has begun (the master asks
        back only the others)."""
        held = sorted({(e, p, t) for (e, p), t in (*self.held.items(), *self.releasing.items())})
        return held, {lease for lease in held if lease in self.started}

    def unstarted_held(self) -> bool:
        """Whether this reader holds a lease its trainer has not begun."""
        return any((*key, token) not in self.started for key, token in self.held.items())

    def granted(self, leases: Iterable[Lease]) -> None:
        """The master leased these to this reader."""
        self.held.update(((e, p), t) for e, p, t in leases)

    def begin_pass(self, quota: int | None) -> None:
        """A pass starts: nothing handed over yet; `quota` is a synchronous rank's records this
        pass (None for an ordinary pass)."""
        self.outstanding = 0
        self.need = quota
        self.keeps.clear()

    def handed_over(self) -> None:
        """A loaded partition went to the consumer."""
        self.outstanding += 1

    def keep(self, task: TaskRef, now: float) -> TaskRef:
        """A synchronous pass keeps of a new task only what its quota still needs: the rest goes
        back at once (a RELEASED report at the count it keeps), so that another rank can lease
        it without waiting for this one's trainer. Returns the task as it is delivered."""
        self.progress.start((task.epoch, task.partition), task.skip)
        if self.need is None:
            return task
        key, lease = (task.epoch, task.partition), (task.epoch, task.partition, task.lease)
        kept = min(task.delivers, max(0, self.need))
        self.need -= kept
        self.keeps[key] = kept
        if kept == task.delivers:
            return task
        cut = dataclasses.replace(task, stop=task.skip + kept)
        self.held.pop(key, None)
        self.released.add(lease)
        self.releasing[key] = task.lease
        if not kept:  # nothing of it for us: it is not delivered at all
            self.given.add(lease)
        self._queue(Report(task.epoch, task.partition, Outcome.RELEASED, task.lease,
                           consumed=cut.stop), now)
        return cut

    def _unkeep(self, key: Key, token: int) -> None:
        """A held lease's records will not be delivered here (given back, failed, revoked): a
        synchronous pass must lease them elsewhere."""
        kept = self.keeps.pop(key, 0)
        if self.need is not None:
            self.need += kept
        self.started.discard((*key, token))

    # -- the consumer's side ------------------------------------------------------------------
    def claim(self, lease: Lease) -> bool:
        """The trainer is about to get records of `lease`: from now on it is never given back.
        Returns True instead if the lease was lost: its records must then be dropped."""
        if self.lost(lease):
            return True
        self.started.add(lease)
        return False

    def unsure(self, lease: Lease, now: float) -> bool:
        """Whether `lease` is held but past the time it is sure to live: a heartbeat must
        confirm it before its records are handed over."""
        return now > self.sure_until and lease[:2] in self.held

    def done(self, lease: Lease, now: float) -> bool:
        """The trainer was handed every record of `lease`'s partition (or the consumer dropped a
        lost one). Returns whether a DONE report was queued: not for a lost or released lease."""
        key = lease[:2]
        lost, released = self.lost(lease), lease in self.released
        self.released.discard(lease)
        if lost or released:  # no DONE goes; the lease already left `held`
            self.started.discard(lease)
        # Else the lease stays started until the master confirms the DONE (`_confirmed`).
        if not lost:
            self.progress.finish(key)
            self.finished_at.append(now)
        self.outstanding -= 1
        if lost or released:
            return False
        self._queue(Report(*key, Outcome.DONE, lease[2]), now)
        self.finishing.add(lease)
        return True

    def failed(self, lease: Lease, reason: str, now: float) -> None:
        """The reader could not read `lease`'s partition."""
        self._unkeep(lease[:2], lease[2])
        self._queue(Report(*lease[:2], Outcome.FAILED, lease[2],
                           reason=reason[:MAX_REASON_CHARS]), now)

    # -- reports ------------------------------------------------------------------------------
    def _queue(self, report: Report, now: float) -> None:
        if not self.reports:
            self.oldest_report = now
        self.reports.append(report)

    def drain(self) -> list[Report]:
        """Takes every queued report, plus the progress that changed since it was last sent."""
        reports, self.reports = self.reports, []
        reports.extend(self.drain_progress())
        return reports

    def drain_progress(self) -> list[Report]:
        """Takes the progress that changed since it was last sent (not the queued reports: a
        Session message carries progress only)."""
        return [Report(*key, Outcome.PROGRESS, self.held.get(key, 0), consumed=consumed)
                for key, consumed in self.progress.take()]

    def needs_answer(self, now: float, heartbeat_s: float) -> bool:
        """Whether the next message must be answered: a heartbeat is due (only an answer renews
        `sure_until`), or the master asked back a lease our trainer began."""
        return self.begun_asked_at is not None or now - self.last_contact >= heartbeat_s

    def unsent(self, reports: list[Report]) -> None:
        """A call carrying `reports` failed: they go first in the next one (progress too, as
        plain reports: the master takes the largest count)."""
        self.reports[:0] = reports

    def owes(self) -> bool:
        """Whether reports or progress wait to be sent."""
        return bool(self.reports or self.progress.dirty)

    # -- answers ------------------------------------------------------------------------------
    def answered(self, sent: list[Report], answer: Answer, called_at: float, now: float,
                 granted: Iterable[Lease] = ()) -> Applied:
        """The answer to a call of ours that started at `called_at` and carried `sent`: our
        other leases are renewed until a lease timeout after `called_at`; the master took
        `sent`; `granted` (GetTasks) are ours now, before the answer's give-back asks (which
        may name them)."""
        applied = self._news(answer)
        self.sure_until = max(self.sure_until, called_at + self.lease_timeout_s)
        if self.begun_asked_at is not None and called_at >= self.begun_asked_at:
            self.begun_asked_at = None  # that call listed our begun leases
        applied.gone = self._revoke(answer.revoked)
        self._confirmed(sent)
        self.granted(granted)
        applied.given = self._give_back(answer.give_back, now)
        self.last_contact = max(self.last_contact, now)
        return applied

    def told(self, answer: Answer, now: float) -> Applied:
        """An event of the Watch stream: applied as the same fields of an answer, but it renews
        nothing and confirms nothing (only a call of ours proves the master heard us)."""
        applied = self._news(answer)
        applied.gone = self._revoke(answer.revoked)
        applied.given = self._give_back(answer.give_back, now)
        if answer.epoch_complete is not None:
            self.completed_epoch = max(self.completed_epoch, answer.epoch_complete)
        return applied

    def _news(self, answer: Answer) -> Applied:
        applied = Applied()
        if answer.group_broken and not self.broken:
            self.broken, applied.broke = answer.group_broken, True
        if answer.superseded and not self.superseded:
            self.superseded, applied.superseded = answer.superseded, True
        return applied

    def _revoke(self, revoked: Iterable[Lease]) -> list[Key]:
        """`revoked` leases are not ours any more: forget them, drop their records."""
        gone: list[Key] = []
        for epoch, partition, token in revoked:
            key = (epoch, partition)
            if self.held.get(key) != token:
                continue  # confirmed meanwhile, or leased to us again since
            del self.held[key]
            self.progress.drop(key)
            # (A DONE already queued still goes: the master takes it if nobody leased the
            # partition since, and saves its re-reading; else it refuses it.)
            self.revoked.add((*key, token))
            if (*key, token) in self.finishing:
                # Every record was delivered: nothing is dropped, and a synchronous pass's
                # quota stays spent (giving its records back to `need` made the rank lease
                # past its equal share: issue 36's model test).
                self.finishing.discard((*key, token))
                self.keeps.pop(key, None)
                self.started.discard((*key, token))
            else:  # its records are dropped (what `gone` tells the reader's log)
                self._unkeep(key, token)
                gone.append(key)
        return gone

    def _confirmed(self, reports: Iterable[Report]) -> None:
        """The master took these reports: their tasks are no longer ours (a RELEASED one left
        `held` when it was queued, and is no longer listed now)."""
        for r in reports:
            if r.outcome is Outcome.RELEASED and self.releasing.get(r.key) == r.lease:
                del self.releasing[r.key]
            if r.outcome is not Outcome.PROGRESS and self.held.get(r.key) == r.lease:
                del self.held[r.key]
                self.started.discard(r.names)
            self.finishing.discard(r.names)

    def _give_back(self, asked: Iterable[Lease], now: float) -> int:
        """Work stealing: hands back, with RELEASED reports, the leases the master asked for
        whose records the trainer has not begun to get; keeps the others, also those whose DONE
        the master has not confirmed yet. A handed-back partition already loaded is dropped
        when the consumer meets it (as a revoked one). Returns how many went back."""
        if self.need is not None:
            # A synchronous rank leases no more than its quota: nobody needs its leases (and a
            # partition given back would leave it short).
            return 0
        given = 0
        for epoch, partition, token in asked:
            key, lease = (epoch, partition), (epoch, partition, token)
            if self.held.get(key) != token:
                continue
            if lease in self.started:  # the master does not know yet: tell it at once
                if self.begun_asked_at is None:
                    self.begun_asked_at = now
                continue
            del self.held[key]
            # mutmut: any token is equivalent here: the lease is not begun (begun ones were
            # skipped above), so `started` has nothing of it to discard.
            self._unkeep(key, token)
            self.progress.drop(key)
            self.given.add(lease)
            self._queue(Report(epoch, partition, Outcome.RELEASED, token), now)
            given += 1
        return given

    def left(self) -> None:
        """The session left the job (LeaveJob): the master took every lease back."""
        self.held.clear()
        self.releasing.clear()
        self.started.clear()
        self.finishing.clear()
        self.progress.clear()

    # -- timing -------------------------------------------------------------------------------
    def lease_depth(self, window: int) -> int:
        """How many leases to hold: what the trainer consumes in LEASE_HORIZON_S (its rate over
        the last partitions), within [MIN_LEASES, window]; the window until a rate is known."""
        times = self.finished_at
        if len(times) < 2 or times[-1] <= times[0]:
            return max(MIN_LEASES, min(window, MIN_LEASES * 2))
        rate = (len(times) - 1) / (times[-1] - times[0])
        return max(MIN_LEASES, min(window, math.ceil(rate * LEASE_HORIZON_S)))

    def send_in(self, now: float, fetching: bool, heartbeat_s: float,
                poll_s: float | None = None) -> float:
        """Seconds until the reporter must send a Report on its own (≤ 0: now).

        Reports go when the producer will not carry them soon (it is not `fetching`, or the
        oldest waited COALESCE_S); progress every PROGRESS_INTERVAL_S once some partition has
        PROGRESS_MIN_RECORDS records the master was not sent; a heartbeat when no call
        reached the master for `heartbeat_s` (a third of the lease timeout: any call renews).
        `poll_s` (only when the Watch stream is down): a reader holding a lease its trainer has
        not begun calls that often, so that a give-back asked in an answer reaches it.
        """
        interval = heartbeat_s
        # mutmut: `<=` is equivalent (at poll_s == heartbeat_s the interval is the same).
        polling = poll_s is not None and poll_s < heartbeat_s and self.unstarted_held()
        if polling:
            assert poll_s is not None
            interval = poll_s
        # mutmut: `>` is equivalent: at exactly COALESCE_S, `report_in` below is 0 (to a
        # rounding: a wait of 1e-17 s), which the reporter takes as now.
        if self.reports and (not fetching or now - self.oldest_report >= COALESCE_S):
            return 0.0
        if self.begun_asked_at is not None:
            return 0.0
        progress_in = (self.progress.oldest + PROGRESS_INTERVAL_S - now if self.progress.due()
                       else interval)
        heartbeat_in = interval - (now - self.last_contact)
        report_in = self.oldest_report + COALESCE_S - now if self.reports else heartbeat_in
        return min(heartbeat_in, report_in, progress_in)
