"""Prometheus metrics of the master, served over HTTP (`trainfeed master --metrics-port`).

The master answers thousands of task round trips per second (benchmarks/master_load.py), so
the hot path pays for one histogram observation per call and nothing else: every other figure
(tasks by state, workers alive, epochs, leases expired, records and bytes served) is read from
the servicer's own state when Prometheus scrapes, by a custom collector. Each master has its own
CollectorRegistry, so several masters in one process (tests) never share a metric.

Exported (per job unless said otherwise):
- `trainfeed_job_info{job,dataset}` 1; `trainfeed_epoch`, `trainfeed_partitions`;
- `trainfeed_tasks{state=todo|pending|done|failed}`: partitions of the current epoch;
- `trainfeed_epoch_progress`: (done + failed) / partitions of the current epoch, 0..1;
- `trainfeed_workers_alive`: reader sessions alive (heard from within a lease timeout, not
  left): trainfeed.master.core.liveness, the one definition the status page shows too;
- `trainfeed_leases_expired_total`: partitions whose lease expired (back to todo);
- `trainfeed_records_served_total`, `trainfeed_bytes_served_total`: of partitions reported done
  (bytes are the manifest's payload bytes of their rows: file bytes and UTF-8 text, not the
  Parquet bytes read; 0 for SQL datasets, whose sizes are unknown until a query runs);
- `trainfeed_reports_refused_total`: reports refused because their sender does not hold the
  partition's lease with that token (a reader that lost its lease, or a hostile call);
- `trainfeed_rpc_duration_seconds{method}` (histogram, all jobs): time in the handler, long-polls
  included; `trainfeed_rpc_unauthenticated_total` (all jobs): calls refused for their token;
- `trainfeed_lease_grant_duration_seconds` (histogram, all jobs): `get_tasks` messages of the
  Session streams that asked not to long-poll (`wait_ms` 0, what a reader sends but at an epoch's
  tail): the master's own latency in granting leases, durability included, with no wait for
  others' partitions in it (observed by trainfeed.master.serve.streams).

What the readers measured (issue 29; trainfeed.reader.meter), summed over a job's readers
since this master started, sent with their calls:
- `trainfeed_reader_wall_seconds_total`, `trainfeed_reader_input_wait_seconds_total`: the
  input-bound share over a window is `rate(wait) / rate(wall)`;
- `trainfeed_reader_batches_total`, `trainfeed_reader_records_total` (handed to trainers),
  `trainfeed_reader_bytes_read_total`, `trainfeed_reader_read_seconds_total`,
  `trainfeed_reader_records_decoded_total`, `trainfeed_reader_decode_seconds_total`,
  `trainfeed_reader_decode_failures_total`;
- `trainfeed_job_input_bound` (gauge 0..1): the share over the readers' last 30 s;
  `trainfeed_readers_input_bound`: readers whose share is over half; `trainfeed_readers_silent`:
  reader sessions not heard from for a lease timeout (their leases expire), within three
  (trainfeed.master.core.liveness): a session is alive or silent, never both.

The decoders' autoscaler (issue 37; trainfeed.master.serve.decoder_autoscaler), per job whose
decoders the master scales: `trainfeed_decoders` (the size it last set or found),
`trainfeed_decoders_busy` (their mean busy share, 0..1) and
`trainfeed_decoders_scaling{job,action,reason}` 1 for its last decision (action up, down or
hold; reason one of trainfeed.master.core.decoder_scaling.REASONS, the status page has the
sentence).
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import waitress.server
import waitress.wasyncore
from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainfeed.errors import ConfigurationError
from trainfeed.master.core.decoder_scaling import Decision
from trainfeed.master.core.jobs import JobStats
from trainfeed.master.core.reader_stats import FIELDS
from trainfeed.master.serve.status_page import MAX_FORM_BYTES

logger = logging.getLogger(__name__)

# From 0.5 ms (a Health/Check on loopback) to MAX_WAIT_MS-long polls and beyond.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
               10.0)
TASK_STATES = ("todo", "pending", "done", "failed")

Continuation = Callable[[grpc.HandlerCallDetails], Any]
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
# The help of each reader figure's counter (pb.ReaderStats' fields): trainfeed_reader_<name>.
READER_COUNTERS = {
    "wall_s": ("wall_seconds", "Wall time the readers' summaries cover, since their trainers' "
                               "first ask for data"),
    "input_wait_s": ("input_wait_seconds", "Time trainers spent blocked waiting for their "
                                           "next batch"),
    "batches": ("batches", "Batches handed to trainers"),
    "records": ("records", "Records handed to trainers"),
    "bytes_read": ("bytes_read", "Payload bytes readers read from storage"),
    "read_s": ("read_seconds", "Time readers spent loading partitions (summed over each "
                            "reader's load threads)"),
    "records_decoded": ("records_decoded", "Records readers decoded"),
    "decode_s": ("decode_seconds", "Time readers spent decoding"),
    "decode_failures": ("decode_failures", "Records dropped because they could not be decoded"),
}


@dataclass(frozen=True)
class JobReaders:
    """One job's reader figures for the exporter (trainfeed.master.serve.status.reader_metrics)."""

    job: str
    totals: dict[str, float]  # pb.ReaderStats field -> sum over the job's readers
    input_bound: float  # the job's share over its readers' last 30 s
    readers_input_bound: int
    readers_silent: int


