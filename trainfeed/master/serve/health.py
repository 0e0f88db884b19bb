"""The master's gRPC health service, with a cap on its streams (issue 35).

`grpc.health.v1.Health` needs no token (trainfeed.master.serve.auth: Kubernetes' native gRPC probes
cannot send metadata), so anyone who reaches the port may call it. `Check` answers at once, but
each `Watch` is a stream held open until the client leaves: a stream costs the master about
20 KB (2,000 of them from one client grew it by 41 MB, measured on f44c545), and nothing capped
their number. `BoundedHealthServicer` holds at most `max_watches` at a time and answers the next
ones RESOURCE_EXHAUSTED at once, holding nothing for them.

Runs on the server's event loop only (not thread-safe, as the servicer it extends).
"""
from __future__ import annotations

import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

logger = logging.getLogger(__name__)

# Who watches: a gRPC client that turns on client-side health checking opens one Watch per
# connection; Kubernetes' probes and load balancers call Check. trainfeed's readers do neither,
# so 256 is room for a few hundred such clients, at ~5 MB held at most (~20 KB a stream).
MAX_HEALTH_WATCHES = 256
# A refusal is logged at most once per this many seconds (a flood must not flood the log).
LOG_EVERY_S = 60.0
TOO_MANY_MESSAGE = ("this master holds {max} health watches already, the most it serves at "
                    "once; call Check, or watch again once another watcher has left")


class BoundedHealthServicer(health.aio.HealthServicer):
    """The reference health servicer, serving at most `max_watches` Watch streams at once.

    `refused` counts the Watch calls answered RESOURCE_EXHAUSTED.
    """

    def __init__(self, max_watches: int = MAX_HEALTH_WATCHES):
        super().__init__()
        if max_watches < 1:
            raise ValueError(f"max health watches must be ≥ 1, got {max_watches}")
        self.max_watches = max_watches
        self.watching = 0
        self.refused = 0
        self._logged_at = float("-inf")
        self._unlogged = 0

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: Any) -> None:
        if self.watching >= self.max_watches:
            self._refuse(context)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                TOO_MANY_MESSAGE.format(max=self.max_watches))
        self.watching += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watching -= 1

    async def List(self, request: health_pb2.HealthListRequest,
                   context: Any) -> health_pb2.HealthListResponse:
        """Every service's status (the asyncio reference servicer leaves List unimplemented):
        the master's two names, nothing of its jobs; one short answer, so no bound beyond the
        server's calls in progress."""
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._server_status.items()})

    def _refuse(self, context: Any) -> None:
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning("refused %d health watch(es) past the cap of %d, the last from %s",
                           self._unlogged, self.max_watches, context.peer())
            self._logged_at, self._unlogged = now, 0
