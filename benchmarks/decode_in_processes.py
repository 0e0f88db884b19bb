"""Decoding in threads or in processes on the trainer's own host: images/s, busy cores and CPU
per image of the 256-px train read (issue 39, the "≥ 1.9 of 2 cores" target).

The local reader decodes on a thread pool inside the trainer's process, so every stage takes
the one GIL in turn (benchmarks/reader_threads.py shows the shares). Decoders in processes of
their own share no GIL: `trainfeed decoder` on the same host reads the partitions itself and
writes the pixels into the trainer's shared memory (remote decode,
trainfeed.decode.remote.shared_pixels). This reads the same train workload both ways
(RandomResizedCrop 224 + flip, uint8, batches of 256, shuffle buffer 1,024: the trainfeed rows
of benchmarks/imagenet_methods.py), the variants interleaved round by round, each in a child
process of its own, and reports per variant:

- images/s over the window (`--images` after `--warmup`);
- the cores its processes kept busy (the trainer's CPU, getrusage; each decoder's, /proc), and
  the CPU per image, trainer and decoders apart;
- the foreign load: the machine's busy cores (/proc/stat) less those, in the same window.

Variants: `threads` (the local reader, its default decode threads) and `processes:NxT`
(N decoders of T threads each; the trainer decodes nothing).

    python benchmarks/decode_in_processes.py --storage DIR --dataset NAME --images 40000 \\
        --rounds 3 --variants threads processes:2x1 processes:1x2
    python benchmarks/decode_in_processes.py --make 4000   # its own data, in --workdir

`--make N` generates N ImageNet-like photos (benchmarks/make_imagenet_like.py) and uploads
them as FFCV's recipe has them (`upload --max-side 256`: raw pixels, the default there).
Figures depend on the machine and on what else runs on it: the JSON records both.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from fairness import every_core, machine_busy_s
from proc_stats import process_cpu_s
from read_throughput import DEFAULT_ROOT
from stop_cleanly import exit_cleanly_on_signals

DATASET = "photos-256"
MAX_SIDE = 256
# The decoders' token: they listen on loopback for this benchmark's trainer only.
TOKEN = "decode-in-processes-benchmark-token-0"


def parse_variant(text: str) -> tuple[int, int]:
    """(decoders, threads each) of a variant: (0, 0) for `threads`."""
    if text == "threads":
        return 0, 0
    kind, _, shape = text.partition(":")
    decoders, _, threads = shape.partition("x")
    if kind != "processes" or not decoders.isdigit() or not threads.isdigit() \
            or int(decoders) < 1 or int(threads) < 1:
        raise argparse.ArgumentTypeError(
            f"a variant is 'threads' or 'processes:NxT' (N decoders of T threads), got {text!r}")
    return int(decoders), int(threads)


def variant_arg(text: str) -> str:
    """argparse's check of a variant: refused before anything runs."""
    parse_variant(text)
    return text


def role_measure(storage: str, dataset: str, variant: str, images: int,
                 warmup: int) -> dict[str, Any]:
    """One variant's window, in this (child) process: its decoders started here first."""
    from trainfeed.decoder.process import DecoderProcess

    decoders, threads = parse_variant(variant)
    with contextlib.ExitStack() as stack:  # each decoder stopped, even if a later one fails
        started = [stack.enter_context(DecoderProcess(storage, TOKEN, threads=threads))
                   for _ in range(decoders)]
        if started:
            os.environ.update(TRAINFEED_DECODE="remote", TRAINFEED_TOKEN=TOKEN,
                              TRAINFEED_DECODERS=",".join(d.address for d in started))
        return measure_window(storage, dataset, images, warmup, [d.proc.pid for d in started])


def measure_window(storage: str, dataset: str, images: int, warmup: int,
                   decoder_pids: Sequence[int] = ()) -> dict[str, Any]:
    """The train read's window in this process: images/s, the cores this process and the
    decoders `decoder_pids` kept busy, their CPU per image, and the foreign load beside them
    (benchmarks/reader_bounds.py measures its variants with it too)."""
    from imagenet_methods import trainfeed_batches

    batches = trainfeed_batches(dataset, storage, "train")
    seen = 0
    while seen < warmup:
        seen += len(next(batches))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    trainer0 = usage.ru_utime + usage.ru_stime
    decoders0 = sum(process_cpu_s(pid) for pid in decoder_pids)
    machine0, wall0, load = machine_busy_s(), time.perf_counter(), os.getloadavg()[0]
    seen = 0
    while seen < images:
        seen += len(next(batches))
    wall = time.perf_counter() - wall0
    machine = machine_busy_s() - machine0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    trainer = usage.ru_utime + usage.ru_stime - trainer0
    decoders = sum(process_cpu_s(pid) for pid in decoder_pids) - decoders0
    return {"images": seen, "seconds": round(wall, 3),
            "images_per_s": round(seen / wall, 1),
            "cores_busy": round((trainer + decoders) / wall, 3),
            "trainer_cores": round(trainer / wall, 3),
            "decoder_cores": round(decoders / wall, 3),
            "cpu_ms_per_image": round((trainer + decoders) / seen * 1e3, 4),
            "trainer_ms_per_image": round(trainer / seen * 1e3, 4),
            "decoder_ms_per_image": round(decoders / seen * 1e3, 4),
            "foreign_cores": round(max(0.0, machine - trainer - decoders) / wall, 3),
            "loadavg_1m": round(load, 2)}