@dataclass(frozen=True)
class JobDecoders:
    """One job's last decoder scaling decision, for the exporter."""

    job: str
    decision: Decision


class MasterCollector:
    """Builds the per-job metrics from `stats()` at each scrape.

    Args:
        stats: returns every job's figures; called from the HTTP server's thread, so it must be
            safe to call from there (the master's hops to its event loop).
        rejected_calls: returns how many calls the token check refused; None when the master
            runs without a token (the metric is then left out).
    """

    def __init__(self, stats: Callable[[], Sequence[JobStats]],
                 rejected_calls: Callable[[], int] | None = None,
                 readers: Callable[[], Sequence[JobReaders]] | None = None,
                 decoders: Callable[[], Sequence[JobDecoders]] | None = None):
        self._stats = stats
        self._rejected_calls = rejected_calls
        self._readers = readers
        self._decoders = decoders

    def describe(self) -> Iterator[Metric]:
        # Without this the registry would call collect() (and so the master) when registering.
        yield from _Families(auth=self._rejected_calls is not None).all()

    def collect(self) -> Iterator[Metric]:
        f = _Families(auth=self._rejected_calls is not None)
        for s in self._stats():
            job = [s.job]
            f.info.add_metric([s.job, s.dataset], 1)
            f.epoch.add_metric(job, s.epoch)
            f.partitions.add_metric(job, s.num_partitions)
            for state in TASK_STATES:
                f.tasks.add_metric([s.job, state], getattr(s, state))
            f.progress.add_metric(job, (s.done + s.failed) / max(1, s.num_partitions))
            f.workers.add_metric(job, s.workers_alive)
            f.expired.add_metric(job, s.leases_expired)
            f.records.add_metric(job, s.records_served)
            f.bytes.add_metric(job, s.bytes_served)
            f.refused.add_metric(job, s.reports_refused)
        if self._rejected_calls is not None:
            f.rejected.add_metric([], self._rejected_calls())
        for r in self._readers() if self._readers is not None else ():
            for name in FIELDS:
                f.reader[name].add_metric([r.job], r.totals.get(name, 0))
            f.input_bound.add_metric([r.job], r.input_bound)
            f.readers_input_bound.add_metric([r.job], r.readers_input_bound)
            f.readers_silent.add_metric([r.job], r.readers_silent)
        for d in self._decoders() if self._decoders is not None else ():
            f.decoders.add_metric([d.job], d.decision.replicas)
            f.decoders_busy.add_metric([d.job], d.decision.busy)
            f.decoders_scaling.add_metric([d.job, d.decision.action, d.decision.reason], 1)
        yield from f.all()


