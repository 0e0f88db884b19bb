"""Failover: two masters race for one etcd state; only the leader serves, and when it is
SIGKILLed the standby takes over within the lease ttl with the job's progress intact."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sample_data import make_image_list
from test_master_restart import free_port

from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TTL_S = 2  # etcd's smallest lease ttl with its default election timeout


def refuses(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


class Standby:
    """A `trainfeed master` spawned like MasterProcess, but without waiting for it to listen:
    it blocks on the leadership. Its output is collected line by line."""

    def __init__(self, storage: str, state: str, port: int):
        args = [sys.executable, "-m", "trainfeed.cli.main", "master", "--host", "127.0.0.1",
                "--port", str(port), "--storage", storage, "--state", state,
                "--exit-with-parent", "--insecure", "--metrics-port", "0"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.log: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def text(self) -> str:
        return "".join(self.log)

    def wait_for(self, needle: str, timeout_s: float) -> float:
        """Seconds until `needle` appeared in its output; fails the test after `timeout_s`."""
        started = time.monotonic()
        while needle not in self.text():
            assert self.proc.poll() is None, f"standby exited early:\n{self.text()}"
            assert time.monotonic() - started < timeout_s, \
                f"standby did not print {needle!r} within {timeout_s:g} s:\n{self.text()}"
            time.sleep(0.05)
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def test_the_standby_serves_only_after_the_leader_dies(tmp_path: Path, etcd_url: str) -> None:
    source = make_image_list(tmp_path / "source", 40)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=4), progress=False)
    state = f"etcd://{urlsplit(etcd_url).netloc}/failover-{uuid.uuid4().hex[:8]}?ttl={TTL_S}"

    leader = MasterProcess(storage, state=state)
    standby: Standby | None = None
    try:
        with MasterClient(leader.address, give_up_s=10) as client:
            w1 = client.open_job("train", "flowers", seed=0).worker_id  # (with its secret)
            got = client.get_tasks("train", w1, epoch=0, max_tasks=3, wait_ms=0)
            assert got.status == pb.GetTasksResponse.TASKS
            client.report("train", w1, [
                pb.TaskReport(epoch=t.epoch, partition=t.partition,
                              outcome=pb.TaskReport.DONE, lease=t.lease) for t in got.tasks])
            before = client.job_status("train")
        assert before.done == len(got.tasks) > 0

        port = free_port()
        standby = Standby(storage, state, port)
        standby.wait_for("waiting for the leadership", timeout_s=15)
        time.sleep(2 * TTL_S)  # the leader's lease is refreshed: the standby keeps waiting
        assert "listening" not in standby.text() and refuses(port), standby.text()
        assert standby.proc.poll() is None

        leader.kill()  # SIGKILL: no clean revoke; the lease must expire
        took_s = standby.wait_for("listening on", timeout_s=TTL_S + 8)
        print(f"standby serving {took_s:.1f} s after the leader was killed (ttl {TTL_S} s)")

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with MasterClient(f"127.0.0.1:{port}", give_up_s=10) as client:
            after = client.job_status("train")
        assert (after.epoch, after.done, after.num_partitions) == \
               (before.epoch, before.done, before.num_partitions)
    finally:
        leader.stop()
        if standby is not None:
            standby.stop()


def test_a_master_that_loses_its_lease_stops_serving_and_exits_non_zero(
        tmp_path: Path, etcd_url: str) -> None:
    import etcd3gw

    source = make_image_list(tmp_path / "source", 8)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, progress=False)
    prefix = f"/deposed-{uuid.uuid4().hex[:8]}"
    state = f"etcd://{urlsplit(etcd_url).netloc}{prefix}?ttl={TTL_S}"
    parts = urlsplit(etcd_url)
    raw = etcd3gw.Etcd3Client(host=parts.hostname, port=parts.port)
    master = MasterProcess(storage, state=state)
    try:
        # No call writes anything: only the lease keeper can notice (a network partition).
        [(_, leader)] = raw.get(f"{prefix}/leader", metadata=True)
        raw.post(raw.get_url("/kv/lease/revoke"), json={"ID": int(leader["lease"])})
        assert master.proc.wait(TTL_S + 8) != 0
        deadline = time.monotonic() + 5  # its last lines may still be in the pipe
        while "lost the leadership" not in "".join(master.log):
            assert time.monotonic() < deadline, "".join(master.log)
            time.sleep(0.05)
    finally:
        master.stop()
