"""A job's progress as its master tells it: counts, rate and a progress bar for `trainfeed status`.

The master's JobStatus is a snapshot (epoch, partitions todo/pending/done/failed, workers); a rate
needs two of them. Partitions finished so far count across epochs (epoch × partitions + done +
failed), so a sample pair that straddles an epoch's end still gives the right rate; records/s
comes from the master's count of records served (of partitions reported done).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from trainfeed.v1 import master_pb2 as pb

# How many failed partitions' reasons to print; the rest are counted.
MAX_REASONS = 5
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} partitions [{remaining} left]"
BAR_COLUMNS = 72


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic() when the answer came
    status: pb.JobStatus

    @property
    def finished(self) -> int:
        """Partitions finished (done or given up) since the job began, over all epochs."""
        s = self.status
        return s.epoch * s.num_partitions + s.done + s.failed


def partition_rate(first: Sample, second: Sample) -> float:
    """Partitions finished per second between two samples (0 if no time passed)."""
    return _rate(first, second, second.finished - first.finished)


def record_rate(first: Sample, second: Sample) -> float:
    """Records served per second between two samples (0 if no time passed, or if the master
    restarted in between and its count began again)."""
    return _rate(first, second, second.status.records_served - first.status.records_served)


def _rate(first: Sample, second: Sample, change: float) -> float:
    elapsed = second.at - first.at
    return max(0.0, change / elapsed) if elapsed > 0 else 0.0


def sample_twice(job_status: Callable[[], pb.JobStatus], interval_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[Sample, Sample]:
    """Two samples `interval_s` apart (measured from the answers, not the requests)."""
    first = Sample(time.monotonic(), job_status())
    sleep(interval_s)
    return first, Sample(time.monotonic(), job_status())


def render(status: pb.JobStatus, partitions_per_s: float, records_per_s: float) -> list[str]:
    """The lines `trainfeed status` prints about the master's view of the job."""
    s = status
    rate = f"{partitions_per_s:.2f} partitions/s · {records_per_s:,.0f} records/s"
    lines = [
        f"job         {s.job} (dataset {s.dataset})",
        f"epoch       {s.epoch}",
        f"partitions  todo {s.todo} · pending {s.pending} · done {s.done} · failed {s.failed}"
        f"  (of {s.num_partitions})",
        f"workers     {s.workers}",
        f"rate        {rate}",
        tqdm.format_meter(s.done + s.failed, max(1, s.num_partitions), 0, ncols=BAR_COLUMNS,
                          prefix=f"epoch {s.epoch}", rate=partitions_per_s or None,
                          bar_format=BAR_FORMAT),
    ]
    for reason in list(s.failed_reasons)[:MAX_REASONS]:
        lines.append(f"failed      {reason}")
    if len(s.failed_reasons) > MAX_REASONS:
        lines.append(f"failed      … and {len(s.failed_reasons) - MAX_REASONS} more")
    return lines
