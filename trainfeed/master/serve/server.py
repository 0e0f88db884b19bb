"""Running the master: the gRPC server (with its token check, TLS, size and connection limits), the
health service, the metrics endpoint, the lease timer and the watch for newer dataset versions."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from trainfeed.errors import ConfigurationError, LeadershipError
from trainfeed.master.serve import status
from trainfeed.master.serve.auth import TokenInterceptor
from trainfeed.master.serve.decoder_scaling_loop import scale_decoders
from trainfeed.master.serve.health import BoundedHealthServicer
from trainfeed.master.serve.metrics import MasterCollector, MetricsServer, RpcLatencyInterceptor
from trainfeed.master.serve.service import MasterConfig, MasterServicer
from trainfeed.master.serve.status_page import Access, StatusApp
from trainfeed.master.serve.version_watch import VersionWatch, pinned, watch_versions
from trainfeed.master.stores import StateStore
from trainfeed.security import ServerTLS, check_token
from trainfeed.v1 import master_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = "trainfeed.v1.Master"
# Large enough for any single message we send or expect (tasks are small; an OpenJob answer
# lists a dataset's fields); rejects abusive requests before they are parsed.
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
# Below this a legitimate OpenJob answer (a dataset with very many fields) might not fit.
MIN_MESSAGE_BYTES = 64 << 10
# Connections the gRPC server holds at once; one more is closed as soon as it is accepted. A
# reader process holds one (its MasterClient's channel): 4,096 is --max-sessions' default, e.g.
# 512 trainers with 8 loader processes each. An idle connection costs the master ~16 KB (400 of
# them: +6 MB, measured), so the cap bounds what connections alone can take to ~64 MB.
DEFAULT_MAX_CONNECTIONS = 4096
# gRPC's channel arguments are C ints.
GRPC_INT_MAX = (1 << 31) - 1
# Concurrent streams (calls) per connection. RFC 9113 §6.5.2 advises no fewer than 100; a reader
# uses 2 or 3 (its Session stream, a Watch, one call), and a client past the cap waits for a slot
# rather than failing. Bounds what one connection holds to 128 calls of ~20 KB.
MAX_STREAMS_PER_CONNECTION = 128
# Calls in progress on the whole server, past which a call is answered RESOURCE_EXHAUSTED (which
# readers retry). A call with no token, or one whose request never comes, still holds a slot
# until it ends, so this is the bound on what held calls take: 4,096 readers × 3 calls plus room,
# at ~20 KB a held stream (2,000 health watches: +41 MB, measured) at most ~330 MB.
MAX_CALLS_IN_PROGRESS = 16_384
# A connection with no call for this long is closed (HTTP/2 GOAWAY); its client reconnects on its
# next call. A reading reader calls at least every lease_timeout/3 (10 s by default) or holds its
# Session stream, so only idle or abandoned connections reach 5 minutes.
MAX_CONNECTION_IDLE_MS = 5 * 60_000
# From accepting a connection to its HTTP/2 settings, TLS included: gRPC's default is 120 s, which
# lets a client that sends nothing hold a connection that long. A real handshake takes ms.
HANDSHAKE_TIMEOUT_MS = 20_000
# The master pings a connection with calls in progress every 60 s and closes it if no answer
# comes within 20 s, so a vanished reader's streams end within ~80 s, not at TCP's ~15 minutes.
KEEPALIVE_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
# Pings a client may send: one per 30 s without data (readers send none; gRPC's own default is
# 5 minutes, too strict for clients that keep their connection alive); a client that pings more
# often is told GOAWAY after MAX_PING_STRIKES (gRPC's default), and none without a call.
MIN_CLIENT_PING_INTERVAL_MS = 30_000
MAX_PING_STRIKES = 2
# Not set: a maximum connection age. Readers hold their Session stream for the life of their
# job; an age would cut it, and a client cut off simply reconnects, so an age bounds nothing.
# The port Prometheus' own examples give their first exporter.
DEFAULT_METRICS_PORT = 9090
# A scrape waits this long for the event loop to read the jobs' figures.
SCRAPE_TIMEOUT_S = 5.0
T = TypeVar("T")


@dataclass(frozen=True)
class ServerOptions:
    """How the master listens. Validated on creation.

    `token` None runs without authentication (`--insecure`); `tls` None serves plaintext;
    `metrics_port` None exports no metrics, 0 picks a free port.
    """

    host: str = "0.0.0.0"
    port: int = 50051
    token: str | None = None
    tls: ServerTLS | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    metrics_port: int | None = DEFAULT_METRICS_PORT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Jobs whose decoders' Deployment this master scales (issue 37): `--scale-decoders JOB`.
    scale_decoders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, port in (("port", self.port), ("metrics port", self.metrics_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigurationError(f"{name} must be in 0..65535, got {port}")
        if self.max_message_bytes < MIN_MESSAGE_BYTES:
            raise ConfigurationError(f"max message bytes must be ≥ {MIN_MESSAGE_BYTES}, got "
                                     f"{self.max_message_bytes}")
        if not 1 <= self.max_connections <= GRPC_INT_MAX:
            raise ConfigurationError(f"--max-connections must be in 1..{GRPC_INT_MAX}, got "
                                     f"{self.max_connections}")
        if self.token is not None:
            check_token(self.token, "the master's token")

    @property
    def transport(self) -> str:
        """"plaintext", "TLS" or "TLS with client certificates", for logs."""
        if self.tls is None:
            return "plaintext"
        return "TLS with client certificates" if self.tls.client_ca_file else "TLS"


@dataclass(frozen=True)
class Serving:
    """Where a started master listens (what `on_ready` is given)."""

    port: int
    metrics_port: int | None


async def serve(config: MasterConfig, store: StateStore,
                options: ServerOptions = ServerOptions(),
                on_ready: Callable[[Serving], None] | None = None,
                stop: asyncio.Event | None = None, exit_with_parent: bool = False) -> None:
    """Serves until `stop` is set (or SIGTERM/SIGINT when run from `run_master`).

    Args:
        on_ready: called once the server accepts calls, with the bound ports (port 0 picks one).
        exit_with_parent: stop when the process that started this one is gone, so a master
            spawned by a demo, benchmark or test never outlives it (the kernel's parent-death
            signal is not honoured in every sandbox, so the parent is polled instead).
    """
    stop = stop or asyncio.Event()
    credentials = options.tls.credentials() if options.tls else None  # fail before waiting
    owner = f"{socket.gethostname()}:{os.getpid()}"
    logger.info("taking the leadership of state %s as %s", store.url, owner)
    await asyncio.to_thread(store.acquire, owner)
    servicer = MasterServicer(config, store, on_leadership_lost=stop.set)
    await asyncio.to_thread(servicer.restore)
    auth = TokenInterceptor(options.token) if options.token is not None else None
    servicer.job_scoped = auth is not None  # job tokens restrict their calls to their job
    registry = CollectorRegistry(auto_describe=False)
    server = _grpc_server(options, _interceptors(options, auth, servicer, registry))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    health_servicer = BoundedHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    running = _Running(servicer, server, health_servicer, VersionWatch(config.storage),
                       options.scale_decoders)
    try:
        bound = _listen(server, f"{options.host}:{options.port}", credentials)
        if options.metrics_port is not None:
            loop = asyncio.get_running_loop()
            running.metrics = MetricsServer(
                registry, options.host, options.metrics_port, wrap=lambda app: StatusApp(
                    lambda job: _on_loop(loop, lambda: status.snapshot(
                        servicer, only_job=job, versions=running.versions)),
                    Access(options.token), app, uploads=status.UploadWatch(config.storage)))
        metrics = running.metrics
        servicer.core.metrics_port = metrics.port if metrics else 0  # JobStatus says it
        await running.start(stop, exit_with_parent)
        logger.info("master serving on %s:%d (%s, %s), storage %s, metrics %s", options.host,
                    bound, options.transport, "token required" if auth else "NO authentication",
                    config.storage.url, f"on port {metrics.port}" if metrics else "off")
        if auth is None:
            logger.warning("running without a token (--insecure): anyone who can reach port %d "
                           "can read and change every job; use this for local runs only", bound)
        if on_ready:
            on_ready(Serving(bound, metrics.port if metrics else None))
        await stop.wait()
        lost = servicer.leadership_lost or not store.leading()
    finally:
        await running.stop()
    if lost:  # exit non-zero: a supervisor restarts this master as a standby
        raise LeadershipError(f"this master lost the leadership of state {store.url}; another "
                              f"master may serve it now")


def _interceptors(options: ServerOptions, auth: TokenInterceptor | None,
                  servicer: MasterServicer, registry: CollectorRegistry
                  ) -> list[grpc.aio.ServerInterceptor]:
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if auth is not None:  # first: a refused call reaches nothing else
        interceptors.append(auth)
    if options.metrics_port is not None:
        latency = RpcLatencyInterceptor(registry)
        interceptors.append(latency)
        servicer.streams.on_grant = latency.grants.observe
        loop = asyncio.get_running_loop()
        registry.register(MasterCollector(
            lambda: _on_loop(loop, servicer.job_stats),
            (lambda: auth.rejected) if auth is not None else None,
            lambda: _on_loop(loop, lambda: status.reader_metrics(servicer)),
            lambda: _on_loop(loop, lambda: status.decoder_metrics(servicer))))
    return interceptors


def grpc_options(options: ServerOptions) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments: size, connection, stream and ping limits."""
    return [
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", options.max_connections),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
    ]


