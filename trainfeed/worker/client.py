"""A blocking client of the master that rides through restarts.

Every call retries UNAVAILABLE (master restarting, network blip) with exponential backoff and full
jitter, so a fleet of readers does not hammer a master that comes back; after `give_up_s` it raises
MasterUnavailableError naming the address. Other errors are the master's answer and raise at once.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc

from trainfeed import settings
from trainfeed.errors import (
    AuthenticationError,
    ConfigurationError,
    JobError,
    MasterUnavailableError,
)
from trainfeed.security import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    ClientSecurity,
)
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc
from trainfeed.worker.resources import detect_resources

MASTER_ENV = settings.MASTER.name
GIVE_UP_ENV = settings.MASTER_GIVE_UP_S.name
DEFAULT_GIVE_UP_S = settings.MASTER_GIVE_UP_S.default
# Per-call deadline on top of any long-poll wait the call asks for.
CALL_TIMEOUT_S = 10.0
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
# How gRPC reports, under UNAVAILABLE, that this client rejected the master's certificate.
# (A master that refuses this client's certificate just closes the connection: "Socket closed".)
_TLS_REFUSED = re.compile(r"verification check failed|certificate", re.IGNORECASE)
T = TypeVar("T")


def default_master_address() -> str:
    address = settings.MASTER.get()
    if not address:
        raise MasterUnavailableError(
            f"${MASTER_ENV} is not set: set it to the master's host:port (e.g. localhost:50051), "
            f"or set TRAIN_LOCAL=1 to read from storage without a master")
    return address


class MasterClient:
    """One channel to the master. Thread-safe (gRPC channels and stubs are); close() idempotent.

    Credentials: `security` (by default from the environment: `$TRAINFEED_TOKEN` or
    `$TRAINFEED_TOKEN_FILE`, and `$TRAINFEED_TLS_*`, see trainfeed.security); `token`, if given,
    replaces its token. A refused token raises AuthenticationError at once (never retried).
    """

    def __init__(self, address: str | None = None, give_up_s: float | None = None,
                 token: str | None = None, security: ClientSecurity | None = None):
        self.address = address or default_master_address()
        self.give_up_s = give_up_s if give_up_s is not None else settings.MASTER_GIVE_UP_S.get()
        if security is None:
            security = ClientSecurity.from_env(token=token)
        elif token is not None:
            security = dataclasses.replace(security, token=token)
        self.security = security
        self._metadata = security.metadata
        self._channel = security.open_channel(self.address)
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def _call(self, method: Callable[..., T], request: object, timeout: float) -> T:
        started = time.monotonic()
        delay = 0.05
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                details = e.details()  # type: ignore[attr-defined]
                if code is grpc.StatusCode.UNAUTHENTICATED:
                    sent = "a token" if self._metadata else "no token"
                    raise AuthenticationError(
                        f"master {self.address} refused the call, which carried {sent} "
                        f"(UNAUTHENTICATED: {details})") from None
                if code not in _RETRYABLE:
                    raise JobError(f"master {self.address}: {code.name}: {details}") from None
                if _TLS_REFUSED.search(details or ""):  # this client's settings: no retry helps
                    raise ConfigurationError(
                        f"master {self.address}: the TLS handshake failed ({details}); check "
                        f"${TLS_CA_ENV} (the CA that signed the master's certificate) and "
                        f"${TLS_SERVER_NAME_ENV} (a name that certificate holds)") from None
                waited = time.monotonic() - started
                if waited >= self.give_up_s:
                    raise MasterUnavailableError(
                        f"master {self.address} unreachable for {waited:.0f} s ({details}); "
                        f"is it running? (give-up time: ${GIVE_UP_ENV}={self.give_up_s:g})"
                        f"{self._unreachable_hint()}") from None
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, 2.0)

    def _unreachable_hint(self) -> str:
        # A master that closes the connection at once may want TLS, or a client certificate.
        if not self.security.tls:
            return f"; if it serves TLS, set ${TLS_CA_ENV}"
        return (f"; if it requires client certificates, set ${TLS_CERT_ENV} and ${TLS_KEY_ENV} "
                f"to one that its --tls-client-ca signed")

    def open_job(self, job: str, dataset: str, seed: int, distribution_rules: str = "",
                 resume: pb.ResumePosition | None = None) -> pb.OpenJobResponse:
        name = f"{socket.gethostname()}:{os.getpid()}"
        return self._call(self._stub.OpenJob, pb.OpenJobRequest(
            job=job, dataset=dataset, worker_name=name, seed=seed,
            distribution_rules=distribution_rules, resources=detect_resources(),
            resume=resume), CALL_TIMEOUT_S)

    def get_tasks(self, job: str, worker: str, epoch: int, max_tasks: int, wait_ms: int,
                  reports: Iterable[pb.TaskReport] = (),
                  held: Iterable[tuple[int, int]] | None = None) -> pb.GetTasksResponse:
        """Leases tasks. `held`, when given, is every (epoch, partition) the caller holds: the
        master then hands back any other lease it has on the caller (see the proto)."""
        return self._call(self._stub.GetTasks, pb.GetTasksRequest(
            job=job, worker_id=worker, epoch=epoch, max_tasks=max_tasks, wait_ms=wait_ms,
            reports=list(reports), reconcile=held is not None,
            held=[pb.HeldTask(epoch=e, partition=p) for e, p in held or ()]),
            CALL_TIMEOUT_S + wait_ms / 1000)

    def report(self, job: str, worker: str,
               reports: Iterable[pb.TaskReport] = ()) -> pb.ReportResponse:
        return self._call(self._stub.Report, pb.ReportRequest(
            job=job, worker_id=worker, reports=list(reports)), CALL_TIMEOUT_S)

    def leave_job(self, job: str, worker: str) -> pb.LeaveJobResponse:
        return self._call(self._stub.LeaveJob, pb.LeaveJobRequest(job=job, worker_id=worker),
                          CALL_TIMEOUT_S)

    def job_status(self, job: str) -> pb.JobStatus:
        return self._call(self._stub.GetJobStatus, pb.GetJobStatusRequest(job=job),
                          CALL_TIMEOUT_S)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
