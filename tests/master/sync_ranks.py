"""Synchronous ranks against the master's pure core, for tests/master/test_sync_quota.py.

Each `Rank` is what a `dist.reader(..., sync=True)` process does, reduced to its pure parts: the
real `LeaseBook` (trainfeed.lease.book), its calls built as the session builds them (reports
drained, held leases listed, `max_records` = the quota still needed), a trainer that takes the
records of its kept tasks in order, and the client's handling of refused reports (their leases
dropped as revoked). Calls are Session messages, as objects: a test decides when each one reaches
the `Coordinator` and when its answer reaches the rank, so that it can put them in any order the
network and a loaded machine could (a call drained before another but arriving after it).
"""
from __future__ import annotations

import tempfile
from collections import Counter, deque
from dataclasses import dataclass, field

from trainfeed.formats.manifest import FieldSpec, Manifest, RowGroupInfo, ShardInfo
from trainfeed.io.prefetch import TaskRef
from trainfeed.lease.book import Answer, LeaseBook, Report
from trainfeed.lease.messages import answer_of, leases, to_message
from trainfeed.lease.tasks import _task
from trainfeed.master.core.coordinator import Coordinator
from trainfeed.master.core.jobs import Job, MasterConfig
from trainfeed.master.core.ledger import Ledger
from trainfeed.master.core.messages import Granted, Heard
from trainfeed.master.serve import convert
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

T = 3.0  # the lease timeout (the integration test's)
# Records per partition, uneven so that ranks' quotas end inside partitions: 68 records, a
# group of 2 ranks of 3 records a step keeps 66 (33 a rank) and cuts the last partition.
SIZES = (7, 12, 5, 9, 11, 6, 10, 8)
WORLD, BATCH = 2, 3


def manifest(sizes: tuple[int, ...] = SIZES) -> Manifest:
    first = [sum(sizes[:i]) for i in range(len(sizes))]
    groups = tuple(RowGroupInfo(num_rows=n, num_bytes=n, first_id=f)
                   for n, f in zip(sizes, first))
    shard = ShardInfo(path="data/shard-00000.parquet", num_rows=sum(sizes),
                      num_bytes=sum(sizes), sha256="0" * 64, row_groups=groups)
    return Manifest(name="d", kind="text", fields=(FieldSpec("text", "string"),),
                    label_field=None, num_records=sum(sizes), num_bytes=sum(sizes),
                    shards=(shard,), label_histogram={}, fingerprint="f", source="test",
                    created_at="2026-11-26T00:00:00Z")


def sync_job(sizes: tuple[int, ...] = SIZES) -> tuple[Coordinator, Job]:
    core = Coordinator(MasterConfig(open_storage(tempfile.gettempdir()), lease_timeout_s=T,
                                    target_partitions=len(sizes)))
    request = convert.open_job(pb.OpenJobRequest(job="j", dataset="d",
                                                 protocol_version=PROTOCOL_VERSION))
    job = core.create_job(request, manifest(sizes), core.check_open(request, None), b"k" * 32)
    assert job.ledger.sizes == sizes, job.ledger.sizes  # one partition per row group
    return core, job


@dataclass
class Call:
    """One call of a rank in flight: built (its reports drained) when made, served by the
    master when it arrives, its answer applied by the rank when that comes back."""

    rank: Rank
    kind: str  # "get_tasks" or "report"
    request: pb.GetTasksRequest | pb.ReportRequest  # a `get_tasks` or a `report` message
    sent: list[Report]
    made_at: float
    response: pb.GetTasksResponse | pb.WatchEvent | None = None

    def arrive(self, now: float) -> None:
        """The master takes the message (its refused reports' leases come back in the answer's
        `revoked`, as MasterClient lists them)."""
        rank, core, job = self.rank, self.rank.core, self.rank.job
        if isinstance(self.request, pb.GetTasksRequest):
            self.response = serve_get_tasks(core, job, rank.worker, self.request, now)
        else:
            heard, _ = core.handle(job, rank.worker, convert.message(pb.SessionMessage(
                seq=1, report=self.request)), now)
            assert isinstance(heard, Heard)
            answer = convert.answer(heard)
            answer.revoked.extend(answer.refused)
            self.response = answer
        rank.arrived += 1

    def answer(self, now: float) -> None:
        """The answer reaches the rank (the call arrived before)."""
        assert self.response is not None
        self.rank.answered(self, now)


