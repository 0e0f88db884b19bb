"""A process's progress pump (issue 28): the unanswered progress of every reader session of one
job in this process, sent together as one Session message every PUMP_S instead of one message per
session. Off by default (ENABLED): it helps only a process running many readers of one job.

Why: a progress message arriving alone costs the master ~0.35-0.40 ms of CPU (three thread
wake-ups: gRPC's event engine, its completion-queue poller, the event loop) against 40-75 µs for
the handler itself; 200 readers reading 4 s partitions send ~170 of them a second. Together in one
message they cost one wake-up chain per tick and process.

How: a session whose master takes `progress_of` (its Session stream's first event says so)
attaches its stream as a carrier; its reporter hands progress that needs no answer to the pump
(`put`) PUMP_S before it would have sent it itself (so progress still reaches the master at most
PROGRESS_INTERVAL_S after it was noted: the crash bound of tests/integration/test_multiprocess.py
holds). The pump's thread sends what it holds PUMP_S after the first entry came, on any attached
carrier, each entry naming its session with its secret (the master checks each). Progress that
rode a carrier whose stream then broke may be lost: every session whose progress it carried is
told (`on_lost`), and sends all its progress again (the master keeps the largest count). Answered
messages (reports, heartbeats) never go through the pump.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from trainfeed.v1 import master_pb2 as pb

__all__ = ["ENABLED", "PUMP_S", "ProgressPump", "messages_sent", "pump_for"]

# How long the pump gathers entries after the first one came before it sends them.
PUMP_S = 0.1
# Off by default: in a real fleet each reader is its own process (one rank, one pod), and a pump
# has one session to carry; its gain in benchmarks/real_readers.py (100 readers per process)
# measured the harness. A process running several readers of one job may switch it on.
ENABLED = False


class Carrier(Protocol):
    """A Session stream the pump may send on (trainfeed.lease.client.SessionStream)."""

    def send(self, message: pb.SessionMessage) -> None: ...


class ProgressPump:
    """The pump of one (master address, job) in this process. Thread-safe."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition()
        self._entries: list[tuple[pb.ReportRequest, Callable[[], None]]] = []
        self._carriers: dict[str, Carrier] = {}  # worker id -> its live stream
        # Carrier -> what to call if it breaks: the sessions whose progress it carried.
        self._riders: dict[Carrier, dict[str, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self.messages = 0  # messages sent (for tests and benchmarks)

    def attach(self, worker: str, carrier: Carrier) -> None:
        """`worker`'s stream is up, to a master that takes `progress_of`."""
        with self._cond:
            self._carriers[worker] = carrier

    def detach(self, worker: str, carrier: Carrier) -> None:
        """`worker`'s stream ended: progress it carried may be lost, and its riders are told."""
        with self._cond:
            if self._carriers.get(worker) is carrier:
                del self._carriers[worker]
            lost = self._riders.pop(carrier, {})
        for on_lost in lost.values():
            on_lost()

    def put(self, request: pb.ReportRequest, on_lost: Callable[[], None]) -> bool:
        """Queues unanswered progress of the session `request.worker_id` names (with its
        secret); `on_lost` is called if the stream it rides breaks. Returns False, queuing
        nothing, when no carrier is attached (the caller sends it itself)."""
        with self._cond:
            if not self._carriers:
                return False
            self._entries.append((request, on_lost))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"trainfeed-progress-pump-{self.name}")
                self._thread.start()
            self._cond.notify_all()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: bool(self._entries), timeout=5.0):
                    self._thread = None  # idle: a later put starts another
                    return
            time.sleep(PUMP_S)
            with self._cond:
                entries, self._entries = self._entries, []
                carrier = next(iter(self._carriers.values()), None)
                if carrier is not None:
                    riders = self._riders.setdefault(carrier, {})
                    for request, on_lost in entries:
                        riders[request.worker_id] = on_lost
            if carrier is None:  # every stream went meanwhile: the sessions send it again
                for _, on_lost in entries:
                    on_lost()
                continue
            carrier.send(pb.SessionMessage(progress_of=[request for request, _ in entries]))
            self.messages += 1


_pumps: dict[tuple[str, str], ProgressPump] = {}
_pumps_lock = threading.Lock()


def pump_for(address: str, job: str) -> ProgressPump:
    """This process's pump for `job` on the master at `address`."""
    with _pumps_lock:
        pump = _pumps.get((address, job))
        if pump is None:
            pump = _pumps[(address, job)] = ProgressPump(job)
        return pump


def messages_sent() -> int:
    """Messages every pump of this process sent so far (for benchmarks)."""
    with _pumps_lock:
        return sum(pump.messages for pump in _pumps.values())
