"""Decode throughput: JPEG files to float32 batches with one-hot labels, trainfeed beside its peers.

What it measures: one epoch of the generated 20,000-JPEG dataset (64x64, 10 classes), each image
decoded to uint8 HxWx3, converted to float32 / 255, its label one-hot encoded, handed to a
consumer loop in batches of 128 that checks the shapes, counts the images and sums the labels
(`check`: count and checksum match the list). Rows, all measured in this run:

- peers (benchmarks/peers.py, each in a process of its own): a plain Python loop with Pillow
  (the baseline of the ratios), a tuned local `tf.data` pipeline (`map(decode, AUTOTUNE)`,
  batch, prefetch) and `tf.data` service with 2 worker processes;
- trainfeed's local reader: `dist.reader(..., source=LocalSource(...), pipeline=` decoding,
  `normalizing_const=255`, one-hot labels, batches of 128`)`;
- trainfeed's `dist.reader` with 2 worker processes on one master (the same options), the
  rate being every image of the epoch / (last worker's end - first worker's start).

Each method runs `--repeat` passes in one process (fresh job per pass for the distributed row)
and reports the last one (warm page cache, TF graphs built), as the baseline script does.
`cores busy` is the CPU seconds of every process involved (for trainfeed's distributed row: both
workers and the master) / wall seconds; the machine's ceiling is its core count. Peers need
TensorFlow (`pip install tensorflow-cpu`); a row whose tool is missing says so.

The dataset (20,000 64x64 JPEGs, 10 classes) is generated on first use by
benchmarks/make_dataset.py. Rebalancing (`--rebalance`): the same pipeline over an imbalanced
set of 20,000 JPEGs (`make_dataset.py --imbalanced`: class k has weight 2^-k), read locally
without and with `resample="uniform"`: images delivered, distinct records kept, payload bytes
fetched from storage (`reader.payload_bytes_read`) against the dataset's, and the rate.

    python benchmarks/decode_throughput.py                 # all rows, ~3 minutes
    python benchmarks/decode_throughput.py --rows trainfeed-local trainfeed-dist
    python benchmarks/decode_throughput.py --rows trainfeed-local --rebalance
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from fairness import PassMeter, SideLoad, cores_asked, every_core, ratio_text
from make_dataset import ensure_dataset
from proc_stats import process_cpu_s
from read_throughput import DEFAULT_DATA, DEFAULT_ROOT
from stop_cleanly import exit_cleanly_on_signals

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LabelOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    SamplingOptions,
    dist,
)
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

PEERS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.py")
DEFAULT_STORAGE = os.path.join(DEFAULT_ROOT, "storage")
DEFAULT_JSON = os.path.join(DEFAULT_ROOT, "decode_throughput.json")
DATASET = "bench-images"
IMBALANCED = "bench-images-imbalanced"
DEFAULT_IMBALANCED_DATA = os.path.join(DEFAULT_ROOT, "imbalanced")
PEERS = {"plain-loop": ["plain"], "tf.data": ["tfdata"],
         "tf.data service (2 workers)": ["tfdata-service", "--workers", "2"]}
ROWS = (*PEERS, "trainfeed-local", "trainfeed-dist")
ONE_CORE = ("plain-loop",)  # a Python loop; every other row's threads or workers fill the machine
PIPELINE = PipelineOptions(decode=DecodeOptions(True, normalizing_const=255.0),
                           labels=LabelOptions(one_hot=True))


def consume(reader: Any, num_classes: int) -> tuple[int, int, int]:
    """The consumer loop of the baselines: shape checks, count, label checksum; also the
    number of distinct records delivered."""
    samples = label_sum = 0
    ids: set[int] = set()
    for batch in reader():
        x, y = batch["image"], batch["label"]
        assert x.dtype == np.float32 and x.ndim == 4 and y.shape == (len(x), num_classes)
        samples += len(y)
        label_sum += int(y.argmax(1).sum())
        ids.update(batch["_id"].tolist())
    return samples, label_sum, len(ids)


def tree_cpu_s() -> float:
    """This process's CPU seconds (threads included)."""
    t = os.times()
    return t.user + t.system


# -- trainfeed rows, each in a process of its own (like the peers) ------------------------------
def local_main(args: argparse.Namespace) -> int:
    pipeline = dataclasses.replace(
        PIPELINE, batch=BatchOptions(size=args.batch),
        sampling=SamplingOptions(resample=args.resample or None))
    reader = dist.reader(args.dataset, source=LocalSource(args.storage), pipeline=pipeline)
    num_classes = reader.output_spec()["label"][0][1]
    runs = []
    for _ in range(args.repeat):
        cpu0, t0, bytes0 = tree_cpu_s(), time.perf_counter(), reader.payload_bytes_read
        samples, label_sum, distinct = consume(reader, num_classes)
        runs.append((time.perf_counter() - t0, tree_cpu_s() - cpu0, samples, label_sum,
                     distinct, reader.payload_bytes_read - bytes0))
    print(json.dumps({"runs": runs}), flush=True)
    return 0


