"""Token authentication of the master's gRPC API: a server interceptor, and job tokens.

Every call must carry metadata `authorization: Bearer <token>` with the master's token or a job
token; any other call is answered UNAUTHENTICATED before its request is even deserialized, so a
rejected call changes nothing in the service.

A job token (`job_token`, printed by `trainfeed token JOB`, made per job by `trainfeed submit`)
is `tfjob:<job>:<HMAC-SHA256(master token, job)>`: the master checks it with nothing stored, and
the servicer lets its calls touch that job only (`job_of_call`), so one job's trainers cannot
touch another's. The master's own token opens every job: keep it to operators.

Tokens are compared with `hmac.compare_digest`, whose time does not depend on where a guess first
differs. The gRPC health service is exempt: Kubernetes' native gRPC probes cannot send metadata,
and the health status reveals nothing about jobs.
"""
from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from trainfeed.security import (
    AUTH_METADATA_KEY,
    BEARER_SCHEME,
    JOB_TOKEN_PREFIX,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    job_token,
)

logger = logging.getLogger(__name__)

# Probes call this service without credentials (see the module docstring).
EXEMPT_PREFIX = "/grpc.health.v1.Health/"
# A misconfigured fleet retries in a loop: one warning per this many seconds is enough.
LOG_EVERY_S = 60.0

_HOW_TO_FIX = (f"send metadata '{AUTH_METADATA_KEY}: {BEARER_SCHEME} <token>'; trainfeed readers "
               f"send ${TOKEN_ENV} or the file named by ${TOKEN_FILE_ENV}, which must hold the "
               f"token the master was started with")
MISSING_MESSAGE = f"this master requires a token and the call carried none: {_HOW_TO_FIX}"
WRONG_MESSAGE = f"the call's token is not this master's: {_HOW_TO_FIX}"

def _bearer(metadata: Any) -> str | None:
    """The bearer token a call's metadata carries ("" for another scheme), None if none."""
    for key, value in metadata or ():
        if key == AUTH_METADATA_KEY:
            scheme, _, given = (value if isinstance(value, str)
                                else value.decode("latin-1")).partition(" ")
            return given.strip() if scheme.lower() == BEARER_SCHEME.lower() else ""
    return None


def job_of_call(metadata: Any) -> str | None:
    """The job a call's (already admitted) job token names; None for the master's token."""
    given = _bearer(metadata) or ""
    if not given.startswith(JOB_TOKEN_PREFIX):
        return None
    return given[len(JOB_TOKEN_PREFIX):].rpartition(":")[0]


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Admits calls whose bearer token is `token`. Runs on the server's event loop only.

    `rejected` counts refused calls (exported as a metric).
    """

    def __init__(self, token: str):
        self._master_token = token
        self._expected = token.encode()
        self.rejected = 0
        self._logged_at = float("-inf")
        self._unlogged = 0

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if method.startswith(EXEMPT_PREFIX):
            return await continuation(handler_call_details)
        problem = self.problem(handler_call_details.invocation_metadata)  # type: ignore[attr-defined]
        if problem is None:
            return await continuation(handler_call_details)
        self.rejected += 1
        return _rejecting_handler(await continuation(handler_call_details),
                                  self._rejecter(method, problem))

    def problem(self, metadata: Any) -> str | None:
        """None if the metadata carries the master's token or a job token, else what is wrong
        (the decoder checks its calls with it too: trainfeed.decoder.service)."""
        given = _bearer(metadata)
        if given is None:
            return MISSING_MESSAGE
        if hmac.compare_digest(given.encode("utf-8", "replace"), self._expected):
            return None
        if given.startswith(JOB_TOKEN_PREFIX):
            job = given[len(JOB_TOKEN_PREFIX):].rpartition(":")[0]
            if hmac.compare_digest(given.encode("utf-8", "replace"),
                                   job_token(self._master_token, job).encode()):
                return None
        return WRONG_MESSAGE

    def _rejecter(self, method: str, problem: str) -> Callable[[Any, grpc.aio.ServicerContext],
                                                               Awaitable[None]]:
        async def reject(_request: Any, context: grpc.aio.ServicerContext) -> None:
            now = time.monotonic()
            self._unlogged += 1
            if now - self._logged_at >= LOG_EVERY_S:
                logger.warning("refused %d unauthenticated call(s), the last %s from %s: %s",
                               self._unlogged, method, context.peer(),
                               "no token" if problem is MISSING_MESSAGE else "wrong token")
                self._logged_at, self._unlogged = now, 0
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
        return reject


def _rejecting_handler(handler: grpc.RpcMethodHandler | None,
                       behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]
                       ) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that runs `behavior` on the raw request bytes
    (no deserializer: nothing of a refused request is parsed)."""
    streams_in = bool(handler and handler.request_streaming)
    streams_out = bool(handler and handler.response_streaming)
    if streams_in and streams_out:
        return grpc.stream_stream_rpc_method_handler(behavior)
    if streams_in:
        return grpc.stream_unary_rpc_method_handler(behavior)
    if streams_out:
        return grpc.unary_stream_rpc_method_handler(behavior)
    return grpc.unary_unary_rpc_method_handler(behavior)
