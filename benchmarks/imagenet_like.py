"""ImageNet-class input pipelines on the same cores: trainfeed beside Pillow, PyTorch, tf.data,
DALI and Grain, two workloads, one run.

Data: ImageNet-like JPEGs (benchmarks/make_imagenet_like.py: natural-photo crops, ~474x413 px,
~83 KB at quality 90), generated on first use, uploaded once for trainfeed's rows (untimed);
the peers read the JPEG files. Workloads and what each method does: benchmarks/imagenet_methods.py
(`val`: resize shorter 256 + centre crop 224; `train`: RandomResizedCrop 224 + flip; uint8,
batches of 256).

What is timed: each method runs in a process of its own, builds its pipeline untimed, skips
`--warmup` batches, then streams `--images` more images (crossing epoch boundaries, so per-epoch
costs count) while this process samples the CPU of the method's whole process tree (workers,
the trainfeed master) and of the machine every 0.1 s. Reported per method and workload, medians
over `--passes` interleaved passes: images/s; CPU ms per image (the tree's CPU over the window /
images); cores busy; *cores per H100* = 3,000 images/s (ResNet-50, mixed precision, assumed) x
CPU seconds per image; *foreign load* = the rest of the machine's busy cores over the window
(other users of a shared machine). Files are read once before each warm run (page cache);
`--cold` adds a round that evicts each method's input files from the page cache first
(posix_fadvise DONTNEED) and times from the 2nd batch. Before each run the harness waits (at most
`--max-wait` s) for the 1-minute load average to fall below `--quiet-load`.

The decode-only ceiling (`--ceiling`): one thread, images in memory, simplejpeg's full decode and
trainfeed's per-image paths (decode + crop + resize + flip), images per CPU-second; times the
machine's cores it is the most any pipeline built on that decoder could deliver.

    python benchmarks/imagenet_like.py run --images-in-dataset 5000 --passes 2 --ceiling
    python benchmarks/imagenet_like.py run --methods tfdata trainfeed-local --workloads train
    python benchmarks/imagenet_like.py summary --out RESULTS.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psutil
from fairness import cores_asked, every_core, pass_ratios_text, side_of
from imagenet_methods import (
    BATCH,
    DATASET,
    METHODS,
    OPS,
    RESTARTS_DATASET,
    SIZE,
    WORKLOADS,
    batches,
    dataset_of,
    read_list,
)
from imagenet_methods import trainfeed_options as tf_options
from make_imagenet_like import ensure_dataset
from read_throughput import DEFAULT_ROOT, evict_from_page_cache
from stop_cleanly import exit_cleanly_on_signals

HERE = os.path.abspath(__file__)
H100_IMAGES_PER_S = 3000  # ResNet-50 training with mixed precision on one H100 (assumed)
BASELINES = ("tfdata", "dali")
# The cores each method is set up to use (benchmarks/fairness.py's verdict): the plain Pillow
# loop runs in one thread; every other method's workers or threads fill the machine.
ONE_CORE = ("plain",)


def cores_of(method: str) -> float:
    return cores_asked(1 if method in ONE_CORE else every_core())


def pass_ratio(rows: Sequence[dict[str, Any]], key: tuple[str, str, bool], base: str) -> str:
    """The method's rate over `base`'s, pass by pass, printed only from fair passes."""
    workload, method, cold = key
    by_pass: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "rate" in r and r["workload"] == workload and r["cold"] == cold:
            by_pass.setdefault(r["pass"], {})[r["method"]] = r
    passes = [(p[method]["rate"] / p[base]["rate"],
               [side_of(p[base], cores_of(base)), side_of(p[method], cores_of(method))])
              for _, p in sorted(by_pass.items()) if method in p and base in p]
    return pass_ratios_text(passes)


# -- inside a method's process ------------------------------------------------------------------
def check(batch: Any) -> int:
    array = np.asarray(batch)
    # trainfeed's last batch of a pass may be partial (no drop_last).
    assert array.dtype == np.uint8 and 0 < array.shape[0] <= BATCH and (
        array.shape[1:] in ((SIZE, SIZE, 3), (3, SIZE, SIZE))), (array.dtype, array.shape)
    return int(array.shape[0])


def timed_window(stream: Iterator[Any], warmup: int, images: int,
                 warmup_s: float = 3.0) -> dict[str, Any]:
    """Skips `warmup` batches and at least `warmup_s` seconds after the first batch (so that
    whatever a method prefetched while the consumer waited for its first batch is drained:
    Grain's worker processes buffer several batches), then times `images` more."""
    check(next(stream))
    first = time.time()
    for _ in range(warmup - 1):
        check(next(stream))
    while time.time() - first < warmup_s:
        check(next(stream))
    start, got = time.time(), 0
    while got < images:
        got += check(next(stream))
    return {"start": start, "end": time.time(), "images": got}


def method_main(args: argparse.Namespace) -> int:
    if args.method.startswith("trainfeed-dist"):
        return dist_main(args)
    stream = batches(args.method, args.workload, args.data, dataset_of(args.method),
                     args.storage)
    print(json.dumps(timed_window(stream, args.warmup, args.images)), flush=True)
    time.sleep(0.5)  # the sampler sees the whole tree after the window's end
    os._exit(0)  # DataLoader/Grain workers and DALI threads: no slow, noisy teardown


def reader_main(args: argparse.Namespace) -> int:
    """One distributed reader: prints a line per batch (time, images) until killed."""
    from trainfeed import MasterSource, PipelineOptions, dist
    reader = dist.reader(args.dataset, source=MasterSource(job=args.job),
                         pipeline=PipelineOptions.from_keywords(**tf_options(args.workload)))
    while True:
        for batch in reader():
            n = check(batch["image"])
            print(json.dumps({"t": time.time(), "n": n}), flush=True)


def dist_main(args: argparse.Namespace) -> int:
    """A master and 2 readers of one job; the window opens once both delivered `warmup`
    batches and closes when they delivered `images` more between them."""
    from trainfeed.master.serve.process import MasterProcess
    job = f"imagenet-{os.getpid()}"
    with MasterProcess(args.storage) as master:
        # Two training processes on one node, as torchrun starts them: LOCAL_WORLD_SIZE=2 gives
        # each reader half the cores for decoding (trainfeed.decode.pixels.default_decode_threads).
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAIN_LOCAL": "",
               "LOCAL_WORLD_SIZE": os.environ.get("BENCH_LOCAL_WORLD_SIZE", "2")}
        procs = [subprocess.Popen([sys.executable, HERE, "_reader", "--workload", args.workload,
                                   "--job", job, "--dataset", dataset_of(args.method)],
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
        events: list[list[tuple[float, int]]] = [[] for _ in procs]
        lock = threading.Condition()

        def pump(k: int) -> None:
            out = procs[k].stdout
            assert out is not None
            for line in out:
                if line.startswith("{"):
                    e = json.loads(line)
                    with lock:
                        events[k].append((e["t"], e["n"]))
                        lock.notify_all()

        for k in range(len(procs)):
            threading.Thread(target=pump, args=(k,), daemon=True).start()
        try:
            deadline = time.time() + 900
            with lock:
                while not all(len(e) >= args.warmup for e in events):
                    if time.time() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError("a distributed reader did not start")
                    lock.wait(1)
                # As timed_window: past `warmup` batches and 3 s after its first batch, for
                # each reader, so that batches prefetched before the window are not counted.
                opened = max(max(e[args.warmup - 1][0], e[0][0] + 3.0) for e in events)
                while not all(e[-1][0] >= opened for e in events):
                    if time.time() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError("a distributed reader stopped")
                    lock.wait(1)
                start = max(t for e in events for t, _ in e if t <= opened)
                while True:
                    after = sorted((t, n) for e in events for t, n in e if t > start)
                    if sum(n for _, n in after) >= args.images:
                        break
                    if time.time() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError("a distributed reader stopped")
                    lock.wait(1)
            got, end = 0, start
            for t, n in after:
                if got >= args.images:
                    break
                got, end = got + n, t
            print(json.dumps({"start": start, "end": end, "images": got}), flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait(30)
    return 0


# -- the harness --------------------------------------------------------------------------------
class Sampler:
    """Samples the CPU seconds of a process tree and the machine's busy cores every `period`."""

    def __init__(self, pid: int, period: float = 0.1):
        self.session = pid  # the method runs in a session of its own (start_new_session)
        self._seen: dict[tuple[int, float], float] = {}
        self.period = period
        self.samples: list[tuple[float, float, float]] = []  # (time, tree cpu s, machine busy s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_cpu(self) -> float:
        """CPU seconds of every process of the method's session (its children, and workers
        reparented after their parent exited, alike), each counted at the most it was seen
        at: a process that exits, or that one sample misses, does not make the sum drop."""
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) != self.session:
                    continue
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                self._seen[key] = max(self._seen.get(key, 0.0), t.user + t.system)
            except (psutil.Error, OSError):
                continue
        return sum(self._seen.values())

    @staticmethod
    def _machine_busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._tree_cpu(), self._machine_busy()))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> tuple[float, float]:
        """(tree cpu, machine busy) at time t, interpolated."""
        times = [s[0] for s in self.samples]
        return (float(np.interp(t, times, [s[1] for s in self.samples])),
                float(np.interp(t, times, [s[2] for s in self.samples])))


