"""The worker's side of the task protocol: lease tasks, read them ahead, report them, heartbeat.

A `WorkerSession` is one reader's membership in a job. Each pass (epoch) runs a prefetching
producer that leases tasks with GetTasks, several per call, carrying the finished-task reports
along: in the steady state a partition costs a fraction of one round trip. A reporter thread sends
reports on its own only when the producer will not call soon (it is long-polling at the epoch's
tail, or no pass runs), so that the epoch can end, and heartbeats at a third of the lease timeout
when nothing else reached the master, which keeps the leases of slow partitions alive.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import pyarrow as pa

from trainfeed.errors import (
    CorruptDatasetError,
    MasterUnavailableError,
    PartitionReadError,
    SupersededError,
    SyncGroupBrokenError,
    SyncShortfallError,
)
from trainfeed.io.partition_reader import (
    PartitionReader,
    ReadStats,
    payload_buffer_pool,
    read_task,
)
from trainfeed.io.prefetch import Credits, LoadedPartition, PrefetchStream, TaskRef
from trainfeed.lease import shutdown
from trainfeed.lease.client import MasterClient, wall_clock
from trainfeed.storage import Storage
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

JOIN_CURRENT_EPOCH = -1
# How long one GetTasks may wait server-side while others hold the epoch's last tasks.
LONG_POLL_MS = 2000
# How long a report may wait for the producer's next GetTasks to carry it (it asks as soon as
# enough prefetch slots free up) before the reporter sends it alone.
COALESCE_S = 0.05
# Progress within partitions reaches the master at least this often (riding on GetTasks when it
# can): after a crash a re-leased partition repeats at most the records consumed in this long,
# plus the batch that was in the trainer's hands.
PROGRESS_INTERVAL_S = 1.0
# A reader holding leases it has not started calls the master at least this often, so that a
# give_back (work stealing, issue 13) reaches it within about this long.
STEAL_POLL_S = 0.25
# Lease depth follows consumption: a reader holds leases for about this many seconds of what its
# trainer consumes (measured over the last LEASE_RATE_WINDOW partitions), at least MIN_LEASES,
# so that it never sits on work another reader could start now.
LEASE_HORIZON_S = 2.0
LEASE_RATE_WINDOW = 16
MIN_LEASES = 2
# A pass waiting this long for partitions others hold logs what it waits for and until when
# (again when that changes, or every WAIT_LOG_EVERY_S): no wait over 5 s is silent (issue 26).
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 30.0

# Reads a task's partition as the trainer will get it: its records in delivery order, minus the
# `task.skip` first ones (trainfeed.reader.batcher.partition_loader builds the pipeline's).
Load = Callable[[PartitionReader, TaskRef], pa.Table]


def plain_load(reader: PartitionReader, task: TaskRef) -> pa.Table:
    """Records in storage order, minus the leading `task.skip`."""
    return read_task(reader, task, None)


class WorkerSession:
    """A reader's membership in a job: its worker id, the dataset location, and the reporter.

    Thread-safe: `report_*` may be called from the consumer while the producer polls. `close()`
    flushes reports, hands back any leases and stops the reporter; it is idempotent.
    """

    def __init__(self, client: MasterClient, job: str, dataset: str, seed: int,
                 distribution_rules: str = "", resume: pb.ResumePosition | None = None,
                 sync: pb.SyncGroup | None = None, order: pb.DeliveryOrder | None = None):
        self.client = client
        opened = client.open_job(job, dataset, seed, distribution_rules, resume, sync, order)
        # A synchronous rank's group, sent with every call (a restarted master learns it again),
        # and why the group broke once the master said so (raised at the trainer's next batch).
        self.sync = sync
        self.broken: SyncGroupBrokenError | None = None
        self.resumed_partitions = opened.resumed_partitions
        self.job = opened.job
        self.worker = opened.worker_id
        # What a checkpoint of this session carries so that a restored reader may rewind its
        # work (never its session secret, which the client keeps).
        self.resume_credential = opened.resume_credential
        if opened.resume_cut:
            logger.warning("the master resumed %d partition(s) of the checkpoint where the "
                           "master's records of its progress left them, not where the checkpoint "
                           "says (its progress had not reached the master): their records after "
                           "that are delivered again", opened.resume_cut)
        self.dataset = Storage(opened.dataset_url, json.loads(opened.storage_options_json or "{}"))
        self.field_names = tuple(f.name for f in opened.fields)
        self.binary_fields = tuple(f.name for f in opened.fields if f.type == "binary")
        self.read_stats = ReadStats()
        # What this reader measured since its last summary (trainfeed.lease.reader_stats),
        # sent with every GetTasks and Report; the reader sets it (issue 29).
        self.stats: Callable[[], pb.ReaderStats | None] = lambda: None
        self._payload_buffers = payload_buffer_pool()  # shared by the epochs' readers
        # Per finished epoch: the partitions the master gave up on (None: it no longer knew).
        self.epoch_failures: dict[int, list[pb.FailedPartition] | None] = {}
        self.num_records = opened.num_records
        self.num_bytes = opened.num_bytes
        self.num_partitions = opened.num_partitions
        self.lease_timeout_s = opened.lease_timeout_s
        self._reports: list[pb.TaskReport] = []
        # Guards _reports, _fetching and _stopping; notified whenever one of them changes.
        self._cond = threading.Condition()
        self._fetching = False  # a producer runs and will call GetTasks soon (not long-polling)
        self._stopping = False
        self._outstanding = 0  # partitions handed to the consumer and not yet acknowledged
        self._oldest_report = 0.0  # when the oldest unsent report was queued (monotonic)
        # Records handed to the trainer per (epoch, partition) held, and which changed since sent.
        self._progress: dict[tuple[int, int], int] = {}
        self._progress_dirty: set[tuple[int, int]] = set()
        self._oldest_progress = 0.0
        # (epoch, partition) leased to this worker whose DONE/FAILED the master has not yet
        # confirmed, with the lease's fencing token: sent with each GetTasks so that the master
        # can drop leases we never saw (and tell which of ours it took away).
        self._held: dict[tuple[int, int], int] = {}
        self._last_contact = time.monotonic()
        # -- fencing (issue 14) --
        # (epoch, partition, lease) the master took away: their undelivered records are dropped.
        self._lost: set[tuple[int, int, int]] = set()
        # Until when (monotonic) the master surely still holds our leases: the start of the last
        # call that renewed them plus a lease timeout. Past it (this process was frozen, or the
        # master unreachable) records are handed over only after a heartbeat confirmed the lease.
        self._leases_sure_until = time.monotonic() + opened.lease_timeout_s
        # -- balance (issue 13) --
        # (epoch, partition) of held leases whose records the trainer began to get: those are
        # never given back. (epoch, partition, lease) this reader handed back on its own (a
        # synchronous rank's partition cut at its quota): their kept records are still
        # delivered, but no DONE is sent.
        # Keyed by (epoch, partition, lease): a partition given back and leased again is a new
        # lease, which an old one's end must not touch.
        self._started: set[tuple[int, int, int]] = set()
        self._released: set[tuple[int, int, int]] = set()
        # When the trainer finished each of the last partitions (monotonic): the consumption rate
        # that sizes the lease depth.
        self._finished_at: deque[float] = deque(maxlen=LEASE_RATE_WINDOW)
        # A synchronous pass: records still to lease this pass for the rank's quota, and the
        # records each held lease of it keeps.
        self._need: int | None = None
        self._keeps: dict[tuple[int, int], int] = {}
        self.error: BaseException | None = None
        self._reporter = threading.Thread(target=self._report_loop, daemon=True,
                                          name=f"trainfeed-reporter-{self.worker}")
        self._reporter.start()
        self._closed = False
        shutdown.register(self)

    # -- reports ------------------------------------------------------------------------------
    def note_progress(self, task: TaskRef, handed: int) -> None:
        """The trainer consumed the first `handed` records of this holder's share of `task`."""
        if self.broken is not None:
            raise self.broken
        key = (task.epoch, task.partition)
        consumed = task.skip + handed
        with self._cond:
            if consumed <= self._progress.get(key, 0) or self._held.get(key) != task.lease:
                return  # not news, or the lease is not ours any more
            self._progress[key] = consumed
            if not self._progress_dirty:
                self._oldest_progress = time.monotonic()
                self._cond.notify_all()  # the reporter starts the PROGRESS_INTERVAL_S clock
            self._progress_dirty.add(key)

    def report_done(self, task: TaskRef) -> None:
        with self._cond:
            key = (task.epoch, task.partition)
            lost = (*key, task.lease) in self._lost
            released = (*key, task.lease) in self._released
            self._released.discard((*key, task.lease))
            if lost or released:  # no DONE goes; the lease already left `_held`
                self._started.discard((*key, task.lease))
            # Else the lease stays started until the master confirms the DONE (`_confirmed`):
            # until then it is still held, and must never look unstarted to `_give_back` (a
            # DONE delayed by a master restart, with the partition handed back meanwhile,
            # delivered it twice).
            if not lost:
                self._progress.pop(key, None)
                self._progress_dirty.discard(key)
                self._finished_at.append(time.monotonic())
            self._outstanding -= 1
            # The producer may be waiting for this (epoch tail, or a full lease depth).
            self._cond.notify_all()
        if not lost and not released:  # a revoked lease's partition was dropped, not done
            self._queue(pb.TaskReport(epoch=task.epoch, partition=task.partition,
                                      outcome=pb.TaskReport.DONE, lease=task.lease))

    def report_failed(self, task: TaskRef, reason: str) -> None:
        with self._cond:
            self._unkeep((task.epoch, task.partition), task.lease)
        self._queue(pb.TaskReport(epoch=task.epoch, partition=task.partition,
                                  outcome=pb.TaskReport.FAILED, reason=reason[:2000],
                                  lease=task.lease))

    def _queue(self, report: pb.TaskReport) -> None:
        with self._cond:
            first = not self._reports
            if first:
                self._oldest_report = time.monotonic()
            self._reports.append(report)
            # While the producer fetches it carries reports itself: the reporter is woken only to
            # start the COALESCE_S clock on the first pending report, not for each one (that
            # would churn threads and the GIL on the hot path).
            if first or not self._fetching:
                self._cond.notify_all()

    def drain_reports(self) -> list[pb.TaskReport]:
        """Takes every queued report, plus the progress that changed since it was last sent."""
        with self._cond:
            reports, self._reports = self._reports, []
            reports.extend(pb.TaskReport(epoch=epoch, partition=partition,
                                         outcome=pb.TaskReport.PROGRESS,
                                         consumed=self._progress[(epoch, partition)],
                                         lease=self._held.get((epoch, partition), 0))
                           for epoch, partition in sorted(self._progress_dirty))
            self._progress_dirty.clear()
            self._cond.notify_all()
        return reports

    def flush(self, epoch: int = -1, positions: dict[int, int] | None = None) -> None:
        """Sends every queued report and the progress not yet sent, now, and waits for the
        answer: a checkpoint taken after it resumes exactly (the master lets a resume claim
        only what reports showed consumed). `positions` (partition -> records of it the trainer
        had, of `epoch`) may be ahead of the progress noted so far (the batcher notes it every
        few records): it is sent too, for the leases still held. A master that cannot be
        reached only costs exactness: logged, not raised (a resume then repeats the unsent
        part)."""
        with self._cond:
            for partition, consumed in (positions or {}).items():
                key = (epoch, partition)
                if key in self._held and consumed > self._progress.get(key, 0):
                    self._progress[key] = consumed
                    self._progress_dirty.add(key)
            if not self._reports and not self._progress_dirty:
                return
        try:
            self._send()
        except Exception as e:
            logger.warning("could not send this reader's progress to the master before a "
                           "checkpoint (%s): a reader restored from it repeats what was not "
                           "sent", e)

    def _set_fetching(self, fetching: bool) -> None:
        with self._cond:
            self._fetching = fetching
            self._cond.notify_all()

    def _handed_over(self) -> None:
        with self._cond:
            self._outstanding += 1

    def _wait_acknowledged(self, timeout_s: float, abandoned: Callable[[], bool]) -> None:
        """Waits until the consumer acknowledged every partition handed to it, the pass was
        `abandoned()` (checked every 50 ms), or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._outstanding > 0 and not self._stopping and not abandoned():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.05))

    def _contacted(self) -> None:
        self._last_contact = time.monotonic()

    def _send(self) -> None:
        reports = self.drain_reports()
        started = time.monotonic()
        held, begun = self._held_now()
        try:
            response = self.client.report(self.job, self.worker, reports, held, begun,
                                          sync=self.sync, stats=self.stats())
        except BaseException:
            with self._cond:  # keep them for the next try
                self._reports[:0] = reports
            raise
        self._group_broken(response.group_broken)
        self._superseded(response.superseded)
        self._revoke(response.revoked, started, response.revoked_why)
        self._confirmed(reports)
        self._give_back(response.give_back)
        self._contacted()

    # -- fencing: leases the master took away (issue 14) ----------------------------------------
    def _group_broken(self, why: str) -> None:
        """The master said this rank's synchronous group broke (`why` names the missing
        ranks; "" if not): from now on the pass and the trainer's next batch raise."""
        if not why or self.broken is not None:
            return
        self.broken = SyncGroupBrokenError(f"job {self.job!r}: {why}")
        self.error = self.error or self.broken
        logger.error("%s", self.broken)
        with self._cond:
            self._cond.notify_all()

    def _superseded(self, why: str) -> None:
        """The master said a reader restored from this one's checkpoint took over (`why`; ""
        if not): this reader's passes raise from now on."""
        if why and not isinstance(self.error, SupersededError):
            self.error = SupersededError(f"job {self.job!r}: {why}; this reader gets no more "
                                         f"tasks (close it, and read on with the restored one)")

    def _revoke(self, revoked: Sequence[pb.HeldTask], started: float, why: str = "") -> None:
        """A call that started at `started` (monotonic) succeeded: our other leases are renewed
        until a lease timeout after it; `revoked` ones are not ours any more (forget them).
        `why`: the master's reason, when it is not an expiry."""
        gone: list[tuple[int, int]] = []
        with self._cond:
            self._leases_sure_until = max(self._leases_sure_until,
                                          started + self.lease_timeout_s)
            for t in revoked:
                key = (t.epoch, t.partition)
                if self._held.get(key) != t.lease:
                    continue  # confirmed meanwhile, or leased to us again since
                del self._held[key]
                self._unkeep(key, t.lease)
                self._progress.pop(key, None)
                self._progress_dirty.discard(key)
                # (A DONE already queued still goes: the master takes it if nobody leased the
                # partition since, and saves its re-reading; else it refuses it.)
                self._lost.add((*key, t.lease))
                gone.append(key)
        if gone:
            logger.warning("the master took away %d lease(s) of this reader (%s); their "
                           "undelivered records are dropped: %s", len(gone),
                           why or "it was not heard from for longer than the lease timeout: "
                           "frozen, or cut off from the master?", gone[:10])

    def _unkeep(self, key: tuple[int, int], lease: int) -> None:
        """A held lease's records will not be delivered here (given back, failed, revoked): a
        synchronous pass must lease them elsewhere. Under `_cond`."""
        kept = self._keeps.pop(key, 0)
        if self._need is not None:
            self._need += kept
        self._started.discard((*key, lease))

    def _give_back(self, asked: Sequence[pb.HeldTask]) -> int:
        """Work stealing: hands back, with RELEASED reports, the leases the master asked for
        whose records the trainer has not begun to get (`claim`); keeps the others, also those
        whose DONE the master has not confirmed yet. A handed-back partition already loaded is
        dropped when the consumer meets it (as a revoked one). Returns how many went back."""
        given: list[pb.TaskReport] = []
        with self._cond:
            if self._need is not None:
                # A synchronous rank leases no more than its quota: nobody needs its leases
                # (and a partition given back would leave it short).
                return 0
            for t in asked:
                key = (t.epoch, t.partition)
                if self._held.get(key) != t.lease or (*key, t.lease) in self._started:
                    continue
                del self._held[key]
                self._unkeep(key, t.lease)
                self._lost.add((*key, t.lease))
                given.append(pb.TaskReport(epoch=t.epoch, partition=t.partition,
                                           outcome=pb.TaskReport.RELEASED, lease=t.lease))
        for report in given:
            self._queue(report)
        if given:
            logger.info("handed %d unstarted lease(s) back for an idle reader", len(given))
        return len(given)

    def claim(self, task: TaskRef) -> bool:
        """The trainer is about to get records of `task`: from now on its lease is never given
        back. Returns True instead if the lease was lost (revoked, or given back before): its
        records must then be dropped, also those already in the batch buffer (see
        `lease_lost`)."""
        if self.lease_lost(task):
            return True
        with self._cond:
            key = (task.epoch, task.partition, task.lease)
            if key in self._lost:  # given back between the two checks
                return True
            self._started.add(key)
        return False

    def lease_lost(self, task: TaskRef) -> bool:
        """Whether the master took `task`'s lease away, so that its records not yet handed to
        the trainer must be dropped (another reader delivers them). Past the time the lease is
        sure to live (this process was frozen, or the master unreachable), first confirms with
        a heartbeat: blocks until the master answers."""
        if self.broken is not None:
            raise self.broken
        key = (task.epoch, task.partition, task.lease)
        if key in self._lost:
            return True
        if time.monotonic() > self._leases_sure_until and (key[:2]) in self._held:
            self._send()
        return key in self._lost

    def _confirmed(self, reports: list[pb.TaskReport]) -> None:
        """The master took these reports: their tasks are no longer ours (a RELEASED one left
        `_held` when it was queued)."""
        with self._cond:
            for r in reports:
                if (r.outcome != pb.TaskReport.PROGRESS
                        and self._held.get((r.epoch, r.partition)) == r.lease):
                    del self._held[(r.epoch, r.partition)]
                    self._started.discard((r.epoch, r.partition, r.lease))

    def _held_now(self) -> tuple[list[tuple[int, int, int]], set[tuple[int, int, int]]]:
        """Every (epoch, partition, lease) held, and those of them the trainer has begun (the
        master asks back only the others)."""
        with self._cond:
            held = sorted((e, p, t) for (e, p), t in self._held.items())
            return held, {key for key in held if key in self._started}

    def _unstarted_held(self) -> bool:
        """Whether this reader holds a lease its trainer has not begun. Under `_cond`."""
        return any((*key, lease) not in self._started for key, lease in self._held.items())

    def _report_loop(self) -> None:
        heartbeat = max(0.05, self.lease_timeout_s / 3)
        while True:
            with self._cond:
                # Sleep until reports need sending alone (the producer long-polls or no pass
                # runs, or the oldest one waited COALESCE_S for the producer) or a heartbeat is
                # due; every notify re-computes how long that is.
                while not self._stopping:
                    now = time.monotonic()
                    interval = (min(heartbeat, STEAL_POLL_S) if self._unstarted_held()
                                else heartbeat)
                    if self._reports and (not self._fetching
                                          or now - self._oldest_report >= COALESCE_S):
                        break
                    progress_in = (self._oldest_progress + PROGRESS_INTERVAL_S - now
                                   if self._progress_dirty else interval)
                    if interval < heartbeat:  # re-check soon: a lease may get started meanwhile
                        progress_in = min(progress_in, interval)
                    heartbeat_in = interval - (now - self._last_contact)
                    if heartbeat_in <= 0 or progress_in <= 0:
                        break
                    report_in = (self._oldest_report + COALESCE_S - now if self._reports
                                 else heartbeat_in)
                    self._cond.wait(max(0.001, min(heartbeat_in, report_in, progress_in)))
                if self._stopping:
                    return
            try:
                self._send()
            except MasterUnavailableError as e:
                self.error = e
                logger.error("%s", e)
                return
            except Exception:
                logger.exception("report to master failed; retrying")
            if self.broken is not None:
                return  # the group is over: nothing to renew

    # -- passes -------------------------------------------------------------------------------
    def open_pass(self, epoch: int, depth: int, on_epoch: Callable[[int], None],
                  load: Load = plain_load, quota: int | None = None) -> PrefetchStream:
        """Starts reading one epoch (or JOIN_CURRENT_EPOCH). `on_epoch` learns its number;
        `load` reads each task (see Load). `quota`: a synchronous rank's records this pass
        (exactly; see trainfeed.reader.world), None for an ordinary pass."""
        return PrefetchStream(lambda out, credits: self._produce(epoch, out, credits, on_epoch,
                                                                load, quota),
                              depth, name=f"trainfeed-fetch-{self.worker}")

    def _lease_depth(self, window: int) -> int:
        """How many leases to hold: what the trainer consumes in LEASE_HORIZON_S (its rate over
        the last partitions), within [MIN_LEASES, window]; the window until a rate is known."""
        with self._cond:
            times = list(self._finished_at)
        if len(times) < 2 or times[-1] <= times[0]:
            return max(MIN_LEASES, min(window, MIN_LEASES * 2))
        rate = (len(times) - 1) / (times[-1] - times[0])
        return max(MIN_LEASES, min(window, math.ceil(rate * LEASE_HORIZON_S)))

    def _keep(self, task: TaskRef) -> TaskRef:
        """A synchronous pass keeps of a new task only what its quota still needs: the rest goes
        back to the master at once (RELEASED at the count it keeps), so that another rank can
        lease it without waiting for this one's trainer."""
        key = (task.epoch, task.partition)
        with self._cond:
            if self._need is None:
                return task
            kept = min(task.delivers, max(0, self._need))
            self._need -= kept
            self._keeps[key] = kept
            if kept == task.delivers:
                return task
            cut = dataclasses.replace(task, stop=task.skip + kept)
            del self._held[key]
            self._released.add((*key, task.lease))
            if not kept:  # (nothing of it for us: it is not delivered at all)
                self._lost.add((*key, task.lease))
        self._queue(pb.TaskReport(epoch=task.epoch, partition=task.partition,
                                  outcome=pb.TaskReport.RELEASED, consumed=cut.stop,
                                  lease=task.lease))
        return cut

    def _produce(self, epoch: int, out: PrefetchStream, credits: Credits,
                 on_epoch: Callable[[int], None], load: Load, quota: int | None) -> None:
        reader = PartitionReader(self.dataset, self.field_names, self.binary_fields,
                                 self.read_stats, self._payload_buffers)
        got_any = False
        joining = epoch == JOIN_CURRENT_EPOCH
        waiting = False  # the last answer was WAIT: others hold the epoch's remaining tasks
        drained = False  # the master leased the epoch's last todo partitions
        failures: list[str] = []
        # Ask when half the window is free (or the consumer runs dry): a few fat calls, not one
        # call per partition.
        low_water = max(1, credits.total // 2)
        waits = _WaitLog(self.job)
        with self._cond:
            self._outstanding = 0
            self._need = quota
            self._keeps.clear()
        self._set_fetching(True)
        try:
            while True:
                if self.error is not None:
                    raise self.error
                if quota is not None and self._need is not None and self._need <= 0:
                    # A synchronous rank has leased (and loaded) its quota: the consumer cuts
                    # what it buffers into batches (whole ones: the quota is whole batches, and
                    # every batch before was whole), and the pass ends once the trainer had all.
                    out.flush()
                    self._wait_acknowledged(float("inf"), abandoned=lambda: out.stopping)
                    with self._cond:
                        need = self._need
                    if need is not None and need > 0:
                        continue  # a lease was given back or failed meanwhile: lease more
                    return
                if drained and quota is None:
                    # Nothing is left to lease: have the consumer hand over its partial batch
                    # (its partitions must be acknowledged for the epoch to end), wait for those
                    # acknowledgements, then long-poll once carrying them; with one reader the
                    # epoch ends in that very call.
                    out.flush()
                    self._wait_acknowledged(max(0.05, self.lease_timeout_s / 3),
                                            abandoned=lambda: out.stopping)
                    free = credits.take_all(1)
                else:
                    free = credits.take_all(low_water, starving=lambda: out.buffered <= 1)
                # Lease depth follows consumption: the window of partitions leased ahead of the
                # consumer (loaded or loading; not those already in its batch buffer) holds a few
                # seconds of training, not a whole byte budget, so that work stays where an
                # idle reader can get it.
                depth = self._lease_depth(credits.total)
                room = depth - (credits.total - free)
                if room < 1 and not (waiting or drained):
                    credits.give(free)  # and wait until the consumer takes a partition
                    credits.give(credits.take_all(free + 1))
                    continue
                if 0 < room < free:
                    credits.give(free - room)
                    free = room
                # After a plain WAIT the first ask answers at once, so that the WAIT can flush the
                # consumer's partial batch; later asks long-poll, and meanwhile the reporter
                # sends reports alone.
                long_poll = waiting or drained
                if long_poll:
                    self._set_fetching(False)
                reports = self.drain_reports()
                started = time.monotonic()
                with self._cond:
                    still = self._need
                held, begun = self._held_now()
                try:
                    response = self.client.get_tasks(self.job, self.worker, epoch, free,
                                                     waits.poll_ms() if long_poll else 0,
                                                     reports, held=held,
                                                     max_records=max(0, still or 0),
                                                     started=begun, sync=self.sync,
                                                     stats=self.stats())
                except BaseException:
                    with self._cond:  # keep them for the next try
                        self._reports[:0] = reports
                    raise
                finally:
                    self._set_fetching(True)
                self._group_broken(response.group_broken)
                self._superseded(response.superseded)
                if self.broken is not None:
                    raise self.broken
                if isinstance(self.error, SupersededError):
                    raise self.error
                self._revoke(response.revoked, started, response.revoked_why)
                self._confirmed(reports)
                waits.saw(response, epoch, started)
                with self._cond:
                    self._held.update(((t.epoch, t.partition), t.lease) for t in response.tasks)
                self._give_back(response.give_back)
                self._contacted()
                credits.give(free - len(response.tasks))
                if response.status == pb.GetTasksResponse.WAIT and not long_poll \
                        and quota is None:
                    out.flush()
                waiting = response.status == pb.GetTasksResponse.WAIT
                drained = response.status == pb.GetTasksResponse.TASKS and not response.todo_left
                if response.status == pb.GetTasksResponse.EPOCH_DONE:
                    done_epoch = epoch if epoch >= 0 else response.current_epoch
                    self.epoch_failures[done_epoch] = (
                        list(response.failed) if response.failed_known else None)
                    if failures and not got_any:
                        raise PartitionReadError(
                            f"this reader could read none of the {len(failures)} partition(s) "
                            f"of {self.dataset.url} it was given; last error: {failures[-1]}")
                    if quota is not None:
                        with self._cond:
                            short = self._need or 0
                        if short > 0:
                            raise SyncShortfallError(
                                f"synchronous pass of job {self.job!r}: epoch {done_epoch} "
                                f"ended {short} records short of this rank's quota of {quota} "
                                f"(partitions lost, see the master's log, or ranks that "
                                f"disagree on the world size)")
                        return
                    if got_any or not joining:
                        if not got_any:
                            logger.warning(
                                "job %r: epoch %d was over before this reader's pass of it "
                                "began (the reader fell a whole epoch behind): the pass is "
                                "empty, and the next one reads epoch %d", self.job, done_epoch,
                                done_epoch + 1)
                        return
                    # A reader's first pass joins the epoch the job is on; if that one ended
                    # before this reader got anything (others held its last tasks), the pass
                    # is the next epoch, so that no first pass is empty.
                    epoch = done_epoch + 1
                    continue
                if response.status != pb.GetTasksResponse.TASKS:
                    continue  # WAIT: the long poll already waited
                epoch = response.current_epoch
                on_epoch(epoch)
                for t in response.tasks:
                    task = self._keep(TaskRef(t.epoch, t.partition, t.shard, t.row_group_start,
                                              t.row_group_stop, t.num_records, t.skip_records,
                                              t.lease, stop=t.stop_records,
                                              row_start=t.row_start))
                    try:
                        # Minus what an earlier holder's trainer already got (task.skip).
                        table = load(reader, task)
                    except (CorruptDatasetError, OSError, pa.ArrowException) as e:
                        logger.error("partition %d (%s) failed: %s", task.partition, task.shard, e)
                        failures.append(f"{type(e).__name__}: {e}")
                        self.report_failed(task, failures[-1])
                        credits.give(1)
                        continue
                    got_any = True
                    self._handed_over()
                    out.put(LoadedPartition(task, table))
        finally:
            self._set_fetching(False)
            reader.close()

    def end_pass_early(self) -> None:
        """After a pass was abandoned mid-way: send reports, hand unconsumed tasks back. Nothing
        once the session is closed (its close did it; a pass ended after that has no channel)."""
        if self._closed:
            return
        try:
            self._hand_back()
        except Exception as e:  # the master or the channel is gone: the leases then expire
            logger.warning("could not hand tasks back after an abandoned pass: %s", e)

    def _hand_back(self) -> None:
        self._send()
        released = self.client.leave_job(self.job, self.worker).released_tasks
        with self._cond:
            self._held.clear()
            self._started.clear()
        if released:
            logger.info("handed %d unfinished task(s) back to the master", released)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._reporter.join(10)
        try:
            self._hand_back()
        except Exception as e:  # the master may be gone for good; leases then expire
            logger.warning("could not hand tasks back on close: %s", e)


class _WaitLog:
    """Says, once a pass has waited WAIT_LOG_S for partitions that others hold, what it waits
    for and until when: the holders and when their leases run out (a dead reader's at the end
    of its lease; a live one's are renewed). Again when the holders change, or every
    WAIT_LOG_EVERY_S. Not thread-safe: the producer's own."""

    def __init__(self, job: str):
        self.job = job
        self.since: float | None = None  # when the current run of WAIT answers began
        self.logged_at = 0.0
        self.logged: tuple[str, ...] = ()

    def poll_ms(self) -> int:
        """How long the next long-poll may wait: LONG_POLL_MS, or less when a log line is due
        sooner (so that it comes at WAIT_LOG_S, not up to a poll later)."""
        if self.since is None or self.logged_at >= self.since:
            return LONG_POLL_MS
        due = self.since + WAIT_LOG_S - time.monotonic()
        return max(100, min(LONG_POLL_MS, int(due * 1000) + 50))

    def saw(self, response: pb.GetTasksResponse, asked: int, asked_at: float) -> None:
        """An answer to a call made at `asked_at` (monotonic): a WAIT's long-poll waited from
        then on."""
        now = time.monotonic()
        if response.status != pb.GetTasksResponse.WAIT:
            self.since = None
            return
        if self.since is None:
            self.since = asked_at
        holders = tuple(sorted(h.worker for h in response.holders))
        quiet_for = now - self.logged_at
        if now - self.since < WAIT_LOG_S or quiet_for < WAIT_LOG_S or (
                holders == self.logged and quiet_for < WAIT_LOG_EVERY_S):
            return
        self.logged, self.logged_at = holders, now
        logger.warning("job %r: %s", self.job, describe_wait(response, asked, now - self.since))


def describe_wait(response: pb.GetTasksResponse, asked: int, waited: float) -> str:
    """What a pass that got WAIT answers for `waited` seconds waits for, and until when."""
    epoch = response.current_epoch
    what = (f"epoch {asked} starts once epoch {epoch} is complete" if asked > epoch
            else f"epoch {epoch}'s last partitions")
    if not response.holders:
        return (f"waited {waited:.0f} s for {what}; no reader holds a lease on its remaining "
                f"partitions (a synchronous rank short of its share?)")
    now = time.time()
    held = "; ".join(
        f"{h.partitions} held by {h.worker} until "
        f"{wall_clock(h.lease_until)}"
        + (f" (not heard from for {h.quiet_s:.0f} s: its lease runs out then)"
           if h.quiet_s > 2 and h.lease_until > now else " (renewed while it lives)")
        for h in response.holders)
    return f"waited {waited:.0f} s for {what}: waiting for partitions {held}"
