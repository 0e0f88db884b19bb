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
- `trainfeed_workers_alive`: workers heard from within three lease timeouts;
- `trainfeed_leases_expired_total`: partitions whose lease expired (back to todo);
- `trainfeed_records_served_total`, `trainfeed_bytes_served_total`: of partitions reported done
  (bytes are the manifest's payload bytes of their rows: file bytes and UTF-8 text, not the
  Parquet bytes read; 0 for SQL datasets, whose sizes are unknown until a query runs);
- `trainfeed_reports_refused_total`: reports refused because their sender does not hold the
  partition's lease with that token (a reader that lost its lease, or a hostile call);
- `trainfeed_rpc_duration_seconds{method}` (histogram, all jobs): time in the handler, long-polls
  included; `trainfeed_rpc_unauthenticated_total` (all jobs): calls refused for their token.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trainfeed.errors import ConfigurationError
from trainfeed.master.jobs import JobStats

logger = logging.getLogger(__name__)

# From 0.5 ms (a Health/Check on loopback) to MAX_WAIT_MS-long polls and beyond.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
               10.0)
TASK_STATES = ("todo", "pending", "done", "failed")

Continuation = Callable[[grpc.HandlerCallDetails], Any]


class MasterCollector:
    """Builds the per-job metrics from `stats()` at each scrape.

    Args:
        stats: returns every job's figures; called from the HTTP server's thread, so it must be
            safe to call from there (the master's hops to its event loop).
        rejected_calls: returns how many calls the token check refused; None when the master
            runs without a token (the metric is then left out).
    """

    def __init__(self, stats: Callable[[], Sequence[JobStats]],
                 rejected_calls: Callable[[], int] | None = None):
        self._stats = stats
        self._rejected_calls = rejected_calls

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
        self.workers = GaugeMetricFamily("trainfeed_workers_alive",
                                         "Workers heard from within three lease timeouts",
                                         labels=job)
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

    def all(self) -> list[Metric]:
        families = [self.info, self.epoch, self.partitions, self.tasks, self.progress,
                    self.workers, self.expired, self.records, self.bytes, self.refused]
        return [*families, self.rejected] if self.auth else families


class RpcLatencyInterceptor(grpc.aio.ServerInterceptor):
    """Observes the handler time of every unary call in `trainfeed_rpc_duration_seconds`,
    labelled by method ("trainfeed.v1.Master/GetTasks"). Streaming calls (the health Watch)
    pass through untimed. Wrapped handlers are made once per method, not per call."""

    def __init__(self, registry: CollectorRegistry):
        self.histogram = Histogram("trainfeed_rpc_duration_seconds",
                                   "Time the master spent answering a call, by method",
                                   ["method"], registry=registry, buckets=RPC_BUCKETS)
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


class MetricsServer:
    """The HTTP endpoint (`/metrics`, any path) of one registry, on a daemon thread.
    Context manager; `close()` is idempotent and joins the thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        try:
            self._httpd: WSGIServer | None
            self._httpd, self._thread = start_http_server(port, host, registry)
        except OSError as e:
            raise ConfigurationError(f"--metrics-port {port}: cannot listen on {host}:{port} "
                                     f"({e.strerror or e}); pick another port, 0 for a free "
                                     f"one, or 'none' to export no metrics") from None
        self.port: int = self._httpd.server_port
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
