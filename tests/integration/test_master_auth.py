"""The master's token check and TLS, against a real master process: refused calls change
nothing, the right credentials read every record, and a master without a token will not start."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from certs import CertificateAuthority
from grpc_health.v1 import health_pb2, health_pb2_grpc
from integration.raw_calls import call, open_request, session_open
from prometheus_client.parser import text_string_to_metric_families

from trainfeed import MasterSource, dist
from trainfeed.errors import AuthenticationError, ConfigurationError, MasterUnavailableError
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.security import ClientSecurity, bearer_metadata
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration
SERVER_NAME = "trainfeed-master.test"  # the only name the test server certificate holds
RECORDS = 100
CREDENTIAL_VARIABLES = ("TRAINFEED_TOKEN", "TRAINFEED_TOKEN_FILE", "TRAINFEED_TLS_CA",
                        "TRAINFEED_TLS_CERT", "TRAINFEED_TLS_KEY", "TRAINFEED_TLS_SERVER_NAME")


@pytest.fixture
def token() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets reaches its clients (not the shell's TRAINFEED_TOKEN…)."""
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def read_ids(master: str, job: str) -> list[int]:
    """Every record id one reader gets in one pass of `job` (credentials from the env)."""
    with dist.reader("flowers", source=MasterSource(master, job=job)) as reader:
        return [i for batch in reader.column_batches(10) for i in batch["_id"].tolist()]


def master_cli(*args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARIABLES}
    return subprocess.run([sys.executable, "-m", "trainfeed.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})})


def unauthenticated_counter(master: MasterProcess) -> float:
    import urllib.request

    assert master.metrics_url is not None
    text = urllib.request.urlopen(master.metrics_url, timeout=5).read().decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "trainfeed_rpc_unauthenticated_total")


def test_calls_without_or_with_a_wrong_token_are_refused_and_change_nothing(
        storage: str, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with MasterProcess(storage, token=token) as master, \
            MasterClient(master.address, token=token) as owner:
        opened = owner.open_job("j", "flowers", seed=0)
        leased = owner.get_tasks("j", opened.worker_id, 0, max_tasks=3, wait_ms=0)
        assert len(leased.tasks) == 3
        before = owner.job_status("j")
        done = [pb.TaskReport(epoch=0, partition=t.partition, outcome=pb.TaskReport.DONE,
                              lease=t.lease)
                for t in leased.tasks]
        # Every RPC, each one a change if it were accepted: a new job, the owner's tasks
        # reported done, handed back, or its worker gone.
        calls: list[tuple[str, object]] = [
            ("OpenJob", open_request(job="intruder", dataset="flowers")),
            ("Session", (session_open("j", opened.worker_id, opened.session_secret),
                         pb.SessionMessage(seq=1, get_tasks=pb.GetTasksRequest(
                             epoch=0, max_tasks=5, reports=done)))),
            ("Session", (session_open("j", opened.worker_id, opened.session_secret),
                         pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=done)))),
            ("LeaveJob", pb.LeaveJobRequest(job="j", worker_id=opened.worker_id)),
            ("GetJobStatus", pb.GetJobStatusRequest(job="j")),
        ]
        refused = 0
        with grpc.insecure_channel(master.address) as channel:
            stub = master_pb2_grpc.MasterStub(channel)
            for metadata, expected in (((), "carried none"),
                                       (bearer_metadata("not-" + token), "is not this master's"),
                                       ((("authorization", token),), "is not this master's")):
                for name, request in calls:
                    with pytest.raises(grpc.RpcError) as refusal:
                        call(stub, name, request, timeout=5, metadata=metadata)
                    assert refusal.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
                    assert expected in refusal.value.details(), name
                    refused += 1
            # Probes need no token: the health service answers anyone.
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="trainfeed.v1.Master"), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # trainfeed's own client says what to set, at once (not after its retry time).
        started = time.monotonic()
        for security in (ClientSecurity(), ClientSecurity(token="wrong-" + token)):
            with MasterClient(master.address, security=security) as intruder, \
                    pytest.raises(AuthenticationError, match=r"refused the call.*"
                                                             r"UNAUTHENTICATED.*TRAINFEED_TOKEN"):
                intruder.open_job("intruder", "flowers", seed=0)
            refused += 1
        monkeypatch.setenv("TRAINFEED_TOKEN", "wrong-" + token)
        with pytest.raises(AuthenticationError):
            read_ids(master.address, "intruder")
        refused += 1
        assert time.monotonic() - started < 5

        assert owner.job_status("j") == before  # nothing changed …
        with pytest.raises(Exception, match="NOT_FOUND: no job 'intruder'"):
            owner.job_status("intruder")  # … and nothing was created
        assert unauthenticated_counter(master) == refused
        # The right token reads every record, each once.
        monkeypatch.setenv("TRAINFEED_TOKEN", token)
        assert sorted(read_ids(master.address, "reader")) == list(range(RECORDS))