def worker_main(args: argparse.Namespace) -> int:
    """One distributed worker: joins `args.job` for each pass when told "go" on stdin."""
    for k in range(args.repeat):
        reader = dist.reader(DATASET, source=MasterSource(job=f"{args.job}-{k}"),
                             pipeline=dataclasses.replace(PIPELINE,
                                                          batch=BatchOptions(size=args.batch)))
        num_classes = reader.output_spec()["label"][0][1]  # connects: OpenJob, manifest
        print("ready", flush=True)
        sys.stdin.readline()
        cpu0, t0 = tree_cpu_s(), time.time()
        samples, label_sum, _ = consume(reader, num_classes)
        t1, cpu = time.time(), tree_cpu_s() - cpu0
        reader.close()
        print(json.dumps({"start": t0, "end": t1, "cpu": cpu, "samples": samples,
                          "label_sum": label_sum}), flush=True)
    return 0


def run_local(args: argparse.Namespace, dataset: str = DATASET,
              resample: str = "") -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--_local", "--storage", args.storage,
                          "--repeat", str(args.repeat), "--batch", str(args.batch),
                          "--dataset", dataset, "--resample", resample],
                         check=True, capture_output=True, text=True).stdout
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    seconds, cpu, samples, label_sum, distinct, payload = runs[-1]
    return {"seconds": seconds, "cpu_s": cpu, "samples": samples, "label_sum": label_sum,
            "distinct": distinct, "payload_bytes": payload, "runs_s": [r[0] for r in runs]}


def run_rebalance(args: argparse.Namespace) -> str:
    """Rows without and with resampling over the imbalanced set; returns the Markdown table."""
    list_path = ensure_dataset(args.imbalanced_data, imbalanced=True)
    upload(list_path, IMBALANCED, args.storage, UploadOptions(), progress=False)
    total = sum(os.path.getsize(os.path.join(args.imbalanced_data, line.split("\t")[0]))
                for line in open(list_path) if line.strip())
    lines = ["| read | images delivered | distinct records kept | payload bytes read | "
             "of the dataset's payload | images/s |", "|---|---:|---:|---:|---:|---:|"]
    for label, resample in (("all records", ""), ('resample="uniform"', "uniform")):
        r = run_local(args, IMBALANCED, resample)
        lines.append(f"| {label} | {r['samples']:,} | {r['distinct']:,} | "
                     f"{r['payload_bytes']:,} | {r['payload_bytes'] / total:.1%} | "
                     f"{r['samples'] / r['seconds']:,.0f} |")
    return "\n".join(lines)


