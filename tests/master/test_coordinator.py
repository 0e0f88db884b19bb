"""The master's pure core (trainfeed.master.core.coordinator), with time as an argument and no gRPC:
what a watching session is told (issue 28), the protocol version, and refusals as CallErrors. Each
Session message goes through `Coordinator.handle`, as the shell hands it over (`send`)."""
from __future__ import annotations

import pytest

from trainfeed.formats.manifest import FieldSpec, Manifest, RowGroupInfo, ShardInfo
from trainfeed.master.core import coordinator
from trainfeed.master.core.coordinator import Ask, Coordinator
from trainfeed.master.core.jobs import (
    FailedPrecondition,
    Job,
    MasterConfig,
    NotFound,
    PermissionDenied,
)
from trainfeed.master.core.messages import OpenJob
from trainfeed.master.serve import convert
from trainfeed.planning.distribution import DistributionRules
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

PARTITIONS = 8
RECORDS = 10  # per partition
TIMEOUT = 30.0


def manifest() -> Manifest:
    groups = tuple(RowGroupInfo(num_rows=RECORDS, num_bytes=RECORDS, first_id=i * RECORDS)
                   for i in range(PARTITIONS))
    shard = ShardInfo(path="data/shard-00000.parquet", num_rows=PARTITIONS * RECORDS,
                      num_bytes=PARTITIONS * RECORDS, sha256="0" * 64, row_groups=groups)
    return Manifest(name="d", kind="text", fields=(FieldSpec("text", "string"),),
                    label_field=None, num_records=PARTITIONS * RECORDS,
                    num_bytes=PARTITIONS * RECORDS, shards=(shard,), label_histogram={},
                    fingerprint="f", source="test", created_at="2026-11-26T00:00:00Z")


@pytest.fixture
def core(tmp_path: object) -> Coordinator:
    return Coordinator(MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=TIMEOUT,
                                    target_partitions=PARTITIONS))


def open_request(version: int = PROTOCOL_VERSION, **kw: object) -> OpenJob:
    """An OpenJob as the shell hands it to the core (its wire form, converted)."""
    return convert.open_job(pb.OpenJobRequest(
        job="j", dataset="d", worker_name="r", protocol_version=version,
        **kw))  # type: ignore[arg-type]


def new_job(core: Coordinator) -> Job:
    request = open_request()
    rules = core.check_open(request, None)
    return core.create_job(request, manifest(), rules, b"k" * 32)


def join(core: Coordinator, job: Job, now: float = 0.0) -> tuple[str, str]:
    response, _ = core.open_session(job, open_request(), now)
    assert response.protocol_version == PROTOCOL_VERSION
    return response.worker_id, response.session_secret


def send(core: Coordinator, job: Job, worker: str, message: pb.SessionMessage | Ask,
         now: float) -> tuple[pb.WatchEvent | Ask | None, bool]:
    """A message of `worker`'s stream, as the shell hands it to the core (converted, as
    trainfeed.master.serve.streams does): its answer on the wire (an Ask as is), and whether
    it changed the ledger (journaled ops). Its events stay queued for `events`."""
    job.ledger.take_journal()
    answer, told = core.handle(
        job, worker, message if isinstance(message, Ask) else convert.message(message), now)
    core.news.pending.extend(told)
    wire = None if answer is None or isinstance(answer, Ask) else convert.answer(answer)
    return (answer if isinstance(answer, Ask) else wire), bool(job.ledger.take_journal())


def events(core: Coordinator, key: tuple[str, str]) -> list[pb.WatchEvent]:
    """The events told to session `key` (its stream's) since last taken, on the wire."""
    mine = [convert.event(t.event) for t in core.news.pending if (t.job, t.worker) == key]
    core.news.pending = [t for t in core.news.pending if (t.job, t.worker) != key]
    return mine