def test_the_token_can_come_from_a_file_on_both_ends(storage: str, token: str,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")  # as `echo TOKEN > file` or a Secret written by hand
    with MasterProcess(storage, extra_args=["--token-file", str(path)]) as master:
        assert "token required" in "".join(master.log)
        with pytest.raises(AuthenticationError):
            read_ids(master.address, "j")
        monkeypatch.setenv("TRAINFEED_TOKEN_FILE", str(path))
        assert sorted(read_ids(master.address, "j")) == list(range(RECORDS))


@pytest.mark.slow
def test_the_master_refuses_to_start_without_a_token_or_insecure(storage: str,
                                                                 token: str) -> None:
    base = ("master", "--storage", storage, "--state", "memory://", "--port", "0",
            "--metrics-port", "none")
    started = time.monotonic()
    result = master_cli(*base)
    assert result.returncode == 2
    assert "trainfeed master: error: no token" in result.stderr
    for hint in ("$TRAINFEED_TOKEN", "$TRAINFEED_TOKEN_FILE", "--token-file", "--insecure"):
        assert hint in result.stderr, hint
    assert time.monotonic() - started < 30  # at once, not after a wait
    result = master_cli(*base, "--insecure", env={"TRAINFEED_TOKEN": token})
    assert result.returncode == 2 and "exclude each other" in result.stderr, result.stderr
    result = master_cli(*base, env={"TRAINFEED_TOKEN_FILE": "/nonexistent/token"})
    assert result.returncode == 2
    assert "$TRAINFEED_TOKEN_FILE=/nonexistent/token: cannot read" in result.stderr
    result = master_cli(*base, "--tls-cert", "/nonexistent.crt", env={"TRAINFEED_TOKEN": token})
    assert result.returncode == 2 and "needs both --tls-cert and --tls-key" in result.stderr


@pytest.mark.slow
def test_tls_round_trip_with_a_generated_certificate(storage: str, token: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("server", "trainfeed master", dns=(SERVER_NAME,))
    tls = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    with MasterProcess(storage, token=token, extra_args=tls) as master:
        assert "(storage" in master.log[-1] and "TLS, token required" in master.log[-1]
        monkeypatch.setenv("TRAINFEED_TOKEN", token)
        # A plaintext client cannot talk to it, and is told what may be missing.
        with MasterClient(master.address, give_up_s=1) as plaintext, \
                pytest.raises(MasterUnavailableError, match=r"if it serves TLS, set "
                                                            r"\$TRAINFEED_TLS_CA"):
            plaintext.job_status("j")
        monkeypatch.setenv("TRAINFEED_TLS_CA", str(ca.path))
        # 127.0.0.1 is not a name the certificate holds: refused at once, saying what to set.
        started = time.monotonic()
        with MasterClient(master.address, give_up_s=30) as unnamed, \
                pytest.raises(ConfigurationError, match=r"TLS handshake failed.*"
                                                        r"TRAINFEED_TLS_SERVER_NAME"):
            unnamed.job_status("j")
        assert time.monotonic() - started < 10
        monkeypatch.setenv("TRAINFEED_TLS_SERVER_NAME", SERVER_NAME)
        assert sorted(read_ids(master.address, "j")) == list(range(RECORDS))
        # A token is still required over TLS.
        security = ClientSecurity(ca_file=str(ca.path), server_name=SERVER_NAME)
        with MasterClient(master.address, security=security) as anonymous, \
                pytest.raises(AuthenticationError):
            anonymous.job_status("j")
        # The exec probe speaks TLS from the same settings, and needs no token.
        probe = master_cli("health", "--master", master.address, "--timeout", "10",
                           env={"TRAINFEED_TLS_CA": str(ca.path),
                                "TRAINFEED_TLS_SERVER_NAME": SERVER_NAME})
        assert probe.returncode == 0 and probe.stdout.strip() == "SERVING", probe.stderr
        probe = master_cli("health", "--master", master.address, "--timeout", "3")
        assert probe.returncode == 1 and "set $TRAINFEED_TLS_CA" in probe.stderr


@pytest.mark.slow
def test_mutual_tls_refuses_clients_without_a_certificate_it_trusts(
        storage: str, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("server", "trainfeed master", ips=("127.0.0.1",))
    client = ca.issue("client", "reader", client=True)
    stranger = CertificateAuthority(tmp_path, "stranger-ca").issue("stranger", "stranger",
                                                                   client=True)
    tls = ["--tls-cert", str(server.cert), "--tls-key", str(server.key),
           "--tls-client-ca", str(ca.path)]
    with MasterProcess(storage, token=token, extra_args=tls) as master:
        assert "TLS with client certificates" in master.log[-1]
        for cert in (None, stranger):
            security = ClientSecurity(token=token, ca_file=str(ca.path),
                                      cert_file=str(cert.cert) if cert else None,
                                      key_file=str(cert.key) if cert else None)
            with MasterClient(master.address, give_up_s=1, security=security) as refused, \
                    pytest.raises(MasterUnavailableError, match="if it requires client "
                                                                "certificates"):
                refused.job_status("j")
        for name, value in (("TRAINFEED_TOKEN", token), ("TRAINFEED_TLS_CA", str(ca.path)),
                            ("TRAINFEED_TLS_CERT", str(client.cert)),
                            ("TRAINFEED_TLS_KEY", str(client.key))):
            monkeypatch.setenv(name, value)
        assert sorted(read_ids(master.address, "j")) == list(range(RECORDS))