def run_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """`variant`'s window measured in a child process of its own (a clean environment: remote
    decode is chosen by environment variables)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", variant, "--storage",
           args.storage, "--dataset", args.dataset, "--images", str(args.images),
           "--warmup", str(args.warmup)]
    # A session of its own: however this run ends, its decoders go with it (killpg).
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=args.timeout)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{stderr[-3000:]}")
    return {"variant": variant, **json.loads(stdout.splitlines()[-1])}


def table(rows: Sequence[dict[str, Any]], variants: Sequence[str]) -> str:
    """Medians per variant (min-max of images/s), in the order asked."""
    out = [f"| variant | images/s median (min-max) | cores busy (of {every_core()}) | "
           f"CPU ms/image: trainer + decoders | foreign cores | load 1m |",
           "|---|---:|---:|---:|---:|---:|"]
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        rates = [r["images_per_s"] for r in mine]

        def median(key: str, of: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in of)
        out.append(f"| {variant} | {median('images_per_s'):,.0f} ({min(rates):,.0f}-"
                   f"{max(rates):,.0f}) | {median('cores_busy'):.2f} | "
                   f"{median('cpu_ms_per_image'):.3f}: {median('trainer_ms_per_image'):.3f} + "
                   f"{median('decoder_ms_per_image'):.3f} | {median('foreign_cores'):.2f} | "
                   f"{median('loadavg_1m'):.2f} |")
    return "\n".join(out)


def make_storage(count: int, workdir: str) -> str:
    """`count` ImageNet-like photos uploaded with --max-side 256 (raw pixels) under WORKDIR,
    once: the storage folder."""
    from make_imagenet_like import ensure_dataset

    from trainfeed.ingest.options import default_raw_below
    from trainfeed.upload import UploadOptions, upload
    listing = ensure_dataset(os.path.join(workdir, "photos"), count)
    storage = os.path.join(workdir, "storage")
    if not os.path.exists(os.path.join(storage, DATASET)):
        upload(listing, DATASET, storage, UploadOptions(
            max_side=MAX_SIDE, raw_below=default_raw_below(MAX_SIDE)), progress=False)
    return storage


def window_parser(description: str, images: int, variant: Callable[[str], str],
                  variants: Sequence[str]) -> argparse.ArgumentParser:
    """The arguments of a benchmark of interleaved train-read windows, one variant per child
    process (this one's and benchmarks/reader_bounds.py's)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--storage", help="storage holding --dataset (or use --make)")
    p.add_argument("--dataset", default=DATASET)
    p.add_argument("--make", type=int, metavar="N",
                   help="generate N photos and upload them with --max-side 256 under --workdir")
    p.add_argument("--workdir", default=os.path.join(DEFAULT_ROOT, "decode-in-processes"),
                   help="where --make keeps its photos and dataset")
    p.add_argument("--images", type=int, default=images, help="images per window")
    p.add_argument("--warmup", type=int, default=2_048, help="images read before each window")
    p.add_argument("--rounds", type=int, default=3, help="windows per variant, interleaved")
    p.add_argument("--variants", nargs="+", type=variant, default=list(variants))
    p.add_argument("--timeout", type=float, default=600, help="seconds per window, at most")
    p.add_argument("--json", help="write every window and the machine here")
    p.add_argument("--role", type=variant, help=argparse.SUPPRESS)
    return p


def parsed(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.role is None and (args.storage is None) == (args.make is None):
        p.error("give --storage (with --dataset) or --make N")
    return args


def run_rounds(args: argparse.Namespace,
               run: Callable[[argparse.Namespace, str], dict[str, Any]],
               table_of: Callable[[Sequence[dict[str, Any]], Sequence[str]], str]) -> None:
    """Every variant's window, round by round; prints the table, writes the JSON."""
    if args.make:
        args.storage = make_storage(args.make, args.workdir)
    rows = []
    for round_ in range(args.rounds):
        for variant in args.variants:
            print(f"round {round_ + 1}: {variant} ...", file=sys.stderr, flush=True)
            rows.append({"round": round_ + 1, **run(args, variant)})
    print(table_of(rows, args.variants))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": [os.path.basename(sys.executable), *sys.argv],
                       "machine": {"nproc": os.cpu_count(), "cores": every_core(),
                                   "python": platform.python_version()},
                       "rows": rows}, f, indent=1)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # a window's child, and its decoders, are killed as a session
    args = parsed(window_parser(__doc__.split("\n\n")[0], 40_000, variant_arg,
                                ["threads", "processes:2x1"]), argv)
    if args.role:
        print(json.dumps(role_measure(args.storage, args.dataset, args.role, args.images,
                                      args.warmup)))
        return 0
    run_rounds(args, run_variant, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