def run_dist(args: argparse.Namespace, workers: int = 2) -> dict[str, Any]:
    job = f"decode-{os.getpid()}"
    with MasterProcess(args.storage) as master:
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAIN_LOCAL": ""}
        procs = [subprocess.Popen([sys.executable, __file__, "--_worker", "--job", job,
                                   "--repeat", str(args.repeat), "--batch", str(args.batch)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env) for _ in range(workers)]
        results = []
        try:
            for _ in range(args.repeat):
                for p in procs:
                    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
                master_cpu0 = process_cpu_s(master.proc.pid)
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write("go\n")
                    p.stdin.flush()
                done = [json.loads(p.stdout.readline()) for p in procs if p.stdout]
                results.append((done, process_cpu_s(master.proc.pid) - master_cpu0))
        finally:
            for p in procs:
                p.wait(60)
    done, master_cpu = results[-1]
    start, end = min(d["start"] for d in done), max(d["end"] for d in done)
    return {"seconds": end - start, "cpu_s": sum(d["cpu"] for d in done) + master_cpu,
            "samples": sum(d["samples"] for d in done),
            "label_sum": sum(d["label_sum"] for d in done),
            "runs_s": [max(d["end"] for d in r) - min(d["start"] for d in r)
                       for r, _ in results]}


def run_peer(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, PEERS_SCRIPT, *argv, "--data", args.data,
                           "--repeat", str(args.repeat), "--batch", str(args.batch)],
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    out = json.loads(lines[-1])
    if "error" in out:
        return {"error": str(out["error"])[:200]}
    return {"seconds": out["seconds"], "cpu_s": out["cpu_s"], "samples": out["samples"],
            "check": out["check"], "runs_s": out["runs_s"]}


# -- the run ---------------------------------------------------------------------------------------
def ensure_uploaded(data_dir: str, storage: str) -> tuple[int, int]:
    """Uploads the list once; returns (records, label checksum) of the list."""
    list_path = ensure_dataset(data_dir)
    upload(list_path, DATASET, storage, UploadOptions(), progress=False)  # no-op when done
    with open(list_path) as f:
        labels = [int(line.rstrip("\n").split("\t")[1]) for line in f if line.strip()]
    return len(labels), sum(labels)


def side(name: str, r: dict[str, Any]) -> SideLoad:
    """A row's load: its measured pass's busy cores, and the foreign load over its whole run
    (rows written before `foreign_cores` was recorded count as unmeasured: 0)."""
    return SideLoad(name, r.get("cores_asked") or cores_asked(1 if name in ONE_CORE else
                                                              every_core()),
                    r["cpu_s"] / r["seconds"], r.get("foreign_cores", 0.0))


def vs(name: str, r: dict[str, Any], base_name: str, base: dict[str, Any]) -> str:
    """The row's rate over `base`'s, printed only when both were fair (benchmarks/fairness.py)."""
    if "seconds" not in base or name == base_name:
        return "-"
    ratio = (r["samples"] / r["seconds"]) / (base["samples"] / base["seconds"])
    return ratio_text(ratio, [side(base_name, base), side(name, r)])


def render(rows: dict[str, dict[str, Any]], cores: int) -> str:
    base, tf = rows.get("plain-loop", {}), rows.get("tf.data", {})
    out = ["| method | images/s | vs plain loop | vs tuned tf.data | cores busy (of "
           f"{cores}; asked) | foreign cores | CPU µs/image | s | every pass s | check |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, r in rows.items():
        if "error" in r:
            out.append(f"| {name} | not run: {r['error']} | | | | | | | | |")
            continue
        rate, me = r["samples"] / r["seconds"], side(name, r)
        out.append(f"| {name} | {rate:,.0f} | {vs(name, r, 'plain-loop', base)} | "
                   f"{vs(name, r, 'tf.data', tf)} | {me.cores_busy:.2f} ({me.cores_asked:g}) | "
                   f"{me.foreign_cores:.2f} | {r['cpu_s'] / r['samples'] * 1e6:,.0f} | "
                   f"{r['seconds']:.2f} | {', '.join(f'{s:.2f}' for s in r['runs_s'])} | "
                   f"{r['check']} |")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    records, checksum = ensure_uploaded(args.data, args.storage)
    rows: dict[str, dict[str, Any]] = {}
    for name in args.rows:
        print(f"{name} ...", file=sys.stderr, flush=True)
        # The foreign load over the row's whole run (its children's CPU out of the machine's).
        with PassMeter(cores_asked(1 if name in ONE_CORE else every_core())) as meter:
            if name in PEERS:
                r = run_peer(args, PEERS[name])
            else:
                r = run_local(args) if name == "trainfeed-local" else run_dist(args)
                r["check"] = ("ok" if (r.pop("samples_check", r["samples"]), r.pop("label_sum"))
                              == (records, checksum) else "MISMATCH")
        load = meter.load(name)
        rows[name] = {**r, "cores_asked": load.cores_asked,
                      "foreign_cores": round(load.foreign_cores, 3)}
    cores = os.cpu_count() or 1
    table = render(rows, cores)
    print(table)
    rebalance = run_rebalance(args) if args.rebalance else ""
    if rebalance:
        print("\n" + rebalance)
    import grpc
    import pyarrow
    result = {"benchmark": "decode_throughput", "started_at": started,
              "command": [os.path.basename(sys.executable), *sys.argv],
              "machine": {"nproc": cores, "python": platform.python_version(),
                          "pyarrow": pyarrow.__version__, "grpcio": grpc.__version__,
                          "loadavg_end": os.getloadavg()},
              "data": {"list": args.data, "records": records, "storage":
                       open_storage(args.storage).url, "batch": args.batch,
                       "repeat": args.repeat},
              "rows": rows, "table_markdown": table, "rebalance_markdown": rebalance}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS),
                   help="which methods to run (default: all)")
    p.add_argument("--data", default=DEFAULT_DATA, help="folder of train_data.list + images")
    p.add_argument("--storage", default=DEFAULT_STORAGE, help="trainfeed storage for the upload")
    p.add_argument("--repeat", type=int, default=2, help="passes per method; the last counts")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--json", default=DEFAULT_JSON)
    p.add_argument("--rebalance", action="store_true",
                   help="also measure payload bytes with and without resample='uniform' on an "
                        "imbalanced set")
    p.add_argument("--imbalanced-data", default=DEFAULT_IMBALANCED_DATA)
    p.add_argument("--dataset", default=DATASET, help=argparse.SUPPRESS)
    p.add_argument("--resample", default="", help=argparse.SUPPRESS)
    p.add_argument("--_local", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    args = parse_args(argv)
    if args._local:
        return local_main(args)
    if args._worker:
        return worker_main(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
