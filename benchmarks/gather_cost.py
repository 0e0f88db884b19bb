"""The Python a shuffled pass spends per record reordering encoded images (issue 39).

A shuffled pass reorders every record twice before decoding (trainfeed.io.gather): a
partition's records are permuted in its delivery order (`take_rows` on the partition: a
one-row slice per record), then the shuffle window permutes the window's records again (on a
column of one-row chunks), and the decoder takes each value's bytes (`binary_views`). All of it
runs with the GIL held, on the read, cut and convert threads, where every microsecond a record
is one the decode threads wait for. This times each step alone, on one thread, on tables shaped
like the 256-px train read's (partitions of `--rows` records of `--value-bytes` each, a window
of `--partitions` of them): thread CPU per record, best of `--repeats`.

    python benchmarks/gather_cost.py
    python benchmarks/gather_cost.py --rows 56 --partitions 19 --value-bytes 196608
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from trainfeed.decode.pixels import binary_views
from trainfeed.io.gather import take_rows


def partition(rows: int, value_bytes: int, seed: int) -> pa.Table:
    """Ids and `rows` binary values of ~`value_bytes`, one chunk (as a partition is read)."""
    values = [bytes([(seed + i) % 251]) * (value_bytes + i) for i in range(rows)]
    return pa.table({"_id": pa.array(np.arange(rows) + seed * rows, pa.int64()),
                     "image": pa.array(values, pa.binary())})


def best_us_per_record(step: Callable[[], object], records: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time_ns()
        step()
        best = min(best, time.thread_time_ns() - started)
    return best / records / 1e3


def measure(rows: int, partitions: int, value_bytes: int, repeats: int) -> dict[str, float]:
    """Thread CPU µs per record of each step (and their sum)."""
    rng = np.random.default_rng(0)
    parts = [partition(rows, value_bytes, k) for k in range(partitions)]
    orders = [rng.permutation(rows) for _ in parts]
    records = rows * partitions
    permuted = [take_rows(p, order) for p, order in zip(parts, orders)]
    window_order = rng.permutation(records)
    window = take_rows(pa.concat_tables(permuted), window_order)
    batches = [window.slice(at, 256) for at in range(0, records, 256)]
    steps = {
        "partition permutation": lambda: [take_rows(p, o) for p, o in zip(parts, orders)],
        "window permutation": lambda: take_rows(pa.concat_tables(permuted), window_order),
        "values for the decoder": lambda: [binary_views(b.column("image")) for b in batches],
    }
    out = {name: round(best_us_per_record(step, records, repeats), 3)
           for name, step in steps.items()}
    out["all three"] = round(sum(out.values()), 3)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256, help="records per partition")
    p.add_argument("--partitions", type=int, default=4, help="partitions in the window")
    p.add_argument("--value-bytes", type=int, default=150_000, help="bytes per record")
    p.add_argument("--repeats", type=int, default=40, help="timings per step (the best counts)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    figures = measure(args.rows, args.partitions, args.value_bytes, args.repeats)
    if args.json:
        print(json.dumps(figures))
        return 0
    print("| step | thread CPU µs per record |\n|---|---:|")
    for name, us in figures.items():
        print(f"| {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
