"""`trainfeed status` against a real master process whose job a reader is reading: what the master
says, the rate from two of its answers, and the token taken from the job's Secret."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cluster.apiserver import FakeApiServer

from trainfeed import MasterSource, dist
from trainfeed.cli.main import main
from trainfeed.cluster import progress
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess

pytestmark = pytest.mark.integration

TOKEN = "status-test-token-0123456789abcdef"


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TRAINFEED_STORAGE", raising=False)


def read_one_epoch(address: str) -> int:
    reader = dist.reader("flowers", source=MasterSource(address, job="resnet"))
    try:
        return sum(len(b["_id"]) for b in reader.column_batches(10))
    finally:
        reader.close()


def test_status_reports_the_masters_view_of_a_job(storage: str, no_cluster: None,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)  # the reader's and the status command's
    with MasterProcess(storage, token=TOKEN) as master:
        assert read_one_epoch(master.address) == 100
        assert main(["status", "resnet", "--master", master.address, "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "job         resnet (dataset flowers)" in out
    assert "epoch       0" in out
    assert "partitions  todo 0 · pending 0 · done 10 · failed 0  (of 10)" in out
    assert "workers     0" in out  # its reader closed: none live (it said 1 before)
    assert "rate        0.00 partitions/s · 0 records/s" in out
    assert "100%" in out and "10/10 partitions" in out
    assert "pods" not in out  # no cluster configured: the master's view only


def test_status_with_master_accepts_every_job_name_the_master_does(
        storage: str, no_cluster: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`paddleD-xmap` is no Kubernetes name, but readers and the master accept it."""
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    with MasterProcess(storage, token=TOKEN) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, job="paddleD-xmap"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(10)) == 100
        finally:
            reader.close()
        assert main(["status", "paddleD-xmap", "--master", master.address,
                     "--interval", "0.1"]) == 0
    assert "job         paddleD-xmap (dataset flowers)" in capsys.readouterr().out
    # Without --master the name must be one `submit` could have made.
    assert main(["status", "paddleD-xmap"]) == 2


def test_status_rate_from_two_answers_of_a_master_being_read(storage: str) -> None:
    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        reader = dist.reader("flowers", source=MasterSource(master.address, job="resnet"))
        batches = reader.column_batches(10)
        next(batches)  # the job exists, one partition is being read
        # Between the two samples the rest of the epoch is read.
        first, second = progress.sample_twice(lambda: client.job_status("resnet"), 0,
                                               sleep=lambda _: sum(1 for _ in batches))
        reader.close()
    assert first.finished < second.finished == 10
    # Records of partitions reported done: the first sample may already count some.
    assert first.status.records_served < second.status.records_served == 100
    rate = progress.partition_rate(first, second)
    records = progress.record_rate(first, second)
    assert rate > 0 and records == pytest.approx(
        (100 - first.status.records_served) / (second.at - first.at))
    line = progress.render(second.status, rate, records)[4]
    assert line.startswith("rate        ") and f"{records:,.0f} records/s" in line


def test_status_takes_the_token_from_the_jobs_secret(
        storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Outside the cluster with a port-forward: no TRAINFEED_TOKEN, the kubeconfig's access to
    the job's Secret is enough. (The API server is the stand-in of tests/cluster/apiserver.py;
    the master is real.)"""
    monkeypatch.delenv("TRAINFEED_TOKEN", raising=False)
    monkeypatch.delenv("TRAINFEED_TOKEN_FILE", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeApiServer() as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path, namespace="ml")))
        assert main(["submit", "--name", "resnet", "--image", "i", "--workers", "1",
                     "--dataset", "flowers", "--storage-pvc", "datasets", "--", "true"]) == 0
        secret = kube.objects("secrets", "ml")["resnet-trainfeed-auth"]
        token = base64.b64decode(secret["data"]["token"]).decode()
        with MasterProcess(storage, token=token) as master:
            with monkeypatch.context() as env:
                env.setenv("TRAINFEED_TOKEN", token)
                assert read_one_epoch(master.address) == 100
            capsys.readouterr()
            assert main(["status", "resnet", "--master", master.address,
                         "--interval", "0.1"]) == 0
            out = capsys.readouterr().out
            assert "master pods no pods" in out  # the stand-in runs no pods
            assert "done 10 · failed 0  (of 10)" in out
            assert "partitions/s · " in out and " records/s" in out
            # A wrong token is refused, and said so.
            kube.objects("secrets", "ml")["resnet-trainfeed-auth"]["data"]["token"] = \
                base64.b64encode(b"not-the-token-0123456789").decode()
            assert main(["status", "resnet", "--master", master.address,
                         "--interval", "0.1"]) == 2
            assert "UNAUTHENTICATED" in capsys.readouterr().err
