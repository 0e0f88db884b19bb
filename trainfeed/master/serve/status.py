"""A master's jobs as operators see them: the data of `/status`, `/status.json` and `trainfeed
status --watch` (issue 29), read from the servicer's state in one pass.

One JSON-able dict (`snapshot`), versioned; the page renders it, the terminal view prints it, and
tests compare it with the ledger (GetJobStatus). It names no secret: no token, no session secret
or lease token, no storage URL (which may carry credentials); worker ids and dataset names only.
Runs on the servicer's event loop (the ledgers are not thread-safe): O(jobs + readers).

The uploads of the master's storage in progress (`UploadWatch`, from the storage's uploads board,
trainfeed.ingest.board) are read off the loop, on the page's HTTP threads, at most every
UPLOADS_REFRESH_S: a page view in between costs nothing, and a slow storage never holds the
loop that serves the readers.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from trainfeed.ingest.board import Board
from trainfeed.ingest.board_summary import summarize
from trainfeed.master.core import liveness
from trainfeed.master.core.jobs import Job, JobMetrics
from trainfeed.master.core.reader_stats import HISTORY_BUCKET_S, RECENT_S
from trainfeed.master.serve.metrics import JobDecoders, JobReaders
from trainfeed.master.serve.service import MasterServicer
from trainfeed.master.serve.version_watch import Pinned, VersionWatch
from trainfeed.redaction import redact_text
from trainfeed.storage import Storage

STATUS_VERSION = 1
# Labels of a dataset's histogram shown (the most frequent); the rest are summed as "other".
MAX_LABELS = 40
# Failed partitions listed per job (the rest are counted).
MAX_FAILED = 50
# The uploads board is read at most this often (seconds): the page's own refresh period.
UPLOADS_REFRESH_S = 5.0
# ...and at most this share of the time: a board of a thousand running packers (each record
# rewritten between two looks, so each look reads them all) is read less often, not more.
UPLOADS_READ_SHARE = 0.2


def snapshot(servicer: MasterServicer, now: float | None = None,
             only_job: str | None = None, versions: VersionWatch | None = None
             ) -> dict[str, Any]:
    """Every job (or `only_job`: what a job token may see) with its readers; with `versions`,
    the newer versions of their datasets."""
    now = time.time() if now is None else now
    jobs = [job_status(servicer, job, now, versions) for name, job
            in sorted(servicer.jobs.items()) if only_job is None or name == only_job]
    # The decoders serve every job; their addresses are the cluster's, not a job's: shown to the
    # master's token only.
    listed = decoders(servicer) if only_job is None else []
    return {"version": STATUS_VERSION, "generated_at": now,
            "lease_timeout_s": servicer.config.lease_timeout_s, "recent_s": RECENT_S,
            "sparkline_step_s": HISTORY_BUCKET_S, "jobs": jobs, "decoders": listed}


def job_status(servicer: MasterServicer, job: Job, now: float,
               versions: VersionWatch | None = None) -> dict[str, Any]:
    ledger, board = job.ledger, servicer.reader_stats
    served = servicer.core.metrics.get(job.name) or JobMetrics()
    counts = ledger.counts()
    partitions = len(job.partitions)
    rate, input_bound = board.job_window(job.name, now)
    totals = board.totals(job.name)
    alive = liveness.readers_alive(job.workers, now, servicer.config.lease_timeout_s)
    left = records_left(job)
    group = _sync_group(job, now)
    return {
        "job": job.name,
        "dataset": job.manifest.name,
        "dataset_kind": job.manifest.kind,
        "num_records": job.manifest.num_records,
        "label_histogram": _labels(job.manifest.label_histogram),
        "epoch": ledger.epoch,
        "num_partitions": partitions,
        **counts,
        "progress": (counts["done"] + counts["failed"]) / max(1, partitions),
        "workers_alive": alive,
        "records_left": left,
        "eta_s": eta(left, rate),
        "state": job_state(job, group, alive),
        "records_served": served.records_served,
        "bytes_served": served.bytes_served,
        "reports_refused": served.reports_refused,
        "records_per_s": rate,
        "input_bound": input_bound,
        "input_wait_s": totals["input_wait_s"],
        "wall_s": totals["wall_s"],
        "sparkline": list(board.job_sparkline(job.name, now)),
        "sync_group": group,
        "failed_partitions": _failed(job),
        "refusals": [{**asdict(r), "ago_s": now - r.at} for r in board.refusals(job.name)],
        "readers": _readers(servicer, job, now),
        "newer_version": _newer(job, versions),
        "decoder_scaling": _decoder_scaling(servicer, job.name),
    }


def _decoder_scaling(servicer: MasterServicer, job: str) -> dict[str, object] | None:
    """The job's decoder autoscaler: its pool, bounds and last decision (issue 37), or None."""
    scaler = servicer.decoder_scalers.get(job)
    return scaler.view() if scaler is not None else None


