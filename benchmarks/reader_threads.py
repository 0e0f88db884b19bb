"""CPU per image on each thread of a local train read, and the garbage collector's pauses.

What keeps a reader under its cores is what runs serially: on one thread, or holding the GIL.
This reads a dataset as benchmarks/imagenet_methods.py's trainfeed-local rows do (RandomResized
Crop 224 + flip, uint8, batches of 256, shuffle buffer 1,024), skips `--warmup` images, then
streams `--images` more (crossing epochs) and reports, per thread (by its Python name; pools
summed), the CPU it spent per image, from /proc/self/task/*/stat (threads that end within the
window are counted from their own CPU clock as they end), and its context switches per image,
voluntary (going to sleep: on the GIL, a lock, a queue) and not, from /proc/self/task/*/status
(those of threads that end within the window read as they end). It also reports the
collections of each garbage-collector generation per 1,000 images and their time (a collection
holds the GIL: every thread that needs it waits). CPU time per image is what load on a shared
machine moves least; `cores_busy` is only meaningful on a quiet one (the load is printed).

Pair it with py-spy for what each thread runs, and which of it holds the GIL:

    python benchmarks/reader_threads.py --storage DIR --dataset NAME
    python benchmarks/reader_threads.py --storage DIR --dataset NAME --offcpu 6
    py-spy record --native --threads --gil -r 100 -f raw -o gil.raw -- \\
        python benchmarks/reader_threads.py --storage DIR --dataset NAME
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from imagenet_methods import trainfeed_batches
from offcpu import Recording, shares

TICK = os.sysconf("SC_CLK_TCK")
POOLS = ("trainfeed-decode", "trainfeed-convert", "trainfeed-read", "ThreadPoolExecutor")
# Threads that ended: native id -> (name, CPU seconds of its whole life, its context switches).
ENDED: dict[int, tuple[str, float, tuple[int, int]]] = {}
_run = threading.Thread.run


def _counted_run(self: threading.Thread) -> None:
    try:
        _run(self)
    finally:
        tid = threading.get_native_id()
        ENDED[tid] = (self.name, time.thread_time(), thread_switches([tid]).get(tid, (0, 0)))


threading.Thread.run = _counted_run  # type: ignore[method-assign]


class Collections:
    """Garbage-collector runs per generation and their wall time (gc.callbacks)."""

    def __init__(self) -> None:
        self.reset()
        self._started: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._started[generation] = time.perf_counter()
            return
        self.count[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started.pop(
            generation, time.perf_counter())


def _task_files(name: str, tids: Sequence[int] | None = None) -> Iterator[tuple[int, str]]:
    """(thread id, text of /proc/self/task/<id>/`name`) of each live thread of this process
    (`tids`: these only), skipping threads that end while they are read."""
    for tid in tids if tids is not None else os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/{name}", encoding="ascii") as f:
                yield int(tid), f.read()
        except OSError:
            continue


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of this process."""
    out = {}
    for tid, text in _task_files("stat"):
        fields = text.rsplit(")", 1)[1].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def thread_switches(tids: Sequence[int] | None = None) -> dict[int, tuple[int, int]]:
    """(voluntary, involuntary) context switches of each live thread of this process: a
    voluntary one is a thread going to sleep (on the GIL, a lock, a queue, I/O), so their
    count per image says how often the stages hand work or the GIL to each other. `tids`:
    these threads only (default: all)."""
    out = {}
    for tid, text in _task_files("status", tids):
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        out[tid] = (int(fields["voluntary_ctxt_switches"]),
                    int(fields["nonvoluntary_ctxt_switches"]))
    return out


def thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def role(name: str) -> str:
    return next((pool for pool in POOLS if name.startswith(pool)), name)


