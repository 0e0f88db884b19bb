"""Packing throughput: MADlib-style buffers from a table of arrays, and reading them back.

What it measures, in one run, on a Parquet table of N rows of 3x32x32 uint8 arrays (flat lists
of 3,072 values) with a 10-class label:

- baseline: a plain loop over the rows (pyarrow `to_pylist`, one numpy array per row, stacked per
  buffer, divided by 255, one-hot labels): what a hand-written preprocessing script does;
- `training_preprocessor(...)` (normalizing_const=255, 2 workers): rows/s from reading the source
  to the published packed dataset (encoding, shards, manifest);
- reading the packed dataset back: locally, and through a master with 2 worker processes (a
  fresh job; rows/s over the whole epoch, first worker start to last worker end).

    python benchmarks/pack_throughput.py --rows 200000
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed import dist
from trainfeed.master.process import MasterProcess
from trainfeed.preprocess import training_preprocessor
from trainfeed.preprocess.buffers import plan_buffers

WIDTH = 3 * 32 * 32
CLASSES = 10


def make_source(path: str, rows: int) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (rows, WIDTH), dtype=np.uint8)
    values = pa.array(pixels.reshape(-1))
    offsets = pa.array(np.arange(0, rows * WIDTH + 1, WIDTH, dtype=np.int32))
    labels = pa.array([f"class{i % CLASSES}" for i in range(rows)])
    pq.write_table(pa.table({"rgb": pa.ListArray.from_arrays(offsets, values),
                             "species": labels}), path, row_group_size=10_000)


def baseline(path: str, workers: int) -> float:
    """The plain loop: rows as Python lists, numpy per row; returns seconds."""
    t0 = time.perf_counter()
    table = pq.read_table(path)
    rgb, species = table.column("rgb").to_pylist(), table.column("species").to_pylist()
    classes = sorted(set(species))
    eye = np.eye(len(classes), dtype=np.int16)
    index = {c: i for i, c in enumerate(classes)}
    start = 0
    for size in plan_buffers(len(rgb), workers):
        x = np.stack([np.asarray(r, dtype=np.float32) for r in rgb[start:start + size]]) / 255
        y = eye[[index[s] for s in species[start:start + size]]]
        assert x.shape[0] == y.shape[0] == size
        start += size
    return time.perf_counter() - t0


def read_local(storage: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = sum(len(b["species"]) for b in dist.reader("packed", local=True, storage=storage)())
    return time.perf_counter() - t0, rows


def worker_main(job: str) -> int:
    reader = dist.reader("packed", local=False, job=job)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.time()
    rows = sum(len(b["species"]) for b in reader())
    print(json.dumps({"start": t0, "end": time.time(), "rows": rows}), flush=True)
    reader.close()
    return 0


def read_dist(storage: str, workers: int = 2) -> tuple[float, int]:
    with MasterProcess(storage) as master:
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAIN_LOCAL": ""}
        procs = [subprocess.Popen([sys.executable, __file__, "--_worker", f"pack-{os.getpid()}"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env) for _ in range(workers)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        done = [json.loads(p.stdout.readline()) for p in procs if p.stdout]
        for p in procs:
            p.wait(60)
    return (max(d["end"] for d in done) - min(d["start"] for d in done),
            sum(d["rows"] for d in done))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--_worker", metavar="JOB", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:
        return worker_main(args._worker)
    with tempfile.TemporaryDirectory(prefix="trainfeed-pack-") as tmp:
        source, storage = os.path.join(tmp, "source.parquet"), os.path.join(tmp, "storage")
        make_source(source, args.rows)
        base_s = baseline(source, args.workers)
        t0 = time.perf_counter()
        summary = training_preprocessor(source, "packed", "species", "rgb",
                                        normalizing_const=255.0, num_workers=args.workers,
                                        storage=storage)
        pack_s = time.perf_counter() - t0
        local_s, local_rows = read_local(storage)
        dist_s, dist_rows = read_dist(storage, args.workers)
    assert local_rows == dist_rows == args.rows
    n = args.rows
    print(f"{n:,} rows of 3x32x32, {summary['num_buffers']} buffers of {summary['buffer_size']}")
    print("| step | seconds | rows/s | vs plain loop |")
    print("|---|---:|---:|---:|")
    print(f"| plain loop (to_pylist + numpy per row) | {base_s:.2f} | {n / base_s:,.0f} | 1.00x |")
    print(f"| training_preprocessor (read, pack, publish) | {pack_s:.2f} | {n / pack_s:,.0f} | "
          f"{base_s / pack_s:.2f}x |")
    print(f"| read packed, local reader | {local_s:.2f} | {n / local_s:,.0f} | - |")
    print(f"| read packed, master + {args.workers} workers | {dist_s:.2f} | {n / dist_s:,.0f} "
          f"| - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