def lease(core: Coordinator, job: Job, worker: str, secret: str, n: int, now: float,
          **kw: object) -> pb.GetTasksResponse:
    """A `get_tasks` without a long-poll: its grant. (`secret`: checked when a stream opens.)"""
    request = pb.GetTasksRequest(epoch=0, max_tasks=n, **kw)  # type: ignore[arg-type]
    answer, _ = send(core, job, worker, pb.SessionMessage(seq=1, get_tasks=request), now)
    assert isinstance(answer, pb.WatchEvent) and answer.answers == 1
    assert not answer.grant.superseded and not answer.grant.group_broken
    return answer.grant


def report(core: Coordinator, job: Job, worker: str, now: float, **kw: object
           ) -> tuple[pb.WatchEvent, bool]:
    """A heartbeat that waits for its answer (seq 1): the answer, and whether it changed the
    ledger."""
    answer, changed = send(core, job, worker, pb.SessionMessage(
        seq=1, report=pb.ReportRequest(**kw)), now)  # type: ignore[arg-type]
    assert isinstance(answer, pb.WatchEvent) and answer.answers == 1
    return answer, changed


def drain(core: Coordinator, job: Job, worker: str, secret: str, now: float
          ) -> pb.GetTasksResponse:
    """Leases until nothing is left for `worker`; the first answer that is not TASKS."""
    while True:
        answer = lease(core, job, worker, secret, PARTITIONS, now)
        if answer.status != pb.GetTasksResponse.TASKS:
            return answer


def watch(core: Coordinator, job: Job, worker: str, secret: str) -> tuple[str, str]:
    return core.open_stream(job, worker, secret, exchange=False)


def test_a_reader_of_another_protocol_is_refused_naming_both_versions(
        core: Coordinator) -> None:
    for version in (*range(1, PROTOCOL_VERSION), PROTOCOL_VERSION + 1):
        with pytest.raises(FailedPrecondition, match=rf"speaks wire protocol {version}, this "
                                                     rf"master speaks {PROTOCOL_VERSION}"):
            core.check_open(open_request(version), None)
    core.check_open(open_request(PROTOCOL_VERSION), None)