def decoders(servicer: MasterServicer) -> list[dict[str, object]]:
    """The decoders registered with this master, the least busy first (issue 37)."""
    return [{"address": d.address, "busy": round(d.busy, 4), "slots": d.slots}
            for d in servicer.streams.decoders.registry.listing()]


def decoder_metrics(servicer: MasterServicer) -> list[JobDecoders]:
    """Every scaled job's last decision, for the Prometheus exporter."""
    return [JobDecoders(job, scaler.last) for job, scaler in servicer.decoder_scalers.items()
            if scaler.last is not None]


def records_left(job: Job) -> int:
    """Records of the current epoch not yet handed to a trainer: each partition not done or
    failed, its records to deliver (a synchronous epoch's cut applied) less its reported
    progress. O(partitions)."""
    ledger = job.ledger
    return sum(ledger.remaining(p) for p in (*ledger.todo, *ledger.pending))


def eta(left: int, records_per_s: float) -> float | None:
    """Seconds to the end of the epoch at the readers' recent rate; None with no rate (or one
    so small, or not finite, that no time follows from it: the rate comes from what readers
    report)."""
    if left == 0:
        return 0.0
    if not (math.isfinite(records_per_s) and records_per_s > 0):
        return None
    seconds = left / records_per_s
    return seconds if math.isfinite(seconds) else None


def job_state(job: Job, group: dict[str, Any] | None, alive: int) -> str:
    """"broken" (its synchronous group broke: a rank stopped inside an epoch), "finished" (its
    synchronous group finished: every rank quiet or gone between epochs; or, not synchronous,
    no reader alive and its epoch complete, or the next one not begun), "running" (a reader is
    alive), or "idle" (none is, inside an epoch: readers stopped or not yet started)."""
    if group is not None and group["broken"]:
        return "broken"
    if group is not None and group["finished"]:
        return "finished"
    if alive:
        return "running"
    ledger = job.ledger
    between = ledger.complete or (ledger.untouched and ledger.epoch > 0)
    return "finished" if between and group is None else "idle"


def _newer(job: Job, versions: VersionWatch | None) -> dict[str, Any] | None:
    if versions is None:
        return None
    pinned = Pinned(job.name, job.manifest.name, job.manifest.dataset_version)
    found = versions.newer(pinned)
    if found is None:
        return None
    return {"version": found.version, "num_records": found.num_records,
            "notice": found.notice(pinned)}


def _labels(histogram: dict[str, int]) -> dict[str, int]:
    top = sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = dict(top[:MAX_LABELS])
    rest = sum(n for _, n in top[MAX_LABELS:])
    if rest:
        shown["(other)"] = rest
    return shown


def _sync_group(job: Job, now: float) -> dict[str, Any] | None:
    members = job.members
    if job.ledger.group is not None:
        world, batch = job.ledger.group
    elif members is not None:
        world, batch = members.world_size, members.batch_size
    else:
        return None
    return {"world_size": world, "batch_size": batch,
            "ranks": ({str(r): m.worker for r, m in sorted(members.ranks.items())}
                      if members else {}),
            "broken": members.broken if members else None,
            "finished": members.finished if members and not members.broken else None}