def wait_quiet(threshold: float, max_wait: float) -> dict[str, float]:
    waited = 0.0
    while os.getloadavg()[0] >= threshold and waited < max_wait:
        time.sleep(5)
        waited += 5
    return {"waited_s": waited, "loadavg_1m": round(os.getloadavg()[0], 2)}


def warm(paths: Sequence[str]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass


def inputs_of(method: str, paths: Sequence[str], storage: str) -> list[str]:
    """The files a method reads: the JPEGs, or trainfeed's shards."""
    if not method.startswith("trainfeed"):
        return list(paths)
    folder = os.path.join(storage, dataset_of(method))
    return [os.path.join(root, f) for root, _, files in os.walk(folder) for f in files]


def run_one(args: argparse.Namespace, method: str, workload: str, cold: bool,
            paths: Sequence[str]) -> dict[str, Any]:
    quiet = wait_quiet(args.quiet_load, args.max_wait)
    files = inputs_of(method, paths, args.storage)
    if cold:
        os.sync()
        evict_from_page_cache(files)
    else:
        warm(files)
    cmd = [sys.executable, HERE, "_method", method, "--workload", workload, "--data", args.data,
           "--storage", args.storage, "--warmup", "1" if cold else str(args.warmup),
           "--images", str(args.images)]
    row: dict[str, Any] = {"method": method, "workload": workload, "cold": cold,
                           "ops": OPS[method][workload], "cores_asked": cores_of(method),
                           **quiet}
    return {**row, **measure(cmd, args.timeout)}


def measure(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Runs a method's process (`cmd` prints its timed window as one JSON line) and returns
    the window's figures: images, rate, CPU per image (sampled from /proc over the process
    tree), the cores others kept busy meanwhile; or {"error": its last line of stderr}.

    The method runs in a session of its own, so that the whole tree is killed once the window
    is reported: worker processes (DataLoader, Grain, multiprocessing's resource tracker) may
    outlive the method's process and keep its pipes open. Killed also on SIGTERM/SIGINT
    (exit_cleanly_on_signals): no method outlives the benchmark."""
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True,
                                start_new_session=True)
        try:
            sampler = Sampler(proc.pid)

            def read() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith("{"):
                        lines.append(line)
                        return

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout)
            time.sleep(0.3)  # samples after the window's end, the tree still whole
            sampler.stop()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the method's session: workers, threads
            except ProcessLookupError:
                pass
            proc.wait()
        errors.seek(0)
        err = errors.read()
    if not lines and reader.is_alive():
        err += f"\ntimed out after {timeout:.0f} s"
    if not lines:
        return {"error": (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]}
    window = json.loads(lines[-1])
    seconds = window["end"] - window["start"]
    cpu0, busy0 = sampler.at(window["start"])
    cpu1, busy1 = sampler.at(window["end"])
    cpu = cpu1 - cpu0
    return dict(images=window["images"], seconds=round(seconds, 3),
                rate=window["images"] / seconds, cpu_s=round(cpu, 3),
                cpu_ms_per_image=1000 * cpu / window["images"], cores_busy=cpu / seconds,
                foreign_cores=max(0.0, (busy1 - busy0 - cpu) / seconds),
                loadavg_after=round(os.getloadavg()[0], 2))


def ceiling(args: argparse.Namespace, paths: Sequence[str]) -> list[dict[str, Any]]:
    """Single-thread rates of the decoder alone and of trainfeed's per-image paths."""
    import simplejpeg

    from trainfeed.decode import roi
    from trainfeed.decode.crops import CropOptions, record_uniforms
    from trainfeed.decode.image import decode_into
    native = roi._jpeg_region
    blobs = [open(p, "rb").read() for p in paths[:args.ceiling_images]]
    u = record_uniforms(0, 0, np.arange(len(blobs)))
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    train = CropOptions((SIZE, SIZE), ((0.08, 1.0), (3 / 4, 4 / 3)), flip=0.5)
    val = CropOptions((SIZE, SIZE), resize_shorter=256)
    indexed = [roi.with_restarts(b) for b in blobs] if native is not None else blobs

    def path(options: CropOptions, i: int, data: Sequence[bytes] = blobs) -> None:
        decode_into(data[i], options.plan(u[i] if options.random else None), out)

    variants = {
        "decode only (simplejpeg, full image)": lambda i: simplejpeg.decode_jpeg(blobs[i]),
        "decode only, fast IDCT (tf.data's default)":
            lambda i: simplejpeg.decode_jpeg(blobs[i], fastdct=True),
        "trainfeed val path (decode + crop + resize)": lambda i: path(val, i),
        "trainfeed train path (decode + RRC + resize + flip)": lambda i: path(train, i),
    }
    if native is not None:
        def window_only(i: int, data: Sequence[bytes] = blobs) -> None:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data[i])
            window = train.plan(u[i]).window
            roi._decode_region(data[i], window(height, width), 1, 3, False, 1 << 40)

        variants["decode only, train crop windows (region decoder)"] = window_only
        variants["decode only, train crop windows, restart-indexed JPEGs"] = \
            lambda i: window_only(i, indexed)
        variants["trainfeed train path, restart-indexed JPEGs (upload --jpeg-restarts)"] = \
            lambda i: path(train, i, indexed)
        variants["trainfeed val path, restart-indexed JPEGs"] = lambda i: path(val, i, indexed)
        variants["trainfeed train path, whole-image decode (before the region decoder)"] = \
            lambda i: path(train, i)
    rows = []
    for name, fn in variants.items():
        roi._jpeg_region = None if "whole-image decode" in name else native
        rates = []
        for _ in range(args.ceiling_passes):
            c0 = time.process_time()
            for i in range(len(blobs)):
                fn(i)
            rates.append(len(blobs) / (time.process_time() - c0))
        rows.append({"variant": name, "per_core": statistics.median(rates),
                     "min_max": [min(rates), max(rates)], "images": len(blobs),
                     "cores": os.cpu_count()})
    roi._jpeg_region = native
    return rows


def median_rows(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, bool], dict[str, Any]]:
    groups: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        if "rate" in r:
            groups.setdefault((r["workload"], r["method"], r["cold"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        rates = [r["rate"] for r in rs]
        out[key] = {"rate": statistics.median(rates), "min": min(rates), "max": max(rates),
                    "n": len(rs),
                    "cpu_ms": statistics.median(r["cpu_ms_per_image"] for r in rs),
                    "cores_busy": statistics.median(r["cores_busy"] for r in rs),
                    "foreign": statistics.median(r["foreign_cores"] for r in rs),
                    "load": statistics.median(r["loadavg_1m"] for r in rs)}
    return out


def render(rows: Sequence[dict[str, Any]], ceilings: Sequence[dict[str, Any]]) -> str:
    med = median_rows(rows)
    lines = []
    for cold in (False, True):
        keys = [k for k in med if k[2] == cold]
        if not keys:
            continue
        lines += ["", f"{'cold page cache' if cold else 'warm page cache'}:", "",
                  "| workload | method | images/s median (min-max) | n | × tf.data, fair passes | "
                  "× DALI, fair passes | "
                  "CPU ms/image | cores busy | cores per H100 | load avg 1m | foreign cores |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for workload in WORKLOADS:
            for method in METHODS:
                m = med.get((workload, method, cold))
                if m is None:
                    errors = [r.get("error", "") for r in rows if r["method"] == method
                              and r["workload"] == workload and r["cold"] == cold]
                    if errors:
                        lines.append(f"| {workload} | {method} | failed: {errors[0][:80]} "
                                     "| | | | | | | | |")
                    continue
                ratio = {b: pass_ratio(rows, (workload, method, cold), b) if b != method
                         else "-" for b in BASELINES}
                lines.append(
                    f"| {workload} | {method} | {m['rate']:,.0f} ({m['min']:,.0f}-"
                    f"{m['max']:,.0f}) | {m['n']} | {ratio['tfdata']} | {ratio['dali']} | "
                    f"{m['cpu_ms']:.2f} | {m['cores_busy']:.2f} | "
                    f"{H100_IMAGES_PER_S * m['cpu_ms'] / 1000:.1f} | {m['load']:.2f} | "
                    f"{m['foreign']:.2f} |")
    if ceilings:
        lines += ["", "decode-only ceiling (one thread, images in memory):", "",
                  "| variant | images per CPU-second (min-max) | x cores |",
                  "|---|---:|---:|"]
        for c in ceilings:
            lines.append(f"| {c['variant']} | {c['per_core']:,.0f} ({c['min_max'][0]:,.0f}-"
                         f"{c['min_max'][1]:,.0f}) | {c['per_core'] * c['cores']:,.0f} |")
    return "\n".join(lines)


def prepare(args: argparse.Namespace) -> list[str]:
    from trainfeed.upload import UploadOptions, upload
    list_path = ensure_dataset(args.data, args.images_in_dataset)
    upload(list_path, DATASET, args.storage, UploadOptions(), progress=False)  # once
    if any(method.endswith("-rst") for method in args.methods):
        upload(list_path, RESTARTS_DATASET, args.storage, UploadOptions(jpeg_restarts=True),
               progress=False)
    return read_list(args.data)[0]


def run(args: argparse.Namespace) -> int:
    paths = prepare(args)
    args.images = args.images or len(paths)
    header = {"benchmark": "imagenet_like", "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                        time.gmtime()),
              "command": [os.path.basename(sys.executable), *sys.argv],
              "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_start": os.getloadavg()},
              "data": json.load(open(os.path.join(args.data, "summary.json"))),
              "settings": {k: v for k, v in vars(args).items() if k != "func"}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows: list[dict[str, Any]] = []
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"header": header}) + "\n")
        rounds = [(p, False) for p in range(args.passes)] + ([(args.passes, True)]
                                                             if args.cold else [])
        for k, cold in rounds:
            for workload in args.workloads:
                methods = args.methods if k % 2 == 0 else list(reversed(args.methods))
                for method in methods:
                    print(f"pass {k}{' cold' if cold else ''}: {workload} {method} ...",
                          file=sys.stderr, flush=True)
                    row = {"pass": k, **run_one(args, method, workload, cold, paths)}
                    print("   ", {key: (round(v, 2) if isinstance(v, float) else v)
                                  for key, v in row.items() if key != "ops"},
                          file=sys.stderr, flush=True)
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
        ceilings = ceiling(args, paths) if args.ceiling else []
        for c in ceilings:
            f.write(json.dumps({"ceiling": c}) + "\n")
        f.write(json.dumps({"footer": {"loadavg_end": os.getloadavg()}}) + "\n")
    print(render(rows, ceilings))
    return 0


def summary(args: argparse.Namespace) -> int:
    rows, ceilings = [], []
    with open(args.out, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "ceiling" in record:
                ceilings.append(record["ceiling"])
            elif "method" in record:
                rows.append(record)
    print(render(rows, ceilings))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)
    root = os.path.join(DEFAULT_ROOT, "imagenet-like")
    r = sub.add_parser("run", help="generate/upload the data if needed, then measure")
    r.add_argument("--data", default=os.path.join(root, "data"))
    r.add_argument("--storage", default=os.path.join(root, "storage"))
    r.add_argument("--out", default=os.path.join(root, "results.jsonl"))
    r.add_argument("--images-in-dataset", type=int, default=5000)
    r.add_argument("--images", type=int, default=0,
                   help="images per timed window (default: one epoch's worth)")
    r.add_argument("--warmup", type=int, default=3, help="batches before the window opens")
    r.add_argument("--passes", type=int, default=2)
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    r.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    r.add_argument("--cold", action="store_true", help="add a cold-page-cache round")
    r.add_argument("--ceiling", action="store_true", help="measure the decode-only ceiling")
    r.add_argument("--ceiling-images", type=int, default=1000)
    r.add_argument("--ceiling-passes", type=int, default=3)
    r.add_argument("--quiet-load", type=float, default=1.0)
    r.add_argument("--max-wait", type=float, default=60.0)
    r.add_argument("--timeout", type=float, default=600.0, help="per method run, seconds")
    r.set_defaults(func=run)
    s = sub.add_parser("summary", help="the tables of a results file")
    s.add_argument("--out", default=os.path.join(root, "results.jsonl"))
    s.set_defaults(func=summary)
    m = sub.add_parser("_method")  # internal: one method's process
    m.add_argument("method", choices=METHODS)
    for name, kwargs in (("--workload", {"choices": WORKLOADS, "required": True}),
                         ("--data", {"required": True}), ("--storage", {"required": True}),
                         ("--warmup", {"type": int, "default": 3}),
                         ("--images", {"type": int, "required": True})):
        m.add_argument(name, **kwargs)  # type: ignore[arg-type]
    m.set_defaults(func=method_main)
    d = sub.add_parser("_reader")  # internal: one distributed reader
    d.add_argument("--workload", choices=WORKLOADS, required=True)
    d.add_argument("--job", required=True)
    d.add_argument("--dataset", default=DATASET)
    d.set_defaults(func=reader_main)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    args = parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