def test_a_reader_from_before_versions_is_refused_once_readers_send_theirs(
        core: Coordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    # Until the readers that send PROTOCOL_VERSION are merged (branch lease), 0 is served.
    monkeypatch.setattr(coordinator, "ACCEPT_UNVERSIONED", False)
    with pytest.raises(FailedPrecondition, match=r"protocol 0 \(a reader from before protocol "
                                                 rf"versions\), this master speaks "
                                                 rf"{PROTOCOL_VERSION}"):
        core.check_open(open_request(0), None)


def test_refusals_are_call_errors_not_grpc(core: Coordinator) -> None:
    with pytest.raises(NotFound, match="no job 'j' on this master"):
        core.job("j", None)
    job = new_job(core)
    with pytest.raises(PermissionDenied, match="token is a job token of another job"):
        core.job("j", "other")
    with pytest.raises(PermissionDenied, match="no session secret"):
        watch(core, job, "someone", "")


def test_a_give_back_reaches_a_watching_holder_at_once_and_only_once(
        core: Coordinator) -> None:
    job = new_job(core)
    slow, slow_secret = join(core, job)
    fast, fast_secret = join(core, job)
    key = watch(core, job, slow, slow_secret)
    job.stealing.rates.add(slow, 1, 0.0)  # slow: 1 record/s; fast: 100
    job.stealing.rates.add(slow, 1, 1.0)
    job.stealing.rates.add(fast, 100, 0.0)
    job.stealing.rates.add(fast, 100, 1.0)
    got = lease(core, job, slow, slow_secret, PARTITIONS, 1.0)
    assert len(got.tasks) == PARTITIONS // 2  # a fair share
    answer = drain(core, job, fast, fast_secret, 1.0)  # the rest, then nothing: it asks
    assert answer.status == pb.GetTasksResponse.WAIT
    told = [t.worker for t in core.news.pending]
    asked = [t for e in events(core, key) for t in e.give_back]
    assert asked and told and set(told) == {slow}
    tokens = {t.partition: t.lease for t in got.tasks}
    assert all(t.epoch == 0 and tokens[t.partition] == t.lease for t in asked)
    # The slow reader's next message is not asked again (it was told on its stream).
    held = [pb.HeldTask(epoch=0, partition=t.partition, lease=t.lease) for t in got.tasks]
    response, _ = report(core, job, slow, 1.5, held=held)
    assert not response.give_back


def test_a_reader_without_a_stream_is_asked_in_its_next_answer(core: Coordinator) -> None:
    job = new_job(core)
    slow, slow_secret = join(core, job)
    fast, fast_secret = join(core, job)
    job.stealing.rates.add(slow, 1, 0.0)
    job.stealing.rates.add(slow, 1, 1.0)
    job.stealing.rates.add(fast, 100, 0.0)
    job.stealing.rates.add(fast, 100, 1.0)
    got = lease(core, job, slow, slow_secret, PARTITIONS, 1.0)
    drain(core, job, fast, fast_secret, 1.0)
    held = [pb.HeldTask(epoch=0, partition=t.partition, lease=t.lease) for t in got.tasks]
    response, _ = report(core, job, slow, 1.5, held=held)
    assert response.give_back  # (a stream broken meanwhile loses no ask)
    assert not core.news.pending


def test_expired_leases_and_the_end_of_an_epoch_are_pushed(core: Coordinator) -> None:
    job = new_job(core)
    a, a_secret = join(core, job)
    b, b_secret = join(core, job)
    a_key, b_key = watch(core, job, a, a_secret), watch(core, job, b, b_secret)
    mine = lease(core, job, a, a_secret, PARTITIONS, 0.0).tasks
    core.expire_leases(TIMEOUT + 1)  # a went quiet
    revoked = [t for e in events(core, a_key) for t in e.revoked]
    assert {(t.partition, t.lease) for t in revoked} == {(t.partition, t.lease) for t in mine}
    assert not events(core, b_key)
    now = TIMEOUT + 2
    while True:
        got = lease(core, job, b, b_secret, PARTITIONS, now)
        if got.status != pb.GetTasksResponse.TASKS:
            break
        reports = [pb.TaskReport(epoch=0, partition=t.partition, lease=t.lease,
                                 outcome=pb.TaskReport.DONE) for t in got.tasks]
        _, changed = report(core, job, b, now, reports=reports)
        assert changed
    assert job.ledger.complete
    for key in (a_key, b_key):
        assert [e.epoch_complete for e in events(core, key)
                if e.epoch_complete or not (e.revoked or e.give_back)] == [0]


def test_a_superseded_reader_is_told_with_its_leases(core: Coordinator) -> None:
    job = new_job(core)
    old, old_secret = join(core, job)
    opened, _ = core.open_session(job, open_request(), 0.0)
    key = watch(core, job, old, old_secret)
    mine = lease(core, job, old, old_secret, 2, 0.0).tasks
    credential = job.sessions.resume_credential(old)
    core.open_session(job, open_request(resume=pb.ResumePosition(
        epoch=0, worker_id=old, credential=credential)), 1.0)
    told = events(core, key)
    assert any("restored from this reader's checkpoint" in e.superseded for e in told)
    revoked = {(t.partition, t.lease) for e in told for t in e.revoked}
    assert revoked == {(t.partition, t.lease) for t in mine}
    assert opened.worker_id != old


def test_metrics_are_read_from_the_coordinator(core: Coordinator) -> None:
    job = new_job(core)
    worker, secret = join(core, job)
    got = lease(core, job, worker, secret, 1, 0.0).tasks[0]
    report(core, job, worker, 0.5, reports=[
        pb.TaskReport(epoch=0, partition=got.partition, lease=got.lease,
                      outcome=pb.TaskReport.DONE)])
    [stats] = core.job_stats(1.0)
    assert (stats.records_served, stats.done, stats.workers_alive) == (RECORDS, 1, 1)
    assert not hasattr(job, "records_served")
    assert DistributionRules("all") == job.rules