def _failed(job: Job) -> list[dict[str, Any]]:
    """Partitions given up in the current epoch and the one before, with their reasons."""
    ledger = job.ledger
    rows = [{"epoch": ledger.epoch, "partition": p, "reason": r,
             "records": job.partitions[p].num_records} for p, r in sorted(ledger.failed.items())]
    rows += [{"epoch": ledger.epoch - 1, "partition": p, "reason": r,
              "records": job.partitions[p].num_records}
             for p, r in sorted(ledger.previous_failed.items())]
    return rows[:MAX_FAILED]


def _readers(servicer: MasterServicer, job: Job, now: float) -> list[dict[str, Any]]:
    """The job's reader sessions: those the master heard from within three lease timeouts and
    those that sent figures lately; `silent` once a lease timeout passed without a call (their
    leases are then expiring): exactly the sessions trainfeed.master.core.liveness counts silent,
    never one it counts alive."""
    timeout = servicer.config.lease_timeout_s
    views = {v.worker: v for v in servicer.reader_stats.views(job.name, now)}
    live = {w: seen for w, seen in job.workers.items()
            if seen >= now - liveness.SESSION_LEASES * timeout}
    rows = []
    for worker in sorted(set(views) | set(live)):
        view = views.get(worker)
        seen = live.get(worker)
        contact = now - seen if seen is not None else (
            view.last_contact_s if view is not None else 0.0)
        row: dict[str, Any] = asdict(view) if view is not None else {
            "worker": worker, "records_per_s": 0.0, "input_bound": 0.0,
            "read_bytes_per_s": 0.0, "records": 0, "bytes_read": 0, "decode_failures": 0,
            "decoded_per_s": 0.0, "sparkline": [], "flags": ()}
        flags = list(row["flags"])
        if contact > timeout:  # for a session still known: not liveness.is_alive
            flags.append("silent")
        if seen is None:
            flags.append("left")
        row.update(last_contact_s=contact, flags=flags, sparkline=list(row["sparkline"]),
                   leases_held=len(job.ledger.by_worker.get(worker, ())))
        rows.append(row)
    return rows


def reader_metrics(servicer: MasterServicer, now: float | None = None) -> list[JobReaders]:
    """Every job's reader figures for the Prometheus exporter (trainfeed.master.serve.metrics)."""
    now = time.time() if now is None else now
    board, timeout = servicer.reader_stats, servicer.config.lease_timeout_s
    out = []
    for name, job in servicer.jobs.items():
        _, share = board.job_window(name, now)
        flagged = board.input_bound_readers(name, now)
        silent = liveness.readers_silent(job.workers, now, timeout)
        out.append(JobReaders(name, board.totals(name), share, flagged, silent))
    return out


class UploadWatch:
    """The uploads of a storage, as `/status.json` shows them: {"uploads": [...],
    "uploads_error": None or why the board could not be read}.

    Thread-safe. Reads the board (one listing, plus the records that changed) at most every
    `refresh_s`, and at most UPLOADS_READ_SHARE of the time (a look that took 3 s waits 15 s
    for the next); while one thread reads, the others get the last answer rather than wait.
    """

    def __init__(self, storage: Storage, refresh_s: float = UPLOADS_REFRESH_S,
                 clock: Callable[[], float] = time.time):
        self._board = Board(storage)
        self._refresh_s, self._clock = refresh_s, clock
        self._lock = threading.Lock()
        self._value: dict[str, Any] | None = None
        self._at = 0.0
        self._period = refresh_s
        self._reading = False

    def __call__(self) -> dict[str, Any]:
        with self._lock:
            fresh = self._value is not None and self._clock() - self._at < self._period
            if self._value is not None and (fresh or self._reading):
                return self._value
            self._reading = True
        started = time.monotonic()
        try:
            value: dict[str, Any] = {"uploads": summarize(self._board.records(), self._clock()),
                                     "uploads_error": None}
        except Exception as e:  # a storage that cannot be read: said on the page, not raised
            value = {"uploads": [], "uploads_error": redact_text(
                f"cannot read the uploads board: {type(e).__name__}: {e}")}
        took = time.monotonic() - started
        with self._lock:
            self._value, self._at, self._reading = value, self._clock(), False
            self._period = max(self._refresh_s, took / UPLOADS_READ_SHARE)
        return value

