"""Coordinator behaviours that mutation testing (tools/mutation.py, issue 36) showed no test
pinned: restoring saved jobs, the grace after a restart or a stall, what the lease timer returns
and tells, the figures of `job_stats` and `status`, the refusals' words, the session cap, leaving,
a heartbeat's answer field by field, the bounds of a `get_tasks` epoch, the live-reader count
behind fair shares, and what the core logs. Every call goes through the pure core, time as an
argument (no sleeps, no gRPC)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sync_ranks import manifest as sized_manifest
from test_coordinator import PARTITIONS, RECORDS, manifest

from trainfeed.master.core import coordinator as coordinator_module
from trainfeed.master.core.coordinator import (
    RESTART_GRACE_LEASES,
    STALL_S,
    Ask,
    Coordinator,
)
from trainfeed.master.core.jobs import (
    FailedPrecondition,
    InvalidArgument,
    Job,
    JobStats,
    MasterConfig,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from trainfeed.master.core.ledger import LeaseStatus, Outcome
from trainfeed.master.core.messages import (
    EpochComplete,
    GetTasks,
    GiveBack,
    Granted,
    GroupBroken,
    Heard,
    Heartbeat,
    HeldTask,
    JobStatus,
    Leave,
    OpenJob,
    ReaderStats,
    Report,
    Revoked,
    Superseded,
    SyncGroup,
    Task,
)
from trainfeed.master.core.news import Told
from trainfeed.master.core.reader_stats import Refusal as BoardRefusal
from trainfeed.master.core.reports import MAX_REFUSED_LISTED
from trainfeed.master.core.saved_job import SavedJob
from trainfeed.master.serve import convert
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

T = 30.0  # the lease timeout
GRACE = RESTART_GRACE_LEASES * T
LOGGER = coordinator_module.__name__


def make_core(tmp_path: Path, partitions: int = PARTITIONS, **config: object) -> Coordinator:
    return Coordinator(MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=T,
                                    target_partitions=partitions,
                                    **config))  # type: ignore[arg-type]


def request(job: str = "j", **kw: object) -> OpenJob:
    """An OpenJob as the shell hands it to the core (its wire form, converted)."""
    return convert.open_job(pb.OpenJobRequest(
        job=job, dataset="d", worker_name="r", protocol_version=PROTOCOL_VERSION,
        **kw))  # type: ignore[arg-type]


def make_job(core: Coordinator, name: str = "j", partitions: int = PARTITIONS) -> Job:
    opening = request(name)
    m = manifest() if partitions == PARTITIONS else sized_manifest((RECORDS,) * partitions)
    job = core.create_job(opening, m, core.check_open(opening, None), b"k" * 32)
    job.ledger.take_journal()
    return job


def join(core: Coordinator, job: Job, now: float = 0.0, **kw: object) -> str:
    opened, _ = core.open_session(job, request(job.name, **kw), now)
    return opened.worker_id


def rank(core: Coordinator, job: Job, r: int, now: float = 0.0, world: int = 2) -> str:
    """Synchronous rank `r` of a group of `world` ranks of batch size 2, watching its stream."""
    worker = join(core, job, now, sync=pb.SyncGroup(world_size=world, rank=r, batch_size=2))
    core.open_stream(job, worker, job.sessions.secret(worker), exchange=False)
    return worker


def get(core: Coordinator, job: Job, worker: str, now: float, n: int = PARTITIONS,
        **kw: object) -> tuple[Granted, list[Told]]:
    answer, told = core.handle(job, worker, GetTasks(seq=1, epoch=kw.pop("epoch", 0),  # type: ignore[arg-type]
                                                     max_tasks=n, **kw), now)  # type: ignore[arg-type]
    assert isinstance(answer, Granted), answer
    return answer, told


def tasks(core: Coordinator, job: Job, worker: str, now: float, n: int = PARTITIONS
          ) -> list[Task]:
    answer, _ = get(core, job, worker, now, n)
    assert answer.grant.status is LeaseStatus.TASKS, answer
    return list(answer.grant.tasks)


def beat(core: Coordinator, job: Job, worker: str, now: float, seq: int = 1, **kw: object
         ) -> tuple[Heard | None, list[Told]]:
    answer, told = core.handle(job, worker, Heartbeat(seq=seq, **kw), now)  # type: ignore[arg-type]
    assert answer is None or isinstance(answer, Heard), answer
    return answer, told


def report(task: Task, outcome: Outcome = Outcome.DONE, lease: int | None = None,
           consumed: int = 0) -> Report:
    return Report(task.epoch, task.partition, outcome,
                  task.lease if lease is None else lease, consumed)


def held(task: Task, started: bool = False) -> HeldTask:
    return HeldTask(task.epoch, task.partition, task.lease, started)


def messages(caplog: pytest.LogCaptureFixture, part: str = "") -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and part in r.getMessage()]


# -- lifecycle --------------------------------------------------------------------------------
def test_restore_loads_saved_jobs_with_fresh_deadlines_and_skips_a_changed_dataset(
        tmp_path: Path) -> None:
    first = make_core(tmp_path)
    job = make_job(first)
    base = job.state()
    worker = join(first, job)
    leased = tasks(first, job, worker, 1.0, 2)
    saved = SavedJob(base, job.ledger.take_journal())
    changed = SavedJob({**base, "fingerprint": "another upload"})
    second = make_core(tmp_path)
    restored = second.restore({"j": saved, "k": changed}, lambda name, version: manifest(),
                              100.0)
    assert [j.name for j in restored] == ["j"] and list(second.jobs) == ["j"]
    again = second.jobs["j"]
    assert restored == [again] and list(second.metrics) == ["j"]
    assert set(again.ledger.pending) == {t.partition for t in leased}
    assert again.ledger.deadlines == {worker: 100.0 + T}
    [stats] = second.job_stats(100.0)
    assert (stats.job, stats.pending, stats.records_served) == ("j", 2, 0)


def test_grace_after_a_restart_runs_from_now_for_leases_and_synchronous_groups(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    tasks(core, job, worker, 1.0, 2)
    group = make_job(core, "s")
    rank(core, group, 0, 1.0)
    core.grant_grace(100.0)
    assert core.alive_at == 100.0
    assert job.ledger.deadlines == {worker: 100.0 + GRACE}
    assert group.members is not None
    assert (group.members.not_before, group.members.formed) == (100.0 + GRACE, 100.0)


def test_a_gap_over_stall_s_grants_grace_and_one_of_exactly_stall_s_does_not(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job, 10.0)
    tasks(core, job, worker, 10.0, 1)
    assert core.alive_at == 10.0 and job.ledger.deadlines == {worker: 10.0 + T}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        core.expire_leases(10.0 + STALL_S)
        assert job.ledger.deadlines == {worker: 10.0 + T} and not messages(caplog)
        core.expire_leases(14.5)
    assert job.ledger.deadlines == {worker: 14.5 + GRACE}
    assert core.alive_at == 14.5
    assert messages(caplog) == ["the master did not run for 2.5 s (stopped or blocked); "
                                "outstanding leases get 60 s of grace"]


def test_the_first_sign_of_life_is_no_stall(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        worker = join(core, job, 1000.0)
        tasks(core, job, worker, 1000.0, 1)
        core.expire_leases(1001.0)
    assert core.alive_at == 1001.0
    assert not messages(caplog, "did not run")


def test_the_timer_returns_the_jobs_it_changed_and_tells_the_holder_without_a_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    quiet = make_job(core, "q")
    worker = join(core, job)
    core.open_stream(job, worker, job.sessions.secret(worker), exchange=False)
    mine = tasks(core, job, worker, 0.0, 2)
    woken: list[str] = []
    core.on_change = woken.append
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        changed = {t: core.expire_leases(float(t)) for t in range(1, int(T) + 2)}
    assert {t: [j.name for j in jobs] for t, jobs in changed.items() if jobs} == {int(T): ["j"]}
    assert changed[int(T)] == [job] and quiet not in changed[int(T)]
    assert woken == ["j"]
    assert core.news.take() == [Told("j", worker, Revoked(0, [held(t) for t in mine], ""))]
    [line] = messages(caplog, "expired")
    assert line == (f"job 'j': 2 lease(s) expired, partitions "
                    f"{sorted(t.partition for t in mine)} back to todo")


def test_an_expiry_log_names_the_first_ten_partitions(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path, partitions=12)
    job = make_job(core, partitions=12)
    worker = join(core, job)
    assert len(tasks(core, job, worker, 0.0, 12)) == 12
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for t in range(1, int(T) + 1):
            core.expire_leases(float(t))
    [line] = messages(caplog, "expired")
    assert line.startswith("job 'j': 12 lease(s) expired, partitions [")
    listed = line.split("[")[1].split("]")[0].split(", ")
    assert len(listed) == 10


def test_a_synchronous_group_broken_by_the_timer_tells_every_rank_and_wakes_long_polls(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    tasks(core, job, r0, 0.0, 1)  # (the epoch is begun: a quiet rank breaks the group)
    woken: list[str] = []
    core.on_change = woken.append
    told: list[Told] = []
    for t in range(1, int(T) + 2):
        beat(core, job, r0, float(t), seq=0)
        assert core.expire_leases(float(t)) == []
        told += core.news.take()
    assert woken == ["j"]
    assert {t.worker for t in told} == {r0, r1}
    assert all(isinstance(t.event, GroupBroken) and "rank 1" in t.event.why for t in told)
    answer, _ = beat(core, job, r0, T + 1.5)
    assert answer is not None and "rank 1" in answer.group_broken


def test_a_rank_whose_expiry_broke_the_group_leases_nothing_more(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    tasks(core, job, r0, 0.0, 1)
    theirs = tasks(core, job, r1, 0.0, 1)
    for t in range(1, int(T)):
        beat(core, job, r0, float(t), seq=0)  # (r1 says nothing more)
    answer, told = get(core, job, r0, T + 1, 4)
    assert answer.grant.status is LeaseStatus.WAIT and not answer.grant.tasks
    assert answer.grant.epoch == 0
    assert "rank 1" in answer.grant.group_broken
    assert theirs[0].partition in job.ledger.todo
    assert Told("j", r1, Revoked(0, [held(theirs[0])], "")) in told
    assert {t.worker for t in told if isinstance(t.event, GroupBroken)} == {r0, r1}


# -- figures ----------------------------------------------------------------------------------
def test_job_stats_and_status_carry_every_figure(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a, b = join(core, job), join(core, job)
    mine = tasks(core, job, a, 0.0, 3)
    beat(core, job, a, 1.0, reports=[report(mine[0]),
                                      report(mine[1], lease=mine[1].lease + 1)])
    core.metrics_port = 9123
    for t in range(2, int(T) + 2):
        beat(core, job, b, float(t), seq=0)  # b lives on, a goes quiet
        core.expire_leases(float(t))
    now = T + 1.5
    assert core.job_stats(now) == [JobStats(
        job="j", dataset="d", epoch=0, num_partitions=PARTITIONS, todo=PARTITIONS - 1,
        pending=0, done=1, failed=0, workers_alive=1, leases_expired=2,
        records_served=RECORDS, bytes_served=RECORDS, reports_refused=1)]
    assert core.status(job, now) == JobStatus(
        job="j", dataset="d", epoch=0, num_partitions=PARTITIONS, todo=PARTITIONS - 1,
        pending=0, done=1, failed=0, workers=1, failed_reasons=[], records_served=RECORDS,
        bytes_served=RECORDS, reports_refused=1, metrics_port=9123)


def test_status_lists_failed_partitions_in_order(tmp_path: Path) -> None:
    core = Coordinator(MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=T,
                                    target_partitions=PARTITIONS, max_failures=1))
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 2)
    failed = [Report(t.epoch, t.partition, Outcome.FAILED, t.lease, 0, f"bad {t.partition}")
              for t in reversed(mine)]
    beat(core, job, worker, 1.0, reports=failed)
    status = core.status(job, 1.0)
    assert status.failed == 2 and status.metrics_port == 0
    assert status.failed_reasons == [f"partition {t.partition}: bad {t.partition}"
                                     for t in sorted(mine, key=lambda t: t.partition)]


# -- jobs, scopes, sessions -------------------------------------------------------------------
def test_an_unknown_job_is_named_with_the_jobs_here_only_to_the_masters_token(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    make_job(core)
    with pytest.raises(NotFound) as err:
        core.job("x", None)
    assert err.value.message == ("no job 'x' on this master (jobs: ['j']); a reader creates "
                                 "its job with OpenJob")
    with pytest.raises(NotFound) as err:
        core.job("x", "x")
    assert err.value.message == "no job 'x' on this master; a reader creates its job with OpenJob"
    with pytest.raises(InvalidArgument, match=r"^invalid job name 'no/such name': use 1-128"):
        core.job("no/such name", None)
    assert core.job("j", "j") is core.jobs["j"] and core.job("j", None) is core.jobs["j"]


def test_a_wrong_and_a_missing_secret_are_told_apart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(PermissionDenied, match="carries a wrong session secret for worker"):
            core.open_stream(job, worker, "x", exchange=False)
        with pytest.raises(PermissionDenied, match="carries no session secret for worker"):
            core.open_stream(job, worker, "", exchange=False)
    assert messages(caplog) == [
        f"job 'j': refused a call as worker {worker}: a wrong session secret",
        f"job 'j': refused a call as worker {worker}: no session secret"]
    assert core.open_stream(job, worker, job.sessions.secret(worker), exchange=True) == (
        "j", worker)
    assert not core.news.watches("j", worker)  # an exchange is not told events
    core.open_stream(job, worker, job.sessions.secret(worker), exchange=False)
    assert core.news.watches("j", worker)


def test_the_session_cap_forgets_silent_sessions_first(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path, max_sessions=2)
    job = make_job(core)
    old = join(core, job, 0.0)
    join(core, job, 1.0)
    window = core.live_window_s
    assert window == 3 * T
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(ResourceExhausted) as err:
            join(core, job, window)  # `old` was heard from exactly a window ago: still live
    assert err.value.message == (
        "job 'j' has 2 live reader sessions, the most this master allows per job (trainfeed "
        "master --max-sessions 2); sessions that stop calling are forgotten after 90 s")
    assert messages(caplog) == ["job 'j': refused a new session: 2 live reader sessions already"]
    assert old in job.workers
    new = join(core, job, window + 0.5)  # now `old` is forgotten
    assert old not in job.workers and new in job.workers and len(job.workers) == 2


def test_a_refused_session_after_forgetting_others_makes_the_next_lease_recount(
        tmp_path: Path) -> None:
    """The count behind fair shares is refreshed at most every second; forgetting sessions
    at the cap (then refusing) makes the next lease count again at once."""
    core = Coordinator(MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=0.5,
                                    target_partitions=PARTITIONS, max_sessions=1))
    job = make_job(core)
    a = join(core, job, 0.0)
    beat(core, job, "ghost", 0.4, seq=0)  # (a session a restarted master hears from)
    tasks(core, job, "ghost", 1.0, 1)
    assert job.live_workers == 2 and job.live_workers_at == 1.0 and a in job.workers
    with pytest.raises(ResourceExhausted):
        join(core, job, 1.55)  # forgets `a` (quiet for more than 1.5 s), still full
    assert list(job.workers) == ["ghost"]
    tasks(core, job, "ghost", 1.6, 1)
    assert job.live_workers == 1 and job.live_workers_at == 1.6


def test_a_session_cap_of_one_admits_one(tmp_path: Path) -> None:
    core = make_core(tmp_path, max_sessions=1)
    job = make_job(core)
    join(core, job)
    with pytest.raises(ResourceExhausted):
        join(core, job, 1.0)


def test_the_fair_share_counts_the_readers_live_within_the_window(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a, b = join(core, job, 10.0), join(core, job, 10.0)
    assert len(tasks(core, job, a, 10.0)) == PARTITIONS // 2  # two share it
    assert job.live_workers == 2 and job.live_workers_at == 10.0
    # b was heard from at 10: live until a window later, counted at most every second.
    now = 10.0 + core.live_window_s
    beat(core, job, a, now, seq=0)
    assert len(tasks(core, job, a, now, 1)) == 1
    assert job.live_workers == 2 and job.live_workers_at == now
    later = now + 0.5  # b is silent past the window now, but the count is half a second old
    tasks(core, job, a, later, 1)
    assert job.live_workers == 2 and job.live_workers_at == now
    last = now + 1.0
    tasks(core, job, a, last, 1)
    assert job.live_workers == 1 and job.live_workers_at == last
    assert b in job.workers


def test_a_newcomer_makes_the_next_lease_recount_at_once(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a = join(core, job, 0.0)
    assert job.live_workers_at == 0.0
    assert len(tasks(core, job, a, 1.0, 1)) == 1
    assert job.live_workers == 1 and job.live_workers_at == 1.0
    join(core, job, 1.2)
    assert job.live_workers_at == 0.0  # a newcomer changes the fair share: recount
    tasks(core, job, a, 1.5, 1)
    assert job.live_workers == 2 and job.live_workers_at == 1.5
    beat(core, job, a, 1.6)  # a known reader changes nothing
    assert job.live_workers_at == 1.5
    assert job.workers[a] == 1.6


# -- OpenJob ----------------------------------------------------------------------------------
def test_create_job_logs_the_job_it_created(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        job = make_job(core)
    assert messages(caplog, "created") == [
        f"job 'j' created: dataset 'd', {PARTITIONS * RECORDS} records in {PARTITIONS} "
        f"partitions, distribution rules 'all'"]
    assert core.jobs == {"j": job} and list(core.metrics) == ["j"]


def test_a_plain_session_changes_no_ledger_and_a_resume_does(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    opened, changed = core.open_session(job, request(), 0.0)
    assert changed is False and opened.resumed_partitions == 0 and opened.resume_cut == 0
    assert opened.worker_id.startswith("r-")
    old = opened.worker_id
    core.open_stream(job, old, opened.session_secret, exchange=False)
    mine = tasks(core, job, old, 0.0, 3)
    beat(core, job, old, 0.5, reports=[report(mine[0])])
    woken: list[str] = []
    core.on_change = woken.append
    resumed, changed = core.open_session(job, request(resume=pb.ResumePosition(
        epoch=0, worker_id=old, credential=opened.resume_credential, done=[mine[0].partition],
        positions={mine[1].partition: 99})), 1.0)
    assert changed and resumed.resumed_partitions == 2 and resumed.resume_cut == 1
    assert woken == ["j"] and old not in job.workers and resumed.worker_id in job.workers
    told = core.news.take()
    why = (f"a reader restored from this reader's checkpoint (r, worker {resumed.worker_id}) "
           f"took over its partitions")
    assert told == [Told("j", old, Revoked(0, [held(mine[1]), held(mine[2])], why)),
                    Told("j", old, Superseded(0, why))]


def test_a_resume_without_or_with_a_wrong_credential_is_refused_naming_which(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    old = join(core, job)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for credential, said in (("", "no"), ("x", "a wrong")):
            with pytest.raises(PermissionDenied, match=f"the checkpoint carries {said} resume "
                                                       f"credential for it"):
                core.open_session(job, request(resume=pb.ResumePosition(
                    epoch=0, worker_id=old, credential=credential)), 1.0)
    assert messages(caplog) == [f"job 'j': refused a resume of worker {old}: no or a wrong "
                                f"resume credential"] * 2
    assert list(job.workers) == [old]


def test_an_asynchronous_reader_of_a_synchronous_job_is_refused(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    join(core, job, sync=pb.SyncGroup(world_size=2, rank=0, batch_size=3))
    with pytest.raises(FailedPrecondition) as err:
        join(core, job)
    assert err.value.message == (
        "job 'j' is synchronous (world size 2, batch size 3): read it with dist.reader(..., "
        "sync=True), or use another job name")


def test_a_refused_order_is_logged_clipped_with_the_readers_name(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    join(core, job, 0.0, order=pb.DeliveryOrder(seed=1))
    long = "x" * 600
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with pytest.raises(FailedPrecondition) as err:
            core.open_session(job, convert.open_job(pb.OpenJobRequest(
                job="j", dataset="d", protocol_version=PROTOCOL_VERSION,
                order=pb.DeliveryOrder(seed=2, resample=long))), 1.0)
    assert err.value.trailer == (("trainfeed-refusal", "delivery-order"),)
    assert "(by r)" in err.value.message and len(err.value.message) > 500
    [line] = messages(caplog, "refused")
    assert line == f"job 'j': refused a reader: {err.value.message[:500]}"


def test_a_taken_rank_is_refused_with_its_trailer(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    rank(core, job, 0)
    with pytest.raises(FailedPrecondition) as err:
        rank(core, job, 0, 1.0)
    assert dict(err.value.trailer)["trainfeed-refusal"] == "rank-taken"
    assert "claims it too" in err.value.message and "r claims" in err.value.message


# -- the Session stream -----------------------------------------------------------------------
def test_a_heartbeat_answers_every_field(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, fast, mine = slow_and_fast(core, job)  # it asks the slow reader to give back
    wrong = Report(mine[0].epoch, mine[0].partition, Outcome.DONE, mine[0].lease + 1)
    gone = HeldTask(0, mine[1].partition, mine[1].lease + 1)
    answer, _ = beat(core, job, slow, 1.5, seq=9, reports=[wrong],
                     held=[gone] + [held(t) for t in mine[2:]])
    assert answer is not None
    assert (answer.seq, answer.epoch, answer.group_broken, answer.why) == (9, 0, "", "")
    assert answer.revoked == [gone]
    assert answer.give_back and set(answer.give_back) <= {held(t) for t in mine[2:]}
    assert answer.refused == [HeldTask(0, wrong.partition, wrong.lease)]
    assert answer.refused_count == 1


def test_a_heartbeat_tells_a_superseded_reader_why(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    opened, _ = core.open_session(job, request(), 0.0)
    old = opened.worker_id
    [task] = tasks(core, job, old, 0.5, 1)
    core.open_session(job, request(resume=pb.ResumePosition(
        epoch=0, worker_id=old, credential=opened.resume_credential)), 1.0)
    answer, _ = beat(core, job, old, 2.0)
    assert answer is not None and "restored from this reader's checkpoint" in answer.why
    granted, _ = get(core, job, old, 2.0, reports=[report(task)])
    assert granted.grant.status is LeaseStatus.WAIT and not granted.grant.tasks
    assert granted.grant.group_broken == ""
    assert granted.grant.superseded == answer.why == granted.grant.revoked_why
    assert granted.seq == 1 and granted.epoch == 0
    assert granted.refused == [held(task)] == list(granted.grant.revoked)
    assert granted.refused_count == 1 and not job.ledger.done


def test_an_unanswered_heartbeat_is_checked_and_gets_no_answer(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 1)
    with pytest.raises(InvalidArgument):
        beat(core, job, worker, 1.0, seq=0, reports=[report(mine[0])])
    answer, _ = beat(core, job, worker, 1.0, seq=0,
                     reports=[report(mine[0], Outcome.PROGRESS, consumed=3)])
    assert answer is None and job.ledger.progress == {mine[0].partition: 3}
    answer, _ = beat(core, job, worker, 1.0, seq=2, reports=[report(mine[0])])
    assert answer is not None and answer.seq == 2 and job.ledger.done


@pytest.mark.parametrize("epoch, allowed", [(-2, False), (-1, True), (0, True), (1, True),
                                            (2, False)])
def test_a_get_tasks_may_ask_for_the_current_or_the_next_epoch(
        tmp_path: Path, epoch: int, allowed: bool) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    if allowed:
        answer, _ = get(core, job, worker, 0.0, 1, epoch=epoch)
        assert answer.grant.status is (LeaseStatus.TASKS if epoch <= 0 else LeaseStatus.WAIT)
        return
    with pytest.raises(InvalidArgument) as err:
        get(core, job, worker, 0.0, 1, epoch=epoch)
    assert err.value.message == (
        f"job 'j': cannot lease tasks of epoch {epoch}: the job is at epoch 0; ask for an "
        f"epoch up to the next one, 1 (-1 joins the current one)")


def test_a_get_tasks_for_a_past_epoch_leases_nothing_and_minus_one_joins_the_next(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0)
    beat(core, job, worker, 0.5, reports=[report(t) for t in mine])
    assert job.ledger.complete
    joined, _ = get(core, job, worker, 1.0, 1, epoch=-1)  # the next epoch, 1
    assert joined.grant.status is LeaseStatus.TASKS and joined.grant.epoch == 1
    past, _ = get(core, job, worker, 1.0, 1, epoch=0)
    assert past.grant.status is LeaseStatus.EPOCH_DONE and not past.grant.tasks
    assert past.grant.failed_known and past.epoch == 1


def test_a_get_tasks_that_reconciles_takes_back_what_the_reader_does_not_list(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        answer, _ = get(core, job, worker, 1.0, 0, reconcile=True, held=[held(mine[0])])
    [again] = answer.grant.tasks  # taken back to the front of todo, and leased anew
    assert again.partition == mine[1].partition and again.lease != mine[1].lease
    assert mine[0].partition in job.ledger.pending
    assert messages(caplog, "did not know") == [
        f"job 'j': worker {worker} did not know of its lease(s) on [{mine[1].partition}] (an "
        f"answer lost to a restart?); back to todo"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        get(core, job, worker, 1.0, 1, held=[])  # no reconcile: nothing taken back
    assert mine[0].partition in job.ledger.pending and not messages(caplog, "did not know")


def test_a_get_tasks_lists_its_refused_reports_in_revoked_after_the_revoked_leases(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 2)
    gone = HeldTask(0, mine[0].partition, mine[0].lease + 1)
    wrong = report(mine[1], lease=mine[1].lease + 1)
    answer, _ = get(core, job, worker, 1.0, 1, held=[gone], reports=[wrong])
    refused = HeldTask(0, wrong.partition, wrong.lease)
    assert answer.grant.revoked == [gone, refused]
    assert answer.refused == [refused] and answer.refused_count == 1


def test_a_long_poll_is_answered_at_once_without_a_wait_and_on_its_last_attempt(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a, b = join(core, job), join(core, job)
    while get(core, job, a, 0.0)[0].grant.status is LeaseStatus.TASKS:
        pass
    answer, _ = core.handle(job, b, GetTasks(seq=4, epoch=0, max_tasks=1), 1.0)
    assert isinstance(answer, Granted) and answer.grant.status is LeaseStatus.WAIT
    assert answer.seq == 4 and answer.epoch == 0 and answer.refused_count == 0
    ask, _ = core.handle(job, b, GetTasks(seq=5, epoch=0, max_tasks=1, wait_ms=100), 1.0)
    assert isinstance(ask, Ask) and not ask.last and ask.seq == 5 and ask.epoch == 0
    ask.last = True
    last, _ = core.handle(job, b, ask, 1.5)
    assert isinstance(last, Granted) and last.seq == 5
    assert last.grant.status is LeaseStatus.WAIT
    assert [h.worker for h in last.grant.holders] == [a]


def test_a_waiting_reader_asks_the_holders_that_have_not_started_to_give_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, fast, mine = rated_pair(core, job, watching=True)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        while True:
            answer, told = get(core, job, fast, 1.0)
            if answer.grant.status is not LeaseStatus.TASKS:
                break
    assert told and all(t.worker == slow and isinstance(t.event, GiveBack) for t in told)
    asked = [lease.partition for t in told for lease in t.event.leases]  # type: ignore[union-attr]
    assert all(job.stealing.asks[p].delivered for p in asked)
    assert {lease for t in told for lease in t.event.leases} <= {  # type: ignore[union-attr]
        held(t) for t in mine}
    assert messages(caplog, "is idle") == [
        f"job 'j': {fast} is idle; asking {slow} to give back partition {p}" for p in asked]


def test_a_reader_without_a_stream_is_asked_in_its_answer_not_told(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, fast, mine = rated_pair(core, job)
    while True:
        answer, told = get(core, job, fast, 1.0)
        if answer.grant.status is not LeaseStatus.TASKS:
            break
    assert not told and job.stealing.asks
    assert not any(ask.delivered for ask in job.stealing.asks.values())
    heard, _ = beat(core, job, slow, 1.5, held=[held(t) for t in mine])
    assert heard is not None and heard.give_back


def test_synchronous_ranks_are_not_asked_to_give_back(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    job.stealing.rates.add(r0, 1, 0.0)
    job.stealing.rates.add(r0, 1, 1.0)
    job.stealing.rates.add(r1, 100, 0.0)
    job.stealing.rates.add(r1, 100, 1.0)
    tasks(core, job, r0, 1.0, PARTITIONS)
    answer, told = get(core, job, r1, 1.5, PARTITIONS)
    while answer.grant.status is LeaseStatus.TASKS:
        answer, told = get(core, job, r1, 1.5, PARTITIONS)
    assert not told and not job.stealing.asks


# -- reports ----------------------------------------------------------------------------------
def test_refused_reports_are_counted_and_logged_with_the_first_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 2)
    wrong = [report(t, lease=t.lease + 1) for t in mine]
    progress = report(mine[0], Outcome.PROGRESS, lease=mine[0].lease + 1, consumed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        answer, _ = beat(core, job, worker, 1.0, reports=[progress])
        assert answer is not None and answer.refused_count == 1
        assert core.metrics["j"].reports_refused == 0 and not messages(caplog)
        answer, _ = beat(core, job, worker, 1.0, reports=[progress, *wrong])
    assert answer is not None and answer.refused_count == 3
    assert core.metrics["j"].reports_refused == 2
    why = (f"partition {mine[0].partition} of epoch 0: not this worker's lease (any more); the "
           f"job is at epoch 0")
    assert messages(caplog) == [f"job 'j': refused 2 report(s) of worker {worker}, which does "
                                f"not hold their lease; first: {why}"]
    board = core.reader_stats
    assert board is not None


def test_a_released_lease_wakes_the_long_polls_and_an_epochs_end_is_told_once(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    core.open_stream(job, worker, job.sessions.secret(worker), exchange=False)
    mine = tasks(core, job, worker, 0.0)
    woken: list[str] = []
    core.on_change = woken.append
    beat(core, job, worker, 0.5, reports=[report(mine[0], Outcome.RELEASED)])
    assert woken == ["j"]
    woken.clear()
    again = tasks(core, job, worker, 0.6, 1)
    woken.clear()
    _, told = beat(core, job, worker, 0.7, reports=[report(t) for t in mine[1:] + again])
    assert job.ledger.complete and woken == ["j"]
    assert told == [Told("j", worker, EpochComplete(0))]
    _, told = beat(core, job, worker, 0.8, reports=[report(again[0])])  # a repeat
    assert not told and woken == ["j"]


def test_a_held_lease_begun_voids_its_ask_and_wakes_the_thief(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, fast, mine = slow_and_fast(core, job)
    asked = set(job.stealing.asks)
    assert asked
    woken: list[str] = []
    core.on_change = woken.append
    beat(core, job, slow, 1.2, held=[held(t, started=t.partition in asked) for t in mine])
    assert woken == ["j"] and not set(job.stealing.asks) & asked


# -- LeaveJob ---------------------------------------------------------------------------------
def test_leaving_releases_the_leases_forgets_the_session_and_its_stream(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker, stay = join(core, job), join(core, job)
    secret = job.sessions.secret(worker)
    core.open_stream(job, worker, secret, exchange=False)
    mine = tasks(core, job, worker, 0.0, 3)
    job.live_workers_at = 0.5
    woken: list[str] = []
    core.on_change = woken.append
    with pytest.raises(PermissionDenied):
        core.leave(job, Leave("j", worker, "wrong"), 1.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert core.leave(job, Leave("j", worker, secret), 1.0) == 3
    assert messages(caplog, "left") == [f"job 'j': worker {worker} left, 3 task(s) back to todo"]
    assert woken == ["j"] and not job.ledger.pending
    assert worker not in job.workers and stay in job.workers
    assert not core.news.watches("j", worker) and job.live_workers_at == 0.0
    assert {t.partition for t in mine} <= set(job.ledger.todo)
    woken.clear()
    caplog.clear()
    stay_secret = job.sessions.secret(stay)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert core.leave(job, Leave("j", stay, stay_secret), 2.0) == 0
    assert woken == [] and not messages(caplog, "left")


def test_a_rank_that_left_breaks_the_group_once_another_waits(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    tasks(core, job, r0, 0.0, 1)
    core.leave(job, Leave("j", r1, job.sessions.secret(r1)), 1.0)
    woken: list[str] = []
    core.on_change = woken.append
    now = 1.0
    while now < T + 2:
        now += 1.0
        beat(core, job, r0, now, seq=0)
        core.expire_leases(now)
    core.news.take()
    assert woken == []  # nobody waits: the group may be finishing
    answer, told = core.handle(job, r0, GetTasks(seq=1, epoch=1, max_tasks=1, wait_ms=1000),
                               now)
    assert isinstance(answer, Granted), answer
    assert "rank 1" in answer.grant.group_broken and "closed its reader" in (
        answer.grant.group_broken)
    assert woken == ["j"]
    assert [t.worker for t in told if isinstance(t.event, GroupBroken)] == [r0]


def rated_pair(core: Coordinator, job: Job, watching: bool = False
               ) -> tuple[str, str, list[Task]]:
    """Two readers, `slow` (1 record/s, which leased its fair share: returned) and `fast`
    (100 records/s, nothing leased yet); `watching`: `slow` has a stream open."""
    slow, fast = join(core, job), join(core, job)
    if watching:
        core.open_stream(job, slow, job.sessions.secret(slow), exchange=False)
    job.stealing.rates.add(slow, 1, 0.0)
    job.stealing.rates.add(slow, 1, 1.0)
    job.stealing.rates.add(fast, 100, 0.0)
    job.stealing.rates.add(fast, 100, 1.0)
    return slow, fast, tasks(core, job, slow, 1.0)


def slow_and_fast(core: Coordinator, job: Job, watching: bool = False
                  ) -> tuple[str, str, list[Task]]:
    """`rated_pair`, then `fast` leased the rest and asked `slow` to give back what it would
    finish sooner."""
    slow, fast, mine = rated_pair(core, job, watching)
    while get(core, job, fast, 1.0)[0].grant.status is LeaseStatus.TASKS:
        pass
    assert job.stealing.asks
    return slow, fast, mine


def test_a_reader_that_leaves_is_forgotten_by_work_stealing(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, _, _ = slow_and_fast(core, job)
    core.leave(job, Leave("j", slow, job.sessions.secret(slow)), 2.0)
    assert not job.stealing.asks and slow not in job.stealing.rates.known()


def test_a_get_tasks_voids_asks_for_begun_leases_only_when_it_lists_them_all(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, _, mine = slow_and_fast(core, job)
    asked = set(job.stealing.asks)
    begun = [held(t, started=True) for t in mine]
    get(core, job, slow, 1.2, 0, held=begun)  # (no reconcile: `held` may be partial)
    assert set(job.stealing.asks) == asked
    woken: list[str] = []
    core.on_change = woken.append
    get(core, job, slow, 1.3, 0, held=begun, reconcile=True)
    assert not set(job.stealing.asks) & asked and "j" in woken


def test_a_summary_and_refusals_reach_the_reader_board(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job, 5.0)
    beat(core, job, worker, 5.0, stats=ReaderStats(wall_s=1.0, records=7))
    answer, _ = get(core, job, worker, 6.0, 1, stats=ReaderStats(wall_s=1.0, records=3))
    [view] = core.reader_stats.views("j", 6.0)
    assert (view.worker, view.records, view.last_contact_s) == (worker, 10, 0.0)
    [task] = answer.grant.tasks
    beat(core, job, worker, 7.0, reports=[report(task, lease=task.lease + 1)])
    why = (f"partition {task.partition} of epoch 0: not this worker's lease (any more); the "
           f"job is at epoch 0")
    assert core.reader_stats.refusals("j") == [BoardRefusal(7.0, worker, 1, why)]
    beat(core, job, worker, 8.0, reports=[report(task, lease=task.lease + 1)])
    assert core.metrics["j"].reports_refused == 2


def test_one_message_that_hands_back_and_finishes_wakes_the_long_polls(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 3)
    woken: list[str] = []
    core.on_change = woken.append
    beat(core, job, worker, 0.5, reports=[report(mine[0], Outcome.RELEASED), report(mine[1])])
    assert woken == ["j"]
    woken.clear()
    tasks(core, job, worker, 0.6, 1)
    assert woken == ["j"]  # a lease may let others' long-polls end too


def test_a_restarted_master_relearns_ranks_from_their_messages(tmp_path: Path) -> None:
    first = make_core(tmp_path)
    job = make_job(first)
    base = job.state()
    r0, r1 = rank(first, job, 0), rank(first, job, 1)
    base = job.state()
    assert base["sync_group"] == [2, 2]
    second = make_core(tmp_path)
    [again] = second.restore({"j": SavedJob(base)}, lambda name, version: manifest(), 10.0)
    assert again.members is None
    beat(second, again, r0, 10.0, sync=SyncGroup(2, 0, 2))
    assert again.members is not None and again.members.rank_of(r0) == 0
    get(second, again, r1, 10.5, 1, sync=SyncGroup(2, 1, 2))
    assert again.members.rank_of(r1) == 1


def test_the_first_rank_changes_the_ledger_and_the_next_does_not(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    sync = pb.SyncGroup(world_size=2, rank=0, batch_size=2)
    _, changed = core.open_session(job, request(sync=sync), 0.0)
    assert changed and job.ledger.group == (2, 2)
    _, changed = core.open_session(job, convert.open_job(pb.OpenJobRequest(
        job="j", dataset="d", protocol_version=PROTOCOL_VERSION,
        sync=pb.SyncGroup(world_size=2, rank=1, batch_size=2))), 0.0)
    assert not changed
    with pytest.raises(FailedPrecondition) as err:
        core.open_session(job, request(sync=pb.SyncGroup(world_size=2, rank=1,
                                                         batch_size=2)), 1.0)
    assert "rank 1 of its synchronous group is held by a reader (worker" in err.value.message
    assert "r claims it too" in err.value.message


def test_a_resume_naming_a_partition_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    opened, _ = core.open_session(job, request(), 0.0)
    with pytest.raises(InvalidArgument, match="resume position names partition 99"):
        core.open_session(job, request(resume=pb.ResumePosition(
            epoch=0, worker_id=opened.worker_id, credential=opened.resume_credential,
            done=[99])), 1.0)


def test_an_open_job_with_another_jobs_token_is_refused(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    with pytest.raises(PermissionDenied, match="token is a job token of another job"):
        core.check_open(request(), "other")
    assert core.check_open(request(), "j") is not None


def test_revoked_is_bounded_and_refused_reports_fill_only_what_is_left(tmp_path: Path) -> None:
    n = MAX_REFUSED_LISTED + 1
    core = make_core(tmp_path, partitions=n)
    job = make_job(core, partitions=n)
    assert len(job.partitions) == n
    worker = join(core, job)
    gone = [HeldTask(0, p, 999) for p in range(MAX_REFUSED_LISTED)]
    answer, _ = get(core, job, worker, 1.0, 1, held=gone,
                    reports=[Report(0, MAX_REFUSED_LISTED, Outcome.DONE, 999)])
    assert answer.grant.revoked == gone
    assert answer.refused == [HeldTask(0, MAX_REFUSED_LISTED, 999)]


def test_ranks_that_all_ask_for_the_next_epoch_while_todo_is_left_are_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        answer, _ = get(core, job, r0, 1.0, 1, epoch=1)
        assert answer.grant.status is LeaseStatus.WAIT and not messages(caplog)
        get(core, job, r1, 1.0, 1, epoch=1)
    [line] = messages(caplog)
    assert line.startswith("job 'j': every rank of the synchronous group (world size 2) had "
                           "its quota of epoch 0 and asks for the next")


def test_a_reader_restored_from_a_ranks_checkpoint_takes_its_rank_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    sync = pb.SyncGroup(world_size=2, rank=0, batch_size=2)
    opened, _ = core.open_session(job, request(sync=sync), 0.0)
    old = opened.worker_id
    mine = tasks(core, job, old, 0.0, 2)
    with caplog.at_level(logging.INFO, logger="trainfeed.master.core.opening"):
        resumed, _ = core.open_session(job, request(sync=sync, resume=pb.ResumePosition(
            epoch=0, worker_id=old, credential=opened.resume_credential)), 1.0)
    assert job.members is not None and job.members.rank_of(resumed.worker_id) == 0
    assert "restored from its checkpoint" in job.members.message_for(old)
    assert [r.getMessage() for r in caplog.records if "resumes the checkpoint" in
            r.getMessage()] == [f"job 'j': worker {resumed.worker_id} resumes the checkpoint of "
                                f"{old} in epoch 0: {len(mine)} partition(s) back to todo"]


def test_a_reader_that_left_can_be_resumed_and_leaving_twice_is_harmless(
        tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    opened, _ = core.open_session(job, request(), 0.0)
    old = opened.worker_id
    leave = Leave("j", old, opened.session_secret)
    assert core.leave(job, leave, 1.0) == 0 and core.leave(job, leave, 1.5) == 0
    resumed, changed = core.open_session(job, request(resume=pb.ResumePosition(
        epoch=0, worker_id=old, credential=opened.resume_credential)), 2.0)
    assert changed and resumed.worker_id in job.workers and old not in job.workers


def test_a_get_tasks_does_not_revoke_the_leases_still_the_readers(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    mine = tasks(core, job, worker, 0.0, 2)
    answer, _ = get(core, job, worker, 1.0, 1, held=[held(t) for t in mine])
    assert answer.grant.revoked == [] and answer.grant.status is LeaseStatus.TASKS


def test_a_given_back_partition_is_kept_for_the_reader_that_asked(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    slow, fast, mine = slow_and_fast(core, job)
    third = join(core, job, 1.0)
    heard, _ = beat(core, job, slow, 1.5, held=[held(t) for t in mine])
    assert heard is not None and heard.give_back
    back = heard.give_back[0]
    beat(core, job, slow, 1.6, reports=[Report(back.epoch, back.partition, Outcome.RELEASED,
                                               back.lease)])
    assert back.partition in job.ledger.todo
    waited, _ = get(core, job, third, 1.7, 1)
    assert waited.grant.status is LeaseStatus.WAIT  # (kept for the thief)
    got, _ = get(core, job, fast, 1.8, 1)
    assert [t.partition for t in got.grant.tasks] == [back.partition]


def test_a_reader_asking_when_others_leases_ran_out_leases_them_at_once(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a, b = join(core, job, 10.0), join(core, job, 10.0)
    mine = tasks(core, job, a, 10.0, 2)
    for t in range(11, int(10 + T) + 1):
        beat(core, job, b, float(t), seq=0)  # (no timer tick: b's call finds the expiry)
    got, _ = get(core, job, b, 10.0 + T, 2)
    assert got.grant.status is LeaseStatus.TASKS
    assert {t.partition for t in mine} <= {t.partition for t in got.grant.tasks} | set(
        job.ledger.todo)


def test_a_get_tasks_leases_no_more_than_covers_max_records(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    answer, _ = get(core, job, worker, 0.0, 4, max_records=RECORDS + 5)
    assert len(answer.grant.tasks) == 2


def test_a_rank_that_waited_in_the_current_epoch_did_not_ask_ahead(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    r0, r1 = rank(core, job, 0), rank(core, job, 1)
    mine = tasks(core, job, r0, 1.0)
    while True:
        waited, _ = get(core, job, r1, 1.0)
        if waited.grant.status is not LeaseStatus.TASKS:
            break
        mine += waited.grant.tasks
    assert waited.grant.status is LeaseStatus.WAIT and not job.ledger.todo  # the current epoch
    owners = dict(job.ledger.pending)
    for w in (r0, r1):
        beat(core, job, w, 1.5, reports=[report(t, Outcome.RELEASED) for t in mine
                                          if owners[t.partition] == w])
    assert not job.ledger.pending and job.ledger.todo
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        get(core, job, r0, 2.0, 1, epoch=1)
    assert not messages(caplog)


def test_a_handed_back_ask_leases_to_its_reader(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    a, b = join(core, job), join(core, job)
    mine: list[Task] = []
    while len(mine) < PARTITIONS:
        mine += tasks(core, job, a, 0.0)
    ask, _ = core.handle(job, b, GetTasks(seq=3, epoch=0, max_tasks=1, wait_ms=1000), 1.0)
    assert isinstance(ask, Ask)
    beat(core, job, a, 1.2, reports=[report(mine[0], Outcome.RELEASED)])
    answer, _ = core.handle(job, b, ask, 1.4)
    assert isinstance(answer, Granted) and answer.grant.status is LeaseStatus.TASKS
    assert job.ledger.pending[mine[0].partition] == b


def test_a_closed_stream_is_told_nothing_more(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    worker = join(core, job)
    key = core.open_stream(job, worker, job.sessions.secret(worker), exchange=False)
    core.close_stream(key)
    assert not core.news.watches("j", worker)


def test_a_job_leases_with_the_token_key_it_was_created_with(tmp_path: Path) -> None:
    core = make_core(tmp_path)
    job = make_job(core)
    assert job.ledger.token_key == b"k" * 32


def test_a_master_that_accepts_unversioned_readers_admits_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(tmp_path)
    unversioned = convert.open_job(pb.OpenJobRequest(job="j", dataset="d"))
    with pytest.raises(FailedPrecondition):
        core.check_open(unversioned, None)
    monkeypatch.setattr(coordinator_module, "ACCEPT_UNVERSIONED", True)
    assert core.check_open(unversioned, None) is not None
