"""Raw read throughput: how fast trainfeed hands a trainer undecoded records.

What it measures: records/s and MB/s (1 MB = 1e6 bytes of JPEG payload) of one epoch of a dataset
of small JPEGs, with no decoding, through

1. a plain Python loop over the `.list` file (open each path, read its bytes): the baseline that
   every trainfeed path must beat, measured in the same run;
2. the local reader, `dist.reader(name, source=LocalSource(...))`, both as tuples
   (`for img, label in reader()`) and through the column fast path (`reader.column_batches(n)`);
3. `dist.reader(name, source=MasterSource(address, job))` in 1 and 2 worker processes sharing
   one job on one master (column path). Aggregate rate = all records / the wall time from the
   moment every worker was told to start (a start barrier: workers are spawned, imported and
   connected first, then wait for a line on stdin) to the moment the last one finished.
   Per-process rate = a worker's records / its own seconds, comparable with the local reader's
   in-process rate.

Why: decoding costs ~200 µs/image on the project machine, so the read path must cost a small
fraction of that and must not be where the master/worker split loses time. The target is that the
distributed path delivers raw records at ≥ 90 % of the local reader's rate per process and that
both beat the plain file loop.

Method: each measurement does one untimed warm-up repetition, then `--repeat` timed ones and
reports the median. A repetition builds a fresh reader (for the distributed path: a new job),
connects it (reads the manifest / OpenJob, untimed), then times its first pass and, on the same
reader object, its second pass (the steady state: threads, channels and open shards reused).
Every pass is checked to deliver exactly the dataset's records and bytes. `--cold` evicts the
JPEGs and the shard files from the page cache (posix_fadvise DONTNEED) before every timed pass.

Run from the repository root (generates and uploads the dataset on first use):

    python benchmarks/read_throughput.py                 # warm, 3 passes
    python benchmarks/read_throughput.py --cold --repeat 5
"""
from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

import make_dataset
from proc_stats import process_cpu_s
from stop_cleanly import exit_cleanly_on_signals

import trainfeed
from trainfeed import LocalSource, MasterSource, dist
from trainfeed.formats.manifest import dataset_storage, read_manifest
from trainfeed.planning.partitions import plan_partitions
from trainfeed.reader.reader import Reader
from trainfeed.storage import open_storage

if TYPE_CHECKING:
    from typing import Self  # Python ≥ 3.11; annotations are not evaluated at run time

# Generated data and results live in the system's temporary folder, never in the repository.
DEFAULT_ROOT = os.path.join(tempfile.gettempdir(), "trainfeed-bench")
DEFAULT_DATA = f"{DEFAULT_ROOT}/data"
DEFAULT_STORAGE = f"{DEFAULT_ROOT}/storage"
DEFAULT_JSON = f"{DEFAULT_ROOT}/read_throughput.json"
DEFAULT_DATASET = "bench-images"
LIST_NAME = "train_data.list"
MB = 1e6
# The target of the "end-to-end data path" issue: per-process rate of the distributed reader
# relative to the local reader's.
DIST_TARGET = 0.90
METHODS = ("plain", "local-tuples", "local-columns", "dist")

Evict = Callable[[], None]


# -- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassResult:
    """One timed pass (one epoch)."""

    records: int
    bytes: int
    seconds: float
    cpu_s: float  # CPU time of every process involved (for the distributed path: workers+master)
    per_process: tuple[dict[str, Any], ...] = ()  # the workers' own reports (distributed only)

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def per_process_rate(self) -> float:
        """Mean over workers of records / own seconds; the in-process rate otherwise."""
        if not self.per_process:
            return self.rate
        return statistics.mean(w["records"] / w["seconds"] for w in self.per_process)


@dataclass
class Measurement:
    """One table row: a method at one epoch of a fresh reader, over the timed passes."""

    method: str
    variant: str
    epoch: int  # 1 = first pass of a fresh reader, 2 = second pass of the same reader
    processes: int
    passes: list[PassResult] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(p.rate for p in self.passes)

    @property
    def mb_per_s(self) -> float:
        return statistics.median(p.bytes / p.seconds / MB for p in self.passes)

    @property
    def per_process_rate(self) -> float:
        return statistics.median(p.per_process_rate for p in self.passes)

    @property
    def cpu_us_per_record(self) -> float:
        return statistics.median(p.cpu_s / p.records * 1e6 for p in self.passes)

    @property
    def label(self) -> str:
        return f"{self.method} ({self.variant})" if self.variant else self.method