def measure(storage: str, dataset: str, images: int, warmup: int,
            offcpu_s: float = 0.0) -> dict[str, Any]:
    """The window's figures; with `offcpu_s`, after the window, that many seconds more under
    `perf record` (benchmarks/offcpu.py): each thread role's share of them on CPU and in each
    wait."""
    collections = Collections()
    batches = trainfeed_batches(dataset, storage, "train")
    seen = 0
    while seen < warmup:
        seen += len(next(batches))
    names = thread_names()
    ENDED.clear()
    collections.reset()
    tracked = len(gc.get_objects())
    switched = thread_switches()
    before, started, cpu_before = thread_cpu(), time.monotonic(), time.process_time()
    load = os.getloadavg()[0]
    seen = 0
    while seen < images:
        seen += len(next(batches))
        names.update(thread_names())
    after, wall, cpu = thread_cpu(), time.monotonic() - started, time.process_time() - cpu_before
    now_switched = thread_switches()
    for tid, (name, spent, switched_at_end) in list(ENDED.items()):
        if tid not in after:
            after[tid], names[tid] = spent, name
            now_switched[tid] = switched_at_end
    switches: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tid, (voluntary, involuntary) in now_switched.items():
        was = switched.get(tid, (0, 0))  # (a thread started in the window: all of its own)
        counted = switches[role(names.get(tid, f"native-{tid}"))]
        counted[0] += voluntary - was[0]
        counted[1] += involuntary - was[1]
    per: dict[str, float] = defaultdict(float)
    for tid, spent in after.items():
        per[role(names.get(tid, f"native-{tid}"))] += spent - before.get(tid, 0.0)
    waits = _offcpu(batches, names, offcpu_s) if offcpu_s > 0 else None
    return {
        "images": seen, "wall_s": round(wall, 2), "load": [load, os.getloadavg()[0]],
        "cpu_ms_per_image": round(cpu * 1e3 / seen, 4),
        "cores_busy": round(cpu / wall, 2),
        "threads_ms_per_image": {k: round(v * 1e3 / seen, 4) for k, v in
                                 sorted(per.items(), key=lambda kv: -kv[1]) if v > 0},
        "switches_per_image": {k: {"voluntary": round(v[0] / seen, 2),
                                   "involuntary": round(v[1] / seen, 2)}
                               for k, v in sorted(switches.items(), key=lambda kv: -kv[1][0])
                               if v[0] or v[1]},
        "gc_per_1000_images": {f"gen{g}": collections.count[g] * 1000 / seen for g in range(3)},
        "gc_us_per_image": {f"gen{g}": round(collections.seconds[g] * 1e6 / seen, 2)
                            for g in range(3)},
        "gc_tracked_objects": tracked,
        **({"offcpu_share": waits} if waits is not None else {}),
    }


def _offcpu(batches: Any, names: dict[int, str], seconds: float) -> dict[str, dict[str, float]]:
    """Each thread role's share of `seconds` of reading on CPU and in each wait (perf)."""
    recording = Recording(os.path.join(tempfile.gettempdir(),
                                       f"reader_threads-{os.getpid()}.perf"))
    recording.start()
    try:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            next(batches)
            names.update(thread_names())
        for tid, (name, _, _) in ENDED.items():
            names.setdefault(tid, name)
        recording.stop()
        return shares(recording.script(), names, role)
    finally:
        os.remove(recording.path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--storage", required=True, help="the storage root of the dataset")
    p.add_argument("--dataset", required=True)
    p.add_argument("--images", type=int, default=8000, help="images in the window")
    p.add_argument("--warmup", type=int, default=1024, help="images before the window")
    p.add_argument("--offcpu", type=float, default=0.0, metavar="SECONDS",
                   help="then read SECONDS more under `perf record` and print each thread "
                        "role's share of them on CPU and in each wait (needs perf, root)")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.storage, args.dataset, args.images, args.warmup,
                             args.offcpu), indent=1))
    sys.stdout.flush()
    os._exit(0)  # the reader's threads end with the process


if __name__ == "__main__":
    sys.exit(main())
