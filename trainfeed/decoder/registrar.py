"""A decoder's registration with the master (issue 37): `trainfeed decoder --master ADDR`.

The decoder keeps one Session stream open to the master: its first message registers the
address trainers should dial, each later one (every BEAT_S) says how busy it is. The master lists
it to the job's trainers while the stream lives (trainfeed.master.serve.decoder_streams), so
trainers find decoders without TRAINFEED_DECODERS, and the autoscaler sees their busy share.

A broken stream is reopened with backoff (full jitter, up to RETRY_MAX_S); while the master cannot
be reached the decoder goes on serving the trainers that know it, and says so (no silent waits: a
line when the stream is down for WAIT_LOG_S, then every WAIT_LOG_EVERY_S). A refusal that no retry
changes (a job token, a bad address) is logged as an error and retried slowly, so that a fixed
master configuration is picked up without restarting the decoders.

Busy share: the process's CPU time over the wall time since the last beat, divided by its decode
threads (a decoder with 4 threads using 3 cores is 0.75 busy).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from trainfeed.cores import usable_cores
from trainfeed.security import ClientSecurity
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

logger = logging.getLogger(__name__)

# Seconds between beats: well inside the master's silence timeout (trainfeed.master.core.decoders
# TIMEOUT_S, 15 s), so that a decoder that is alive is never dropped for one late beat.
BEAT_S = 2.0
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0
# After a refusal no retry changes (bad address, a job token): try again this rarely.
REFUSED_RETRY_S = 30.0
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 30.0
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)

#: () -> (slots, calls in flight): the decoder's figures for its beat.
Figures = Callable[[], tuple[int, int]]


class BusyMeter:
    """The process's busy share of `threads` cores between two reads."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self._at = (time.monotonic(), time.process_time())

    def read(self) -> float:
        wall, cpu = time.monotonic(), time.process_time()
        (wall0, cpu0), self._at = self._at, (wall, cpu)
        if wall <= wall0:
            return 0.0
        return min(1.0, max(0.0, (cpu - cpu0) / (wall - wall0) / self.threads))


class Registrar:
    """Keeps `advertise` registered with the master at `master` until `close()`.

    Args:
        master: the master's address (host:port); its token and TLS come from the environment
            (TRAINFEED_TOKEN, TRAINFEED_TLS_CA), as a reader's do.
        advertise: the address trainers dial (host:port).
        figures: the decoder's slots and calls in flight, read at each beat.
        threads: its decode threads (the busy share's cores).
        beat_s: seconds between beats.
    """

    def __init__(self, master: str, advertise: str, figures: Figures,
                 threads: int | None = None, beat_s: float = BEAT_S):
        self.master = master
        self.advertise = advertise
        self._figures = figures
        self._meter = BusyMeter(threads or usable_cores())
        self.beat_s = beat_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None  # the stream now (close() cancels it)
        self._thread = threading.Thread(target=self._run, name="trainfeed-decoder-registrar",
                                        daemon=True)
        self.registered = threading.Event()  # set while the master lists this decoder
        self.listed: list[str] = []  # the decoders the master listed at the last registration

    def start(self) -> Registrar:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stops beating and ends the stream (the master takes the decoder off its list)."""
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _beat(self) -> pb.SessionMessage:
        slots, in_flight = self._figures()
        return pb.SessionMessage(decoder=pb.DecoderBeat(
            address=self.advertise, busy=self._meter.read(), slots=slots, in_flight=in_flight))

    def _beats(self) -> Iterator[pb.SessionMessage]:
        """The stream's messages: a beat now, then every beat_s until stopped."""
        yield self._beat()
        while not self._stop.wait(self.beat_s):
            yield self._beat()

    def _run(self) -> None:
        delay = RETRY_MIN_S
        down_since = time.monotonic()
        logged_at = 0.0
        security = ClientSecurity.from_env()
        channel = security.open_channel(self.master, ())
        stub = master_pb2_grpc.MasterStub(channel)  # type: ignore[no-untyped-call]
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                problem = self._once(stub, security.metadata)
                self.registered.clear()
                if self._stop.is_set():
                    return
                if time.monotonic() - began > 2 * self.beat_s:  # it was up: start afresh
                    delay, down_since, logged_at = RETRY_MIN_S, time.monotonic(), 0.0
                wait = self._backoff(problem, delay)
                delay = min(delay * 2, RETRY_MAX_S)
                logged_at = self._log_down(problem, down_since, logged_at, wait)
                self._stop.wait(wait)
        finally:
            channel.close()

    def _once(self, stub: master_pb2_grpc.MasterStub, metadata: object
              ) -> grpc.RpcError | None:
        """One stream, until it ends: the error it ended with (None: closed by us)."""
        call = stub.Session(self._beats(), metadata=metadata)
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
        try:
            for event in call:
                if event.decoders_listed and not self.registered.is_set():
                    self.listed = [d.address for d in event.decoders]
                    self.registered.set()
                    logger.info("registered with master %s as %s (%d decoders listed)",
                                self.master, self.advertise, len(self.listed))
            return None
        except grpc.RpcError as e:
            return None if self._stop.is_set() else e

    def _backoff(self, problem: grpc.RpcError | None, delay: float) -> float:
        if problem is not None and problem.code() in _REFUSED:
            return REFUSED_RETRY_S
        return random.uniform(delay / 2, delay)

    def _log_down(self, problem: grpc.RpcError | None, down_since: float, logged_at: float,
                  wait: float) -> float:
        """Logs a refusal at once, and a master out of reach after WAIT_LOG_S (then every
        WAIT_LOG_EVERY_S); returns when it last logged."""
        now = time.monotonic()
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
        why = ("its stream ended" if problem is None
               else f"{problem.code().name}: {problem.details()}")
        if problem is not None and problem.code() in _REFUSED:
            logger.error("master %s refused decoder %s (%s); trying again at %s", self.master,
                         self.advertise, why, until)
            return now
        if now - down_since >= WAIT_LOG_S and now - logged_at >= WAIT_LOG_EVERY_S:
            logger.warning("decoder %s is not registered with master %s for %.0f s (%s): "
                           "trainers that know it are still served; next try at %s",
                           self.advertise, self.master, now - down_since, why, until)
            return now
        return logged_at