class _Families:
    """One scrape's metric families, empty until the collector adds samples."""

    def __init__(self, auth: bool):
        job = ["job"]
        self.auth = auth
        self.info = GaugeMetricFamily("trainfeed_job_info",
                                      "A job and the dataset it reads (always 1)",
                                      labels=["job", "dataset"])
        self.epoch = GaugeMetricFamily("trainfeed_epoch", "The job's current epoch", labels=job)
        self.partitions = GaugeMetricFamily("trainfeed_partitions", "Partitions per epoch",
                                            labels=job)
        self.tasks = GaugeMetricFamily("trainfeed_tasks",
                                       "Partitions of the current epoch by state",
                                       labels=["job", "state"])
        self.progress = GaugeMetricFamily(
            "trainfeed_epoch_progress", "Share of the current epoch's partitions done or failed",
            labels=job)
        self.workers = GaugeMetricFamily(
            "trainfeed_workers_alive", "Reader sessions heard from within a lease timeout that "
            "did not leave (the status page's readers alive)", labels=job)
        self.expired = CounterMetricFamily("trainfeed_leases_expired",
                                           "Partitions whose lease expired (back to todo)",
                                           labels=job)
        self.records = CounterMetricFamily("trainfeed_records_served",
                                           "Records of partitions reported done", labels=job)
        self.bytes = CounterMetricFamily(
            "trainfeed_bytes_served", "Payload bytes (manifest figures) of partitions reported "
            "done", labels=job)
        self.refused = CounterMetricFamily(
            "trainfeed_reports_refused", "Reports refused: not from the partition's lease holder "
            "with its token", labels=job)
        self.rejected = CounterMetricFamily("trainfeed_rpc_unauthenticated",
                                            "Calls refused for a missing or wrong token")
        self.reader = {name: CounterMetricFamily(f"trainfeed_reader_{metric}", help_, labels=job)
                       for name, (metric, help_) in READER_COUNTERS.items()}
        self.input_bound = GaugeMetricFamily(
            "trainfeed_job_input_bound", "Share of the readers' last 30 s their trainers "
            "waited for data", labels=job)
        self.readers_input_bound = GaugeMetricFamily(
            "trainfeed_readers_input_bound", "Readers whose trainer waited for data over half "
            "of their last 30 s", labels=job)
        self.readers_silent = GaugeMetricFamily(
            "trainfeed_readers_silent", "Reader sessions not heard from for a lease timeout",
            labels=job)
        self.decoders = GaugeMetricFamily(
            "trainfeed_decoders", "Decode workers of the job's pool, as its autoscaler last "
            "set or found them", labels=job)
        self.decoders_busy = GaugeMetricFamily(
            "trainfeed_decoders_busy", "Mean share of their time the job's decoders were busy, "
            "at the autoscaler's last decision", labels=job)
        self.decoders_scaling = GaugeMetricFamily(
            "trainfeed_decoders_scaling", "The autoscaler's last decision (1): its action "
            "(up, down, hold) and reason", labels=["job", "action", "reason"])

    def all(self) -> list[Metric]:
        families = [self.info, self.epoch, self.partitions, self.tasks, self.progress,
                    self.workers, self.expired, self.records, self.bytes, self.refused,
                    *self.reader.values(), self.input_bound, self.readers_input_bound,
                    self.readers_silent, self.decoders, self.decoders_busy,
                    self.decoders_scaling]
        return [*families, self.rejected] if self.auth else families


