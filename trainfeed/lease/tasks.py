"""One pass's tasks, leased from the master: what the reader's producer loop reads when a master
feeds it (trainfeed.reader.producer.TaskSource; the local plan is the other source).

Each call of `next_tasks` makes at most one request for tasks (a message of the session's Session
stream: WorkerSession.get_tasks), asking for as many tasks as the prefetch window has room for
and the trainer's pace warrants (the lease depth), and carrying the finished-task reports: in the
steady state a partition costs a fraction of one round trip. At the epoch's tail it has the
consumer hand over its partial batch, waits for its acknowledgements and long-polls; a
synchronous rank stops once it has leased its quota.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa

from trainfeed.errors import (
    CallCancelled,
    CorruptDatasetError,
    PartitionReadError,
    SyncShortfallError,
)
from trainfeed.io.prefetch import Credits, PrefetchStream, Stopped, TaskRef
from trainfeed.lease.client import wall_clock
from trainfeed.lease.session import JOIN_CURRENT_EPOCH, WorkerSession
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

# How long one `get_tasks` message may wait at the master while others hold the epoch's last
# tasks: the master's cap (5 s). Fewer, longer waits cost the master less (30 % fewer requests in
# benchmarks/real_readers.py, issue 28); a pass abandoned at the tail no longer waits for the
# long-poll to return, since a request on the Session stream is given up at close (protocol 3).
LONG_POLL_MS = 5000
# A pass waiting this long for partitions others hold logs what it waits for and until when
# (again when that changes, or every WAIT_LOG_EVERY_S): no wait over 5 s is silent (issue 26).
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 30.0


class LeasedTasks:
    """The tasks of one pass of `session`: epoch `epoch` (or JOIN_CURRENT_EPOCH), told to
    `on_epoch` once known; `quota` is a synchronous rank's records this pass (exactly; see
    trainfeed.reader.world), None for an ordinary pass. Used by one producer thread."""

    # A partition that fails to read with one of these is reported FAILED (the master re-leases
    # it elsewhere, up to --max-failures times); anything else ends the pass.
    read_errors: tuple[type[BaseException], ...] = (CorruptDatasetError, OSError,
                                                     pa.ArrowException)

    def __init__(self, session: WorkerSession, epoch: int, on_epoch: Callable[[int], None],
                 quota: int | None = None):
        self.session = session
        self.epoch = epoch
        self.on_epoch = on_epoch
        self.quota = quota
        self.joining = epoch == JOIN_CURRENT_EPOCH
        self.waiting = False  # the last answer was WAIT: others hold the epoch's remaining tasks
        self.drained = False  # the master leased the epoch's last todo partitions
        self.got_any = False
        self.failures: list[str] = []
        self.waits = _WaitLog(session.job)
        self._begun = False

    # -- the TaskSource protocol --------------------------------------------------------------
    def next_tasks(self, credits: Credits, out: PrefetchStream) -> list[TaskRef] | None:
        """The next tasks to load (each has taken one of `credits`), or None: the pass is over.
        Raises what ended the session's passes (see WorkerSession.check)."""
        if not self._begun:
            self._begin()
        while True:
            self.session.check()
            free = self._room(credits, out)
            if free is None:
                return None
            if not free:
                continue
            tasks = self._lease(free, credits, out)
            if tasks is None or tasks:
                return tasks

    def loaded(self, task: TaskRef) -> None:
        """`task` was read and goes to the consumer."""
        self.got_any = True
        with self.session.locked() as book:
            book.handed_over()

    def failed(self, task: TaskRef, error: BaseException) -> None:
        """`task` could not be read (one of `read_errors`): reported FAILED."""
        logger.error("partition %d (%s) failed: %s", task.partition, task.shard, error)
        self.failures.append(f"{type(error).__name__}: {error}")
        self.session.report_failed(task, self.failures[-1])

    def close(self) -> None:
        self.session.set_fetching(False)

    # -- steps --------------------------------------------------------------------------------
    def _begin(self) -> None:
        self._begun = True
        with self.session.locked() as book:
            book.begin_pass(self.quota)
        self.session.set_fetching(True)

    def _need(self) -> int | None:
        """A synchronous pass's records still to lease (None: not synchronous)."""
        with self.session.locked() as book:
            return book.need

    def _room(self, credits: Credits, out: PrefetchStream) -> int | None:
        """Free prefetch slots to lease into (0: none yet, ask again), or None: a synchronous
        rank has its quota and the trainer had all of it."""
        if self.quota is not None and (self._need() or 0) <= 0:
            # A synchronous rank has leased (and loaded) its quota: the consumer cuts what it
            # buffers into batches (whole ones: the quota is whole batches, and every batch
            # before was whole), and the pass ends once the trainer had all.
            out.flush()
            self.session.wait_acknowledged(float("inf"), abandoned=lambda: out.stopping)
            need = self._need()
            return 0 if need is not None and need > 0 else None  # given back: lease more
        if self.drained and self.quota is None:
            # Nothing is left to lease: have the consumer hand over its partial batch (its
            # partitions must be acknowledged for the epoch to end), wait for those
            # acknowledgements, then long-poll once carrying them; with one reader the epoch
            # ends in that very call.
            out.flush()
            self.session.wait_acknowledged(max(0.05, self.session.opened.lease_timeout_s / 3),
                                           abandoned=lambda: out.stopping)
            free = credits.take_all(1)
        else:
            # Ask when half the window is free (or the consumer runs dry): a few fat calls,
            # not one call per partition.
            free = credits.take_all(max(1, credits.total // 2),
                                    starving=lambda: out.buffered <= 1)
        # Lease depth follows consumption: the window of partitions leased ahead of the
        # consumer (loaded or loading; not those already in its batch buffer) holds a few
        # seconds of training, not a whole byte budget, so that work stays where an idle reader
        # can get it.
        with self.session.locked() as book:
            depth = book.lease_depth(credits.total)
        room = depth - (credits.total - free)
        if room < 1 and not (self.waiting or self.drained):
            credits.give(free)  # and wait until the consumer takes a partition
            credits.give(credits.take_all(free + 1))
            return 0
        if 0 < room < free:
            credits.give(free - room)
            free = room
        return free

    def _wait_ms(self, long_poll: bool) -> int:
        if not long_poll:
            return 0
        with self.session.locked() as book:
            completed = book.completed_epoch
        if 0 <= self.epoch <= completed:
            return 0  # the stream said so: the answer is EPOCH_DONE, at once
        return self.waits.poll_ms()

    def _lease(self, free: int, credits: Credits, out: PrefetchStream) -> list[TaskRef] | None:
        """One request for up to `free` tasks. Returns the tasks granted, [] to ask again,
        or None: the pass is over."""
        # After a plain WAIT the first ask answers at once, so that the WAIT can flush the
        # consumer's partial batch; later asks long-poll, and meanwhile the reporter sends
        # reports alone.
        long_poll = self.waiting or self.drained
        if long_poll:
            self.session.set_fetching(False)
        asked_at = time.monotonic()
        try:
            response = self.session.get_tasks(self.epoch, free, self._wait_ms(long_poll),
                                              max(0, self._need() or 0),
                                              abandoned=lambda: out.stopping)
        except CallCancelled:
            if out.stopping:
                raise Stopped from None  # the pass was abandoned: its producer ends quietly
            raise
        finally:
            self.session.set_fetching(True)
        self.waits.saw(response, self.epoch, asked_at)
        credits.give(free - len(response.tasks))
        status = response.status
        if status == pb.GetTasksResponse.WAIT and not long_poll and self.quota is None:
            out.flush()
        self.waiting = status == pb.GetTasksResponse.WAIT
        self.drained = status == pb.GetTasksResponse.TASKS and not response.todo_left
        if status == pb.GetTasksResponse.EPOCH_DONE:
            return self._epoch_done(response)
        if status != pb.GetTasksResponse.TASKS:
            return []  # WAIT: the long poll already waited
        self.epoch = response.current_epoch
        self.on_epoch(self.epoch)
        return self.session.keep([_task(t) for t in response.tasks])

    def _epoch_done(self, response: pb.GetTasksResponse) -> list[TaskRef] | None:
        """The epoch asked for is complete: the pass ends (None), or a reader's first pass that
        got nothing goes on with the next epoch ([])."""
        done_epoch = self.epoch if self.epoch >= 0 else response.current_epoch
        self.session.epoch_failures[done_epoch] = (
            list(response.failed) if response.failed_known else None)
        if self.failures and not self.got_any:
            raise PartitionReadError(
                f"this reader could read none of the {len(self.failures)} partition(s) of "
                f"{self.session.opened.dataset_url} it was given; last error: "
                f"{self.failures[-1]}")
        if self.quota is not None:
            short = self._need() or 0
            if short > 0:
                raise SyncShortfallError(
                    f"synchronous pass of job {self.session.job!r}: epoch {done_epoch} ended "
                    f"{short} records short of this rank's quota of {self.quota} (partitions "
                    f"lost, see the master's log, or ranks that disagree on the world size)")
            return None
        if self.got_any or not self.joining:
            if not self.got_any:
                logger.warning("job %r: epoch %d was over before this reader's pass of it began "
                               "(the reader fell a whole epoch behind): the pass is empty, and "
                               "the next one reads epoch %d", self.session.job, done_epoch,
                               done_epoch + 1)
            return None
        # A reader's first pass joins the epoch the job is on; if that one ended before this
        # reader got anything (others held its last tasks), the pass is the next epoch, so that
        # no first pass is empty.
        self.epoch = done_epoch + 1
        return []


def _task(t: pb.Task) -> TaskRef:
    return TaskRef(t.epoch, t.partition, t.shard, t.row_group_start, t.row_group_stop,
                   t.num_records, t.skip_records, t.lease, stop=t.stop_records,
                   row_start=t.row_start)


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
