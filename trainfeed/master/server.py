"""Running the master: the gRPC server, the health service and the lease timer."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from trainfeed.errors import LeadershipError
from trainfeed.master.service import MasterConfig, MasterServicer
from trainfeed.master.state_store import StateStore
from trainfeed.v1 import master_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = "trainfeed.v1.Master"
# Large enough for any single response we send (tasks are small); rejects abusive requests early.
MAX_MESSAGE_BYTES = 4 << 20


async def serve(config: MasterConfig, store: StateStore, host: str = "0.0.0.0", port: int = 50051,
                on_ready: Callable[[int], None] | None = None,
                stop: asyncio.Event | None = None, exit_with_parent: bool = False) -> None:
    """Serves until `stop` is set (or SIGTERM/SIGINT when run from `run_master`).

    Args:
        on_ready: called with the bound port once the server accepts calls (port 0 picks one).
        exit_with_parent: stop when the process that started this one is gone, so a master
            spawned by a demo, benchmark or test never outlives it (the kernel's parent-death
            signal is not honoured in every sandbox, so the parent is polled instead).
    """
    stop = stop or asyncio.Event()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    logger.info("taking the leadership of state %s as %s", store.url, owner)
    await asyncio.to_thread(store.acquire, owner)
    servicer = MasterServicer(config, store, on_leadership_lost=stop.set)
    await asyncio.to_thread(servicer.restore)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", 0),
    ])
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} (in use?)")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    timer = asyncio.create_task(_lease_timer(servicer, config.lease_timeout_s, stop))
    watchdog = asyncio.create_task(_watch_parent(os.getppid(), stop)) if exit_with_parent else None
    logger.info("master serving on %s:%d, storage %s", host, bound, config.storage.url)
    if on_ready:
        on_ready(bound)
    lost = False
    try:
        await stop.wait()
        lost = servicer.leadership_lost or not store.leading()
    finally:
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        timer.cancel()
        if watchdog is not None:
            watchdog.cancel()
        await server.stop(grace=1.0)
        store.close()
    if lost:  # exit non-zero: a supervisor restarts this master as a standby
        raise LeadershipError(f"this master lost the leadership of state {store.url}; another "
                              f"master may serve it now")


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


def run_master(config: MasterConfig, store: StateStore, host: str = "0.0.0.0",
               port: int = 50051, on_ready: Callable[[int], None] | None = None,
               exit_with_parent: bool = False) -> None:
    """Blocks serving until SIGTERM or SIGINT, then stops gracefully."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, store, host, port, on_ready, stop, exit_with_parent)
    asyncio.run(main())
