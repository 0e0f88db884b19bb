"""Packing throughput: MADlib-style buffers from a table of arrays, and reading them back.

What it measures, in one run, on N rows of 3x32x32 arrays (flat, 3,072 values in 0..255) with a
10-class label, from one of two sources:

- ``--source postgresql`` (the issue's benchmark): a PostgreSQL table ``(id int, rgb
  smallint[], species text)``, MADlib's layout, on a private server started for the run (or
  ``--db URL``). Baseline: the plain script, ``pandas.read_sql`` in chunks of one buffer + a
  numpy loop (one array per row, stacked, / 255, one-hot labels), buffers kept in memory.
  trainfeed: ``training_preprocessor(trainfeed.sql(query, url, key_columns=["id"]), ...)``,
  from the query to the published packed dataset.
- ``--source parquet``: the same table as a Parquet file of uint8 lists; baseline the same
  loop over ``to_pylist``.

Then the packed dataset is read back: locally, and through a master with 2 worker processes (a
fresh job; rows/s over the whole epoch, first worker start to last worker end).

    python benchmarks/pack_throughput.py --source postgresql --rows 1000000
    python benchmarks/pack_throughput.py --source parquet --rows 200000
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from stop_cleanly import exit_cleanly_on_signals

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.master.serve.process import MasterProcess
from trainfeed.preprocess import training_preprocessor
from trainfeed.preprocess.buffers import plan_buffers
from trainfeed.sql import sql

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
    start = 0
    for size in plan_buffers(len(rgb), workers, values_per_row=[WIDTH]):
        pack_plainly(rgb[start:start + size], species[start:start + size], classes, size)
        start += size
    return time.perf_counter() - t0


def pack_plainly(rgb: Sequence, species: Sequence, classes: list[str], size: int) -> None:
    eye = np.eye(len(classes), dtype=np.int16)
    index = {c: i for i, c in enumerate(classes)}
    x = np.stack([np.asarray(r, dtype=np.float32) for r in rgb]) / 255
    y = eye[[index[s] for s in species]]
    assert x.shape[0] == y.shape[0] == size


# --- the PostgreSQL source -------------------------------------------------------------------

TABLE = "images"


@contextlib.contextmanager
def postgres(url: str | None, workdir: str) -> Iterator[str]:
    if url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from integration.services import postgres_server  # the test suite's measured starter

    with postgres_server(Path(workdir) / "postgres") as started:
        yield started


def load_postgres(url: str, rows: int, chunk: int = 10_000) -> float:
    """Creates the table with binary COPY (each row a fixed-size record built by numpy);
    returns seconds."""
    import psycopg

    t0 = time.perf_counter()
    row = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i4"), ("rgb_len", ">i4"),
                    ("ndim", ">i4"), ("has_null", ">i4"), ("elem", ">i4"), ("dim", ">i4"),
                    ("lbound", ">i4"), ("rgb", [("len", ">i4"), ("v", ">i2")], (WIDTH,)),
                    ("species_len", ">i4"), ("species", "S6")])
    rng = np.random.default_rng(0)
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,)).fetchone()
        if exists and exists[0] and conn.execute(
                f"SELECT count(*) FROM {TABLE}").fetchone() == (rows,):
            return 0.0  # an earlier run's table on the same server (--db): reused
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE UNLOGGED TABLE {TABLE} (id int PRIMARY KEY, rgb smallint[], "
                     f"species text)")
        with conn.cursor() as cur, cur.copy(f"COPY {TABLE} FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(b"PGCOPY\n\xff\r\n\0" + bytes(8))
            for start in range(0, rows, chunk):
                n = min(chunk, rows - start)
                block = np.zeros(n, row)
                block["fields"], block["id_len"], block["id"] = 3, 4, np.arange(start, start + n)
                block["rgb_len"] = 20 + 6 * WIDTH
                block["ndim"], block["elem"], block["dim"], block["lbound"] = 1, 21, WIDTH, 1
                block["rgb"]["len"] = 2
                block["rgb"]["v"] = rng.integers(0, 256, (n, WIDTH))
                block["species_len"] = 6
                block["species"] = [f"class{i % CLASSES}".encode() for i in range(start,
                                                                                  start + n)]
                copy.write(block.tobytes())
            copy.write(b"\xff\xff")
        conn.execute(f"ANALYZE {TABLE}")
    return time.perf_counter() - t0


def baseline_pandas(url: str, rows: int, workers: int) -> float:
    """The plain script: one pandas.read_sql per buffer (a key range), then the numpy loop.

    Key ranges, because `read_sql(..., chunksize=)` on a DBAPI connection still runs one
    client-side query, whose whole result libpq buffers: 1M rows of arrays exhaust 24 GB."""
    import pandas as pd
    import psycopg

    t0 = time.perf_counter()
    classes = [f"class{i}" for i in range(CLASSES)]
    seen = start = 0
    with psycopg.connect(url) as conn, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pandas names SQLAlchemy as its favourite
        for size in plan_buffers(rows, workers, values_per_row=[WIDTH]):
            chunk = pd.read_sql(f"SELECT * FROM {TABLE} WHERE id >= %(lo)s AND id < %(hi)s",
                                conn, params={"lo": start, "hi": start + size})
            pack_plainly(chunk["rgb"], chunk["species"], classes, size)
            seen, start = seen + len(chunk), start + size
    assert seen == rows
    return time.perf_counter() - t0


def read_local(storage: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    reader = dist.reader("packed", source=LocalSource(storage=storage))
    rows = sum(len(b["species"]) for b in reader())
    return time.perf_counter() - t0, rows


def worker_main(job: str) -> int:
    reader = dist.reader("packed", source=MasterSource(job=job))
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
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            done = [json.loads(p.stdout.readline()) for p in procs if p.stdout]
            for p in procs:
                p.wait(60)
        finally:  # stopped early (a signal, a failed reader): no reader outlives the run
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
    return (max(d["end"] for d in done) - min(d["start"] for d in done),
            sum(d["rows"] for d in done))


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--source", choices=("postgresql", "parquet"), default="postgresql")
    p.add_argument("--db", metavar="URL", help="an existing PostgreSQL server to use (its table "
                   f"{TABLE!r} is reused if it has --rows rows, else replaced); default: start "
                   "a private one")
    p.add_argument("--_worker", metavar="JOB", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:
        return worker_main(args._worker)
    n = args.rows
    with tempfile.TemporaryDirectory(prefix="trainfeed-pack-") as tmp:
        storage = os.path.join(tmp, "storage")
        setup = ""
        if args.source == "postgresql":
            with postgres(args.db, tmp) as url:
                load_s = load_postgres(url, n)
                setup = (f"loading {n:,} rows into PostgreSQL (binary COPY): {load_s:.1f} s"
                         if load_s else f"reusing the {n:,}-row table at --db")
                print(setup, flush=True)
                base_s = baseline_pandas(url, n, args.workers)
                base_name = "plain script: pandas.read_sql (chunks) + numpy loop"
                print(f"baseline: {base_s:.1f} s", flush=True)
                t0 = time.perf_counter()
                summary = training_preprocessor(
                    sql(f"SELECT * FROM {TABLE}", url, key_columns=["id"]), "packed", "species",
                    "rgb", normalizing_const=255.0, num_workers=args.workers, storage=storage)
                pack_s = time.perf_counter() - t0
        else:
            source = os.path.join(tmp, "source.parquet")
            make_source(source, n)
            base_s = baseline(source, args.workers)
            base_name = "plain loop: to_pylist + numpy per row"
            t0 = time.perf_counter()
            summary = training_preprocessor(source, "packed", "species", "rgb",
                                            normalizing_const=255.0, num_workers=args.workers,
                                            storage=storage)
            pack_s = time.perf_counter() - t0
        print(f"packed: {pack_s:.1f} s", flush=True)
        local_s, local_rows = read_local(storage)
        dist_s, dist_rows = read_dist(storage, args.workers)
    assert local_rows == dist_rows == n
    print(f"{n:,} rows of 3x32x32 from {args.source}, {summary['num_buffers']} buffers of "
          f"{summary['buffer_size']}; {os.cpu_count()} CPUs")
    if setup:
        print(f"(setup, untimed in the table: {setup})")
    print("| step | seconds | rows/s | vs baseline |")
    print("|---|---:|---:|---:|")
    print(f"| {base_name} | {base_s:.2f} | {n / base_s:,.0f} | 1.00x |")
    print(f"| training_preprocessor (read, pack, publish) | {pack_s:.2f} | {n / pack_s:,.0f} | "
          f"{base_s / pack_s:.2f}x |")
    print(f"| read packed, local reader | {local_s:.2f} | {n / local_s:,.0f} | - |")
    print(f"| read packed, master + {args.workers} workers | {dist_s:.2f} | {n / dist_s:,.0f} "
          f"| - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