class RpcLatencyInterceptor(grpc.aio.ServerInterceptor):
    """Observes the handler time of every unary call in `trainfeed_rpc_duration_seconds`,
    labelled by method ("trainfeed.v1.Master/OpenJob"). Streaming calls (Session, the health
    Watch) pass through untimed; `grants` times a Session stream's grants (streams.Streams).
    Wrapped handlers are made once per method, not per call."""

    def __init__(self, registry: CollectorRegistry):
        self.histogram = Histogram("trainfeed_rpc_duration_seconds",
                                   "Time the master spent answering a call, by method",
                                   ["method"], registry=registry, buckets=RPC_BUCKETS)
        self.grants = Histogram("trainfeed_lease_grant_duration_seconds",
                                "Time the master spent answering get_tasks messages that asked "
                                "not to long-poll (wait_ms 0)", registry=registry,
                                buckets=RPC_BUCKETS)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails
                                ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._timed(handler, method.lstrip("/")))
            self._wrapped[method] = cached
        return cached[1]

    def _timed(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        behavior = handler.unary_unary
        observe = self.histogram.labels(method).observe

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                return await behavior(request, context)
            finally:
                observe(time.perf_counter() - started)
        return grpc.unary_unary_rpc_method_handler(
            timed, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


# The HTTP server's bounds (issue 35): it faces anyone who can reach the port, before any token
# is checked, so what one client can hold is capped here, in the server (waitress), not by care in
# the app. Worst case held: MAX_CONNECTIONS x (MAX_HEADER_BYTES + MAX_BODY_BYTES + a read
# buffer of 8 KiB + one answer): about 2 MB, whatever the clients send.
# The largest request body read (the status page's login form; every other path takes none):
# a longer announced length gets 413 before a byte of the body is read, a negative or non-digit
# one 400.
MAX_BODY_BYTES = MAX_FORM_BYTES
# The request line and headers together (a bearer token and a session cookie need well under
# 1 KiB; nginx's default is 8 KiB per line): past this, 431 and the connection closed.
MAX_HEADER_BYTES = 16 * 1024
# A connection that sends nothing (no request, or a request's body that stops coming) for this
# long is closed; Prometheus scrapes every 15 s by default and opens a new connection if needed.
IDLE_TIMEOUT_S = 10
# How often idle connections are looked for: they are closed between IDLE_TIMEOUT_S and
# IDLE_TIMEOUT_S + IDLE_CHECK_S after their last byte.
IDLE_CHECK_S = 2
# Open connections at most (Prometheus, a few browsers and `status --watch` use a handful);
# past it the server stops accepting and new ones wait in the kernel's listen queue (no thread
# and no buffer each) until one closes.
MAX_CONNECTIONS = 64
# Connections waiting in the kernel's queue past MAX_CONNECTIONS (the kernel refuses more).
LISTEN_BACKLOG = 128
# Threads that run the app (one request each; a page render hops to the master's loop). Reading
# and writing sockets is done by one more thread for every connection together.
THREADS = 4


class MetricsServer:
    """The HTTP endpoint of one registry (`/metrics`, any path), served by waitress on daemon
    threads with the bounds above; with `wrap`, the app it returns around the exporter's (the
    status page: trainfeed.master.serve.status_page). Context manager; `close()` is idempotent and
    joins the threads."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int,
                 wrap: Callable[[WsgiApp], WsgiApp] | None = None):
        app = make_wsgi_app(registry)
        try:
            sock = _listening_socket(host, port)
        except OSError as e:
            raise ConfigurationError(f"--metrics-port {port}: cannot listen on {host}:{port} "
                                     f"({e.strerror or e}); pick another port, 0 for a free "
                                     f"one, or 'none' to export no metrics") from None
        self.port: int = sock.getsockname()[1]
        self._server: Any = waitress.server.create_server(
            wrap(app) if wrap else app, sockets=[sock], threads=THREADS,
            max_request_body_size=MAX_BODY_BYTES, max_request_header_size=MAX_HEADER_BYTES,
            channel_timeout=IDLE_TIMEOUT_S, cleanup_interval=IDLE_CHECK_S,
            connection_limit=MAX_CONNECTIONS, backlog=LISTEN_BACKLOG, ident="trainfeed",
            expose_tracebacks=False, clear_untrusted_proxy_headers=True)
        self._thread: threading.Thread | None = threading.Thread(
            target=self._server.run, daemon=True, name="trainfeed-metrics")
        self._thread.start()
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        server = self._server
        # The socket loop closes its own sockets (waitress's dispatchers are not thread-safe),
        # then ends as its map is empty; the app threads are joined after.
        server.trigger.pull_trigger(lambda: waitress.wasyncore.close_all(server._map))
        thread.join(5)
        server.task_dispatcher.shutdown(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (IPv4 or IPv6, as `host` resolves), not yet listening:
    bound here so that a busy port is a ConfigurationError, with its first address only (so
    port 0 gives one port)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