@dataclass
class Rank:
    """One synchronous rank: its book, its trainer's queue of kept tasks, what it delivered."""

    core: Coordinator
    job: Job
    rank: int
    now: float
    world: int = WORLD
    batch: int = BATCH
    book: LeaseBook = field(init=False)
    worker: str = field(init=False)
    secret: str = field(init=False)
    epoch: int = 0  # the epoch of the rank's pass
    queue: deque[TaskRef] = field(default_factory=deque)
    handed: int = 0  # records of queue[0] the trainer had
    # (epoch, partition, record index) the trainer had, in order.
    delivered: list[tuple[int, int, int]] = field(default_factory=list)
    getting: Call | None = None  # its producer's GetTasks in flight
    arrived: int = 0
    broken: str = ""

    def __post_init__(self) -> None:
        sync = self.sync
        response, _ = self.core.open_session(self.job, convert.open_job(pb.OpenJobRequest(
            job="j", dataset="d", worker_name=f"rank{self.rank}", sync=sync,
            protocol_version=PROTOCOL_VERSION)), self.now)
        self.worker, self.secret = response.worker_id, response.session_secret
        self.book = LeaseBook(response.lease_timeout_s, self.now)
        self.book.begin_pass(self.quota)

    @property
    def sync(self) -> pb.SyncGroup:
        return pb.SyncGroup(world_size=self.world, rank=self.rank, batch_size=self.batch)

    @property
    def quota(self) -> int:
        ledger: Ledger = self.job.ledger
        assert ledger.sizes is not None
        return sum(ledger.sizes) // (self.world * self.batch) * self.batch

    @property
    def need(self) -> int:
        assert self.book.need is not None
        return self.book.need

    def had(self, epoch: int) -> list[tuple[int, int, int]]:
        return [d for d in self.delivered if d[0] == epoch]

    # -- calls ----------------------------------------------------------------------------------
    def get_tasks(self, now: float, max_tasks: int = 3) -> Call:
        """The producer's GetTasks for the rest of its quota (as WorkerSession.get_tasks)."""
        assert self.getting is None
        reports = self.book.drain()
        held, begun = self.book.held_now()
        request = pb.GetTasksRequest(
            epoch=self.epoch, max_tasks=max_tasks, reports=[to_message(r) for r in reports],
            reconcile=True, held=held_tasks(held, begun), max_records=max(0, self.need),
            sync=self.sync)
        self.getting = Call(self, "get_tasks", request, reports, now)
        return self.getting

    def report(self, now: float) -> Call:
        """The reporter's call: queued reports, progress, a heartbeat (as WorkerSession.send;
        a Session message is served the same way)."""
        reports = self.book.drain()
        held, begun = self.book.held_now()
        request = pb.ReportRequest(reports=[to_message(r) for r in reports],
                                   held=held_tasks(held, begun), sync=self.sync)
        return Call(self, "report", request, reports, now)

    def answered(self, call: Call, now: float) -> None:
        response = call.response
        assert response is not None
        granted = ()
        if isinstance(response, pb.GetTasksResponse):
            self.getting = None
            granted = leases(response.tasks)
        applied = self.book.answered(call.sent, answer_of(as_event(response)), call.made_at, now,
                                     granted)
        if applied.broke:
            self.broken = self.book.broken
        if isinstance(response, pb.GetTasksResponse):
            if response.group_broken:
                self.broken = response.group_broken
            if response.status == pb.GetTasksResponse.TASKS:
                self.queue.extend(self.book.keep(_task(t), now) for t in response.tasks)
                for _ in response.tasks:
                    self.book.handed_over()

    def told(self, answer: Answer, now: float) -> None:
        """An event of the Watch stream."""
        self.book.told(answer, now)

    # -- the trainer ----------------------------------------------------------------------------
    def take(self, records: int, now: float) -> int:
        """The trainer takes up to `records` records of its queue's head (dropping a lost
        task's rest, as the batcher does at hand-over). Returns how many it had."""
        if not self.queue:
            return 0
        task = self.queue[0]
        lease = (task.epoch, task.partition, task.lease)
        if self.book.claim(lease):  # lost: its records not yet had are dropped
            self.queue.popleft()
            self.handed = 0
            self.book.done(lease, now)
            return 0
        n = min(records, task.delivers - self.handed)
        start = task.skip + self.handed
        self.delivered.extend((task.epoch, task.partition, i) for i in range(start, start + n))
        self.handed += n
        if self.handed < task.delivers:
            self.book.progress.note(lease, task.skip + self.handed, now)
            return n
        self.queue.popleft()
        self.handed = 0
        self.book.done(lease, now)
        return n

    @property
    def pass_over(self) -> bool:
        """The rank had its quota of this pass: the next pass asks for the next epoch."""
        return self.need <= 0 and not self.queue

    def next_pass(self) -> None:
        assert self.pass_over
        self.epoch += 1
        self.book.begin_pass(self.quota)


def held_tasks(held: list[tuple[int, int, int]], begun: set[tuple[int, int, int]]
               ) -> list[pb.HeldTask]:
    return [pb.HeldTask(epoch=e, partition=p, lease=t, started=(e, p, t) in begun)
            for e, p, t in held]


def serve_get_tasks(core: Coordinator, job: Job, worker: str, request: pb.GetTasksRequest,
                    now: float) -> pb.GetTasksResponse:
    """A `get_tasks` message as the master's stream serves it, without its long-poll (wait_ms
    0): the grant."""
    assert not request.wait_ms
    answer, _ = core.handle(job, worker, convert.message(pb.SessionMessage(
        seq=1, get_tasks=request)), now)
    assert isinstance(answer, Granted), answer
    return convert.grant(answer.grant)


def duplicates(ranks: list[Rank], epoch: int) -> list[tuple[tuple[int, int, int], int]]:
    seen = Counter(d for r in ranks for d in r.had(epoch))
    return [(d, n) for d, n in seen.items() if n > 1]


def as_event(response: pb.GetTasksResponse | pb.ReportResponse) -> pb.WatchEvent:
    """A call's answer as the Session stream's answer to the same message (the one shape a
    reader reads: trainfeed.lease.messages.answer_of)."""
    if isinstance(response, pb.GetTasksResponse):
        return pb.WatchEvent(grant=response)
    return pb.WatchEvent(revoked=response.revoked, give_back=response.give_back,
                         revoked_why=response.revoked_why, group_broken=response.group_broken,
                         superseded=response.superseded)
