"""The master as a separate process: health, errors users hit, state kept across a restart."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from integration.raw_calls import open_request

from trainfeed import MasterSource, dist
from trainfeed.errors import JobError
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration


def test_health_service_reports_serving(storage: str) -> None:
    with MasterProcess(storage) as master, grpc.insecure_channel(master.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "trainfeed.v1.Master"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_health_list_names_the_services_and_nothing_of_the_jobs(storage: str) -> None:
    """Health/List needs no token (docs/security.md, doors): it names the two services it
    serves, whatever jobs the master holds."""
    with MasterProcess(storage) as master:
        with dist.reader("flowers",
                         source=MasterSource(master.address, "private-job")) as reader:
            assert sum(len(b["_id"]) for b in reader.column_batches(4)) > 0
        with grpc.insecure_channel(master.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(),
                                                             timeout=5)
    assert sorted(reply.statuses) == ["", "trainfeed.v1.Master"]
    assert {s.status for s in reply.statuses.values()} == {
        health_pb2.HealthCheckResponse.SERVING}
    assert "private-job" not in str(reply) and "flowers" not in str(reply)


def test_clear_errors_for_unknown_datasets_jobs_and_bad_names(storage: str) -> None:
    with MasterProcess(storage) as master, MasterClient(master.address, give_up_s=5) as client:
        with pytest.raises(JobError, match=r"NOT_FOUND: no dataset 'tulips'.*datasets here: "
                                           r"flowers"):
            list(dist.reader("tulips", source=MasterSource(master.address))())
        with pytest.raises(JobError, match=r"NOT_FOUND: no job 'ghost'"):
            client.job_status("ghost")
        with pytest.raises(JobError, match="INVALID_ARGUMENT: invalid dataset name"):
            client.open_job("j", "../etc", 0)
        client.open_job("j", "flowers", 0)
        with pytest.raises(JobError, match="FAILED_PRECONDITION: job 'j' reads dataset "
                                           "'flowers', not 'other'"):
            client.open_job("j", "other", 0)


def test_oversized_requests_are_rejected(storage: str) -> None:
    with MasterProcess(storage) as master, grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.OpenJob(open_request(job="j", dataset="flowers",
                                           worker_name="x" * (5 << 20)), timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.slow
def test_job_progress_survives_a_master_restart_with_sqlite_state(storage: str,
                                                                 tmp_path: Path) -> None:
    state = f"sqlite:///{tmp_path / 'master.db'}"
    with MasterProcess(storage, state=state) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, job="j"))
        first = sum(len(b["_id"]) for b in reader.column_batches(10))
        reader.close()
        with MasterClient(master.address) as client:
            before = client.job_status("j")
    with MasterProcess(storage, state=state) as master, MasterClient(master.address) as client:
        after = client.job_status("j")
        assert (after.epoch, after.done, after.num_partitions) == \
               (before.epoch, before.done, before.num_partitions) == (0, 10, 10)
        reader = dist.reader("flowers", source=MasterSource(master.address, job="j"))
        second = sum(len(b["_id"]) for b in reader.column_batches(10))
        assert reader.epoch == 1  # the restarted master knew epoch 0 was complete
        reader.close()
    assert first == second == 100


def test_batches_larger_than_the_prefetch_window_fill_through_the_master(storage: str) -> None:
    with MasterProcess(storage) as master:
        with dist.reader("flowers", source=MasterSource(master.address, job="big",
                                                        prefetch_partitions=2)) as reader:
            for _ in range(2):  # the second pass proves the first one's partitions were acked
                sizes = [len(b["_id"]) for b in reader.column_batches(64)]
                assert sum(sizes) == 100 and sizes[0] == 64


@pytest.mark.slow
def test_a_spawned_master_does_not_outlive_its_parent(storage: str) -> None:
    parent = subprocess.run(
        [sys.executable, "-c", "import os, sys; from trainfeed.master.serve.process import "
         "MasterProcess; print(MasterProcess(sys.argv[1]).proc.pid, flush=True); os._exit(0)",
         storage], capture_output=True, text=True, timeout=60)
    master_pid = int(parent.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(master_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(master_pid, signal.SIGKILL)
    pytest.fail(f"master {master_pid} outlived its parent by 10 s")


def test_a_pass_left_early_hands_its_tasks_back_and_the_next_pass_resumes(storage: str) -> None:
    with MasterProcess(storage) as master:
        with dist.reader("flowers", source=MasterSource(master.address, job="resume")) as reader:
            first: list[int] = []
            batches = reader.column_batches(10)
            for b in batches:
                first.extend(b["_id"].tolist())
                if len(first) == 30:
                    break
            started = time.monotonic()
            batches.close()  # type: ignore[attr-defined]
            assert time.monotonic() - started < 2, "leaving a pass must not wait on timers"
            epoch = reader.epoch
            rest = [i for b in reader.column_batches(10) for i in b["_id"].tolist()]
            assert reader.epoch == epoch  # the same epoch continued
        # Together they cover the dataset; repeats only from partitions in hand when leaving.
        assert set(first) | set(rest) == set(range(100))
        assert len(first) + len(rest) - 100 <= 10


def test_distribution_rules_admit_only_matching_workers(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with MasterProcess(storage) as master:
        monkeypatch.setenv("TRAINFEED_GPUS", "0")
        with pytest.raises(JobError, match=r"FAILED_PRECONDITION: job 'g' runs on GPU workers "
                                           r"only .* declares no GPU"):
            list(dist.reader("flowers", source=MasterSource(master.address, job="g",
                                                            distribution_rules="gpu"))())
        monkeypatch.setenv("TRAINFEED_GPUS", "1")
        with dist.reader("flowers", source=MasterSource(master.address, job="g")) as reader:
            assert sum(1 for _ in reader()) == 100  # the job kept its creator's rules
        monkeypatch.setenv("TRAINFEED_WORKER_NAME", "node-b")
        with dist.reader("flowers",
                         source=MasterSource(master.address, job="named",
                                             distribution_rules="node-a,node-b")) as reader:
            assert sum(1 for _ in reader()) == 100
        monkeypatch.setenv("TRAINFEED_WORKER_NAME", "node-c")
        with pytest.raises(JobError, match=r"runs on workers \['node-a', 'node-b'\] only"):
            list(dist.reader("flowers", source=MasterSource(master.address, job="named"))())


@pytest.mark.slow
def test_an_unreachable_master_gives_up_with_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainfeed.errors import MasterUnavailableError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("TRAINFEED_MASTER_GIVE_UP_S", "2")
    started = time.monotonic()
    with pytest.raises(MasterUnavailableError, match=rf"master {address} unreachable for \d+ s"):
        list(dist.reader("flowers", source=MasterSource(address))())
    assert 2 <= time.monotonic() - started < 10


def test_workers_joining_a_new_job_at_once_share_one_job(storage: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        with ThreadPoolExecutor(16) as pool:
            opened = list(pool.map(lambda _: client.open_job("c", "flowers", 0), range(16)))
            failures = list(pool.map(lambda _: pytest.raises(JobError, client.open_job, "d",
                                                             "tulips", 0), range(4)))
        assert {o.num_partitions for o in opened} == {10}
        assert len({o.worker_id for o in opened}) == 16
        assert all("NOT_FOUND: no dataset 'tulips'" in str(f.value) for f in failures)
        time.sleep(0.2)
        assert "".join(master.log).count("job 'c' created") == 1