def _grpc_server(options: ServerOptions,
                 interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
    return grpc.aio.server(interceptors=interceptors, options=grpc_options(options),
                           maximum_concurrent_rpcs=MAX_CALLS_IN_PROGRESS)


def _listen(server: grpc.aio.Server, address: str,
            credentials: grpc.ServerCredentials | None) -> int:
    bound = (server.add_secure_port(address, credentials) if credentials
             else server.add_insecure_port(address))
    if bound == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    return bound


class _Running:
    """What a serving master runs besides the gRPC server: the journal writer, the lease timer,
    the parent watchdog, the metrics endpoint and the health status; `stop` ends them all, in
    an order that lets nothing wait on what already stopped."""

    def __init__(self, servicer: MasterServicer, server: grpc.aio.Server,
                 health_servicer: BoundedHealthServicer, versions: VersionWatch,
                 scale_decoders: tuple[str, ...] = ()):
        self.servicer, self.server, self.health = servicer, server, health_servicer
        self.versions = versions  # newer versions of the jobs' datasets (issue 38)
        self.scale_decoders = scale_decoders  # jobs whose decoders it scales (issue 37)
        self.metrics: MetricsServer | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, stop: asyncio.Event, exit_with_parent: bool) -> None:
        await self.server.start()
        self.servicer.start()
        self.servicer.grant_grace()  # restored leases live from now on, not from the restore
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.tasks.append(asyncio.create_task(
            _lease_timer(self.servicer, self.servicer.config.lease_timeout_s, stop)))
        self.tasks.append(asyncio.create_task(watch_versions(
            self.versions, lambda: pinned(self.servicer.jobs.values()), stop)))
        if exit_with_parent:
            self.tasks.append(asyncio.create_task(_watch_parent(os.getppid(), stop)))
        registry = self.servicer.streams.decoders.registry
        for job in self.scale_decoders:
            self.tasks.append(asyncio.create_task(scale_decoders(self.servicer, registry, job,
                                                                 stop)))

    async def stop(self) -> None:
        if self.metrics is not None:  # first: a scrape must not wait on a loop that is stopping
            self.metrics.close()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        for task in self.tasks:
            task.cancel()
        await self.server.stop(grace=1.0)
        await asyncio.to_thread(self.servicer.close)  # the last ops, then the writer stops
        self.servicer.store.close()


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], T]) -> T:
    """Runs `fn` on `loop` (where the servicer's state lives) from another thread; waits."""
    async def call() -> T:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), loop).result(SCRAPE_TIMEOUT_S)


async def _lease_timer(servicer: MasterServicer, lease_timeout_s: float,
                       stop: asyncio.Event) -> None:
    # Checking four times per timeout bounds how late an expiry is noticed to a quarter of it.
    period = min(1.0, lease_timeout_s / 4)
    while not stop.is_set():
        await asyncio.sleep(period)
        if not servicer.store.leading():
            logger.critical("lost the leadership of state %s (another master may serve it); "
                            "stopping", servicer.store.url)
            stop.set()
            return
        try:
            servicer.expire_leases()
        except Exception:  # the timer must outlive one bad save
            logger.exception("lease timer failed")


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            logger.warning("parent process %d is gone; stopping", parent)
            stop.set()


def run_master(config: MasterConfig, store: StateStore,
               options: ServerOptions = ServerOptions(),
               on_ready: Callable[[Serving], None] | None = None,
               exit_with_parent: bool = False) -> None:
    """Blocks serving until SIGTERM or SIGINT, then stops gracefully."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, store, options, on_ready, stop, exit_with_parent)
    asyncio.run(main())