# -- dataset -----------------------------------------------------------------------------------
def ensure_dataset(data_dir: str) -> str:
    """Generates the JPEGs (benchmarks/make_dataset.py) unless DIR/train_data.list exists."""
    return make_dataset.ensure_dataset(data_dir)


def repeated_list(list_path: str, times: int) -> str:
    """A list beside `list_path` naming its files `times` times over (same folder, so the
    relative paths hold): a longer epoch without more files."""
    out = os.path.join(os.path.dirname(list_path), f"train_data_x{times}.list")
    with open(list_path, encoding="utf-8") as f:
        text = f.read()
    with open(out, "w", encoding="utf-8") as f:
        f.write(text * times)
    return out


def list_paths(list_path: str) -> list[str]:
    """The file of each line of a `.list` (relative paths are relative to its folder)."""
    base = os.path.dirname(os.path.abspath(list_path))
    with open(list_path, encoding="utf-8") as f:
        return [os.path.join(base, line.split("\t", 1)[0]) for line in f if line.strip()]


def shard_paths(storage: str, dataset: str) -> list[str]:
    store = open_storage(storage)
    folder = dataset_storage(store, dataset)
    return [folder.path(s.path) for s in read_manifest(store, dataset).shards]


def evict_from_page_cache(paths: Sequence[str]) -> None:
    """Drops the files' clean pages from the page cache: the next read goes to the disk (or to
    the host's cache on a VM: "guest-cold"). Dirty pages are not dropped; `main` syncs first."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- in-process methods --------------------------------------------------------------------------
def _timed(body: Callable[[], tuple[int, int]]) -> PassResult:
    cpu0, t0 = time.process_time(), time.perf_counter()
    records, nbytes = body()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return PassResult(records, nbytes, seconds, cpu)


def plain_loop(paths: Sequence[str]) -> tuple[int, int]:
    """The baseline: what a trainer does without trainfeed."""
    records = nbytes = 0
    for path in paths:
        with open(path, "rb") as f:
            nbytes += len(f.read())
        records += 1
    return records, nbytes


def read_tuples(reader: Reader) -> tuple[int, int]:
    records = nbytes = 0
    for image, _label in reader():
        records += 1
        nbytes += len(image)
    return records, nbytes


def read_columns(reader: Reader, batch_size: int) -> tuple[int, int]:
    records = nbytes = 0
    name = reader.field_names[0]  # the file bytes (`image`)
    for batch in reader.column_batches(batch_size):
        images = batch[name]
        records += len(images)
        nbytes += sum(map(len, images))
    return records, nbytes


def plain_rep(paths: Sequence[str], evict: Evict) -> list[PassResult]:
    evict()
    return [_timed(lambda: plain_loop(paths))]


def local_rep(args: argparse.Namespace, columns: bool, evict: Evict) -> list[PassResult]:
    reader = dist.reader(args.dataset, source=LocalSource(args.storage,
                                                          prefetch_partitions=args.prefetch))
    try:
        _ = reader.field_names  # connects: reads the manifest (set-up, not reading)
        results = []
        for _ in range(2):
            evict()
            results.append(_timed(lambda: read_columns(reader, args.batch) if columns
                                  else read_tuples(reader)))
        return results
    finally:
        reader.close()


# -- distributed: worker processes ---------------------------------------------------------------
def worker_main(args: argparse.Namespace) -> int:
    """`--worker`: one reader process driven by JSON lines on stdin, answering on stdout.

    Requests: {"op": "open", "job": J} (build and connect a reader), {"op": "pass"} (read one
    epoch through the column path), {"op": "close"}, {"op": "exit"}. Replies carry "error" on
    failure. Timestamps are time.monotonic() (CLOCK_MONOTONIC: comparable across processes).
    """
    out = sys.stdout
    reader: Reader | None = None

    def reply(body: dict[str, Any]) -> None:
        out.write(json.dumps(body) + "\n")
        out.flush()

    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "open":
                reader = dist.reader(args.dataset, source=MasterSource(
                    args.master, request["job"], prefetch_partitions=args.prefetch))
                _ = reader.field_names  # OpenJob: connected and registered before the barrier
                reply({"ok": True})
            elif op == "pass":
                if reader is None:
                    raise RuntimeError("'pass' before 'open'")
                cpu0, start = time.process_time(), time.monotonic()
                records, nbytes = read_columns(reader, args.batch)
                end, cpu = time.monotonic(), time.process_time() - cpu0
                reply({"records": records, "bytes": nbytes, "start": start, "end": end,
                       "seconds": end - start, "cpu_s": cpu, "epoch": reader.epoch,
                       "pid": os.getpid()})
            elif op == "close":
                if reader is not None:
                    reader.close()
                reader = None
                reply({"ok": True})
            elif op == "exit":
                break
            else:
                reply({"error": f"unknown op {op!r}"})
        except Exception:  # any failure goes back to the parent, which raises it
            reply({"error": traceback.format_exc()})
    if reader is not None:
        reader.close()
    return 0


class WorkerPool:
    """`n` worker processes; `request` sends one line to all of them back to back (the start
    barrier) and collects one reply from each. Context manager: every process is ended."""

    def __init__(self, n: int, argv: Sequence[str], reply_timeout_s: float):
        self.reply_timeout_s = reply_timeout_s
        self.procs: list[subprocess.Popen[str]] = []
        self.replies: list[queue.Queue[str | None]] = []
        try:
            for _ in range(n):
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
                replies: queue.Queue[str | None] = queue.Queue()
                assert proc.stdout is not None
                threading.Thread(target=self._pump, args=(proc.stdout, replies),
                                 daemon=True).start()
                self.procs.append(proc)
                self.replies.append(replies)
            self._collect()  # every worker has imported trainfeed and is waiting
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _pump(stream: IO[str], replies: queue.Queue[str | None]) -> None:
        for line in stream:
            replies.put(line)
        replies.put(None)

    def _collect(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.reply_timeout_s
        answers = []
        for proc, replies in zip(self.procs, self.replies):
            try:
                line = replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"worker {proc.pid} did not answer within "
                                   f"{self.reply_timeout_s:g} s (--timeout)") from None
            if line is None:
                raise RuntimeError(f"worker {proc.pid} exited (code {proc.poll()}); see stderr")
            answer = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"worker {proc.pid} failed:\n{answer['error']}")
            answers.append(answer)
        return answers

    def request(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        line = json.dumps(message) + "\n"
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(line)
            proc.stdin.flush()
        return self._collect()

    def close(self) -> None:
        for proc in self.procs:
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                    proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dist_rep(pool: WorkerPool, master_pid: int, tag: str, evict: Evict) -> list[PassResult]:
    pool.request({"op": "open", "job": f"bench-{tag}-{uuid.uuid4().hex[:8]}"})
    try:
        results = []
        for _ in range(2):
            evict()
            master0 = process_cpu_s(master_pid)
            answers = pool.request({"op": "pass"})
            master_cpu = process_cpu_s(master_pid) - master0
            wall = max(a["end"] for a in answers) - min(a["start"] for a in answers)
            results.append(PassResult(
                records=sum(a["records"] for a in answers),
                bytes=sum(a["bytes"] for a in answers), seconds=wall,
                cpu_s=sum(a["cpu_s"] for a in answers) + master_cpu,
                per_process=tuple({**a, "master_cpu_s": master_cpu} for a in answers)))
        return results
    finally:
        pool.request({"op": "close"})


# -- running -------------------------------------------------------------------------------------
def measure(rows: list[Measurement], method: str, variant: str, processes: int,
            rep: Callable[[], list[PassResult]], repeat: int,
            expect: tuple[int, int] | None, timeout_s: float | None) -> list[Measurement]:
    """One warm-up repetition, then `repeat` timed ones; one row per epoch of a repetition.

    In-process methods pass `timeout_s`: a repetition that runs past it is a hang, so every
    thread's stack is dumped to stderr and the process exits (no child process exists then).
    The distributed rows pass None: WorkerPool times out each reply and cleans up instead.
    """
    def guarded() -> list[PassResult]:
        if timeout_s is None:
            return rep()
        faulthandler.dump_traceback_later(timeout_s, exit=True)
        try:
            return rep()
        finally:
            faulthandler.cancel_dump_traceback_later()

    guarded()
    per_epoch: list[Measurement] = []
    for _ in range(repeat):
        for i, result in enumerate(guarded()):
            if expect is not None and (result.records, result.bytes) != expect:
                raise RuntimeError(
                    f"{method} {variant} epoch {i + 1}: read {result.records} records / "
                    f"{result.bytes} B, the dataset has {expect[0]} / {expect[1]} B")
            if len(per_epoch) <= i:
                per_epoch.append(Measurement(method, variant, i + 1, processes))
            per_epoch[i].passes.append(result)
    for m in per_epoch:
        print(f"  {m.label:<34} epoch {m.epoch}: {m.rate:>10,.0f} records/s  "
              f"(passes: {', '.join(f'{p.rate:,.0f}' for p in m.passes)})",
              file=sys.stderr, flush=True)
    rows.extend(per_epoch)
    return per_epoch


def machine_info() -> dict[str, Any]:
    import grpc
    import pyarrow

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = None
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], check=False,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "-C", repo, "status", "--porcelain", "trainfeed"],
                                check=False, capture_output=True, text=True, timeout=10)
        dirty = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu_model": model,
            "mem_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
            "kernel": platform.release(), "python": platform.python_version(),
            "pyarrow": pyarrow.__version__, "grpcio": grpc.__version__,
            "trainfeed": trainfeed.__version__, "git_commit": commit,
            "trainfeed_tree_dirty": dirty, "loadavg_start": os.getloadavg()}


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def render_table(rows: Sequence[Measurement]) -> str:
    plain = next((m.rate for m in rows if m.method == "plain loop"), None)
    local = {m.epoch: m.per_process_rate for m in rows
             if m.method == "local reader" and m.variant == "column_batches"}
    lines = [
        ("| method | epoch | records/s | MB/s | vs plain loop | per-process records/s "
         "| per-process vs local reader | CPU µs/record | records/s, min–max of passes |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        dist_row = m.method.startswith("dist.reader")
        vs_local = (_ratio(m.per_process_rate / local[m.epoch])
                    if dist_row and m.epoch in local else "-")
        lines.append(
            f"| {m.label} | {m.epoch if m.method != 'plain loop' else '-'} | {m.rate:,.0f} "
            f"| {m.mb_per_s:,.1f} | {_ratio(m.rate / plain) if plain else '-'} "
            f"| {f'{m.per_process_rate:,.0f}' if dist_row else '-'} | {vs_local} "
            f"| {m.cpu_us_per_record:.1f} "
            f"| {min(p.rate for p in m.passes):,.0f}–{max(p.rate for p in m.passes):,.0f} |")
    return "\n".join(lines)


def targets(rows: Sequence[Measurement]) -> dict[str, Any]:
    """The issue's targets, evaluated on the medians: ≥ 90 % per process, and both beat the
    plain loop."""
    plain = next((m.rate for m in rows if m.method == "plain loop"), None)
    local = {m.epoch: m.per_process_rate for m in rows
             if m.method == "local reader" and m.variant == "column_batches"}
    out: dict[str, Any] = {"dist_per_process_vs_local_min": DIST_TARGET, "checks": []}
    for m in rows:
        if m.method.startswith("dist.reader") and m.epoch in local:
            ratio = m.per_process_rate / local[m.epoch]
            out["checks"].append({"row": m.label, "epoch": m.epoch,
                                  "per_process_vs_local": round(ratio, 3),
                                  "met": ratio >= DIST_TARGET})
        if plain and m.method != "plain loop":
            out["checks"].append({"row": m.label, "epoch": m.epoch,
                                  "vs_plain_loop": round(m.rate / plain, 3),
                                  "met": m.rate > plain})
    return out


def run(args: argparse.Namespace) -> int:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
    list_path = ensure_dataset(args.data)
    if args.list_times > 1:  # longer epochs from the same files: the list repeated
        list_path = repeated_list(list_path, args.list_times)
    uploaded = trainfeed.upload(list_path, args.dataset, args.storage, progress=False)
    paths = list_paths(list_path)
    shards = shard_paths(args.storage, args.dataset)
    store = open_storage(args.storage)
    manifest = read_manifest(store, args.dataset)
    jpeg_bytes = sum(os.path.getsize(p) for p in paths)
    expect = (len(paths), jpeg_bytes)
    if manifest.num_records != len(paths):
        raise SystemExit(f"dataset {args.dataset!r} holds {manifest.num_records} records, "
                         f"{list_path} lists {len(paths)}; re-upload with --overwrite")
    if args.cold:
        os.sync()  # freshly written files are dirty, and DONTNEED keeps dirty pages

        def evict() -> None:
            evict_from_page_cache(paths)
            evict_from_page_cache(shards)
    else:
        def evict() -> None:
            pass

    machine = machine_info()
    print(f"{len(paths):,} records, {jpeg_bytes / MB:.1f} MB of JPEG in {len(shards)} shards; "
          f"{machine['nproc']} CPUs ({machine['cpu_model']}); "
          f"{'cold' if args.cold else 'warm'}, warm-up + {args.repeat} passes",
          file=sys.stderr, flush=True)

    rows: list[Measurement] = []
    if "plain" in args.methods:
        measure(rows, "plain loop", "", 1, lambda: plain_rep(paths, evict), args.repeat, expect,
                args.timeout)
    if "local-tuples" in args.methods:
        measure(rows, "local reader", "tuples", 1, lambda: local_rep(args, False, evict),
                args.repeat, expect, args.timeout)
    if "local-columns" in args.methods:
        measure(rows, "local reader", "column_batches", 1, lambda: local_rep(args, True, evict),
                args.repeat, expect, args.timeout)
    master_log: list[str] = []
    if "dist" in args.methods:
        from trainfeed.master.serve.process import MasterProcess

        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--dataset", args.dataset,
                "--batch", str(args.batch),
                *(["--prefetch", str(args.prefetch)] if args.prefetch else [])]
        with MasterProcess(store.url) as master:
            try:
                for n in args.procs:
                    with WorkerPool(n, [*argv, "--master", master.address],
                                    args.timeout) as pool:
                        rep = functools.partial(dist_rep, pool, master.proc.pid, f"{n}w", evict)
                        measure(rows, f"dist.reader, {n} worker process{'es' * (n > 1)}",
                                "column_batches", n, rep, args.repeat, expect, None)
            finally:
                master_log = master.log[-20:]

    table = render_table(rows)
    print(table)
    machine["loadavg_end"] = os.getloadavg()
    result = {
        "benchmark": "read_throughput", "version": 1,
        "started_at": started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": [os.path.basename(sys.executable), *sys.argv],
        "machine": machine,
        "data": {"list": os.path.abspath(list_path), "records": len(paths),
                 "jpeg_bytes": jpeg_bytes, "storage": store.url, "dataset": args.dataset,
                 "shards": [{"path": s.path, "bytes": s.num_bytes, "rows": s.num_rows,
                             "row_groups": len(s.row_groups)} for s in manifest.shards],
                 "local_partitions": len(plan_partitions(manifest)),
                 "upload_already_published": uploaded.already_published},
        "settings": {"repeat": args.repeat, "warmup_repetitions": 1, "batch": args.batch,
                     "prefetch": args.prefetch, "cold": args.cold, "procs": args.procs,
                     "methods": args.methods,
                     "timing": "median over passes; a pass is one epoch; epoch 1 = first pass "
                               "of a fresh reader (connect excluded), epoch 2 = its second"},
        "results": [{"method": m.method, "variant": m.variant, "epoch": m.epoch,
                     "processes": m.processes, "records_per_s": m.rate, "mb_per_s": m.mb_per_s,
                     "per_process_records_per_s": m.per_process_rate,
                     "cpu_us_per_record": m.cpu_us_per_record,
                     "passes": [asdict(p) for p in m.passes]} for m in rows],
        "targets": targets(rows),
        "table_markdown": table,
        "master_log_tail": master_log,
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=DEFAULT_DATA,
                   help=f"dataset folder; generated if it has no {LIST_NAME} "
                        f"(default {DEFAULT_DATA})")
    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help=f"trainfeed storage folder (default {DEFAULT_STORAGE})")
    p.add_argument("--dataset", default=DEFAULT_DATASET,
                   help=f"dataset name in storage (default {DEFAULT_DATASET})")
    p.add_argument("--list-times", type=int, default=1, metavar="K",
                   help="list every generated file K times (a K x 20,000-record dataset; give "
                        "it its own --dataset name)")
    p.add_argument("--repeat", type=int, default=3,
                   help="timed repetitions after one warm-up; the median is reported (default 3)")
    p.add_argument("--batch", type=int, default=128,
                   help="column_batches batch size (default 128)")
    p.add_argument("--prefetch", type=int, default=None,
                   help="reader prefetch depth in partitions (default: trainfeed's, sized from "
                        "a 64 MiB budget)")
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2],
                   help="worker-process counts for the distributed rows (default 1 2)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="what to measure (default: all)")
    p.add_argument("--cold", action="store_true",
                   help="evict the JPEGs and shard files from the page cache before every "
                        "timed pass")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a repetition taking longer is reported as a hang: stacks are dumped "
                        "and the run exits (default 300)")
    p.add_argument("--json", default=DEFAULT_JSON,
                   help=f"where to write the results (default {DEFAULT_JSON})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.repeat, args.batch, args.prefetch or 1, *args.procs) < 1:
        p.error("--repeat, --batch, --prefetch and --procs must be ≥ 1")
    if args.worker and not args.master:
        p.error("--worker needs --master")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    args = parse_args(argv)
    return worker_main(args) if args.worker else run(args)


if __name__ == "__main__":
    sys.exit(main())
