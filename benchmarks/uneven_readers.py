#!/usr/bin/env python3
"""Readers of unequal speed sharing a job's epochs: epoch time against the ideal, tail idle time.

A master process and N reader processes of one job (default 3, speeds 1x, 1x and 1/3x: a
"training step" is a sleep per batch). Per epoch it reports:

- the epoch's time, from its first batch handed over to its last step's end, and the ideal: the
  epoch's records over the sum of the readers' rates (each rate measured from its own steps, so
  the ideal is the epoch with no reader ever waiting for input);
- per reader: its share of the records and its tail idle time (from its last step's end to the
  epoch's end: how long it waited while others finished);
- whether pass k was epoch k for every reader, and records missing or repeated.

Measured, not asserted (docs/benchmarks.md has the figures). Self-contained: its own text
dataset in the temp folder.

    python benchmarks/uneven_readers.py                       # 3 readers, 3 epochs
    python benchmarks/uneven_readers.py --speeds 1,1,0.333 --records 3000 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from stop_cleanly import exit_cleanly_on_signals

from trainfeed import BatchOptions, PipelineOptions


def worker(args: argparse.Namespace) -> None:
    """One reader process: --epochs passes, a sleep of --delay per batch, a JSON line each."""
    from trainfeed import dist

    reader = dist.reader("uneven", pipeline=PipelineOptions(batch=BatchOptions(size=args.batch)))
    time.sleep(max(0.0, args.start_at - time.time()))
    with open(args.out, "a") as out:
        for k in range(args.epochs):
            asked = time.time()
            for batch in reader():
                got = time.time()
                time.sleep(args.delay)
                done = time.time()
                out.write(json.dumps({"pass": k, "epoch": reader.epoch, "got": got,
                                      "asked": asked, "done": done,
                                      "ids": batch["_id"].tolist()}) + "\n")
                asked = done
            out.write(json.dumps({"pass": k, "epoch": reader.epoch, "end": time.time()}) + "\n")
            out.flush()
    reader.close()


def make_dataset(folder: Path, records: int, rows_per_group: int) -> str:
    from trainfeed.upload import UploadOptions, upload

    storage = folder / "storage"
    listing = folder / "uneven.list"
    listing.write_text("".join(f"sentence {i}\tclass{i % 3}\n" for i in range(records)))
    upload(str(listing), "uneven", str(storage),
           UploadOptions(kind="text", row_group_rows=rows_per_group), progress=False)
    return str(storage)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainfeed.master.serve.process import MasterProcess

    speeds = [float(s) for s in args.speeds.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="trainfeed-uneven-"))
    storage = make_dataset(folder, args.records, args.rows_per_group)
    outs = [folder / f"reader{i}.jsonl" for i in range(len(speeds))]
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path(
        "/proc/loadavg").exists() else []
    with MasterProcess(storage) as master:
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "uneven",
               "TRAIN_LOCAL": ""}
        begin = time.time() + args.startup_s
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--worker", "--out", str(out), "--epochs",
             str(args.epochs), "--batch", str(args.batch), "--delay",
             str(args.base_delay / speed), "--start-at", str(begin + i * args.stagger)],
            env=env) for i, (out, speed) in enumerate(zip(outs, speeds))]
        for p in procs:
            if p.wait(600) != 0:
                raise SystemExit(f"a reader exited with {p.returncode}")
    load_after = Path("/proc/loadavg").read_text().split()[:3] if load_before else []
    lines = [[json.loads(x) for x in out.read_text().splitlines()] for out in outs]
    epochs = []
    for epoch in range(args.epochs):
        mine = [[x for x in ls if "ids" in x and x["epoch"] == epoch] for ls in lines]
        ends = [[x for x in ls if x.get("end") and x["epoch"] == epoch] for ls in lines]
        every = [x for m in mine for x in m]
        if not every:
            epochs.append({"epoch": epoch, "records": 0})
            continue
        start, end = min(x["got"] for x in every), max(x["done"] for x in every)
        rates = [sum(len(x["ids"]) for x in m) / max(1e-9, sum(x["done"] - x["got"] for x in m))
                 if m else 0.0 for m in mine]
        seen = Counter(i for x in every for i in x["ids"])
        ideal = len(seen) / sum(rates) if sum(rates) else float("nan")
        epochs.append({
            "epoch": epoch, "records": sum(seen.values()), "took_s": end - start,
            "ideal_s": ideal, "ratio": (end - start) / ideal,
            "shares": [sum(len(x["ids"]) for x in m) / max(1, sum(seen.values()))
                       for m in mine],
            "tail_idle_s": [end - max((x["done"] for x in m), default=start) for m in mine],
            "missing": args.records - len(seen), "repeated": sum(n - 1 for n in seen.values()),
            "aligned": all(e and e[0]["pass"] == epoch for e in ends),
        })
    return {"readers": len(speeds), "speeds": speeds, "records": args.records,
            "rows_per_group": args.rows_per_group, "batch": args.batch,
            "base_delay_s": args.base_delay, "load_before": load_before,
            "load_after": load_after, "epochs": epochs}


def report(result: dict[str, Any]) -> None:
    print(f"{result['readers']} readers, speeds {result['speeds']}, {result['records']} records "
          f"(row groups of {result['rows_per_group']}), batch {result['batch']}; load "
          f"{' '.join(result['load_before'])} -> {' '.join(result['load_after'])}")
    print(f"{'epoch':>5} {'took s':>7} {'ideal s':>7} {'ratio':>6}  {'shares':<20} "
          f"{'tail idle s':<20} {'miss':>4} {'twice':>5} aligned")
    for e in result["epochs"]:
        if not e["records"]:
            print(f"{e['epoch']:>5}  no records")
            continue
        shares = " ".join(f"{s:.2f}" for s in e["shares"])
        tails = " ".join(f"{t:.2f}" for t in e["tail_idle_s"])
        print(f"{e['epoch']:>5} {e['took_s']:7.2f} {e['ideal_s']:7.2f} {e['ratio']:6.2f}  "
              f"{shares:<20} {tails:<20} {e['missing']:>4} {e['repeated']:>5} {e['aligned']}")


def main() -> None:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--rows-per-group", type=int, default=25)
    parser.add_argument("--speeds", default="1,1,0.333",
                        help="relative speed of each reader (comma-separated)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--base-delay", type=float, default=0.08,
                        help="seconds per batch of a reader of speed 1")
    parser.add_argument("--stagger", type=float, default=0.0,
                        help="seconds between the readers' starts")
    parser.add_argument("--startup-s", type=float, default=8.0,
                        help="time given to every reader to import before the common start")
    parser.add_argument("--json", help="also write the figures here")
    # The reader processes this script starts:
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    result = run(args)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
