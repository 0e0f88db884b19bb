"""Where `upload --jpeg-restarts` pays off: CPU per training image by image size, plain against
restart-indexed uploads of the same photos.

Restart markers let a crop's window be decoded alone (docs/imagenet.md), but each interval costs
the region decoder a little work (a marker scan, a sub-image built, per-interval margins). On
photos much larger than the 224 px crop the skipped entropy decoding wins; on small photos the
window is most of the image and there is little to skip. This benchmark finds the size where
the two meet.

Data: for each `--sizes` value L, `--images` ImageNet-like photos (benchmarks/make_imagenet_like.py,
the same scenes and aspect ratios at every size) scaled so that their longer side is L px,
generated on first use into DATA/L/ and uploaded twice (untimed): plainly and with
`--jpeg-restarts`.

What is timed: the local reader (TRAIN_LOCAL style, `source=LocalSource(...)`) with the options of
benchmarks/imagenet_like.py's `train` workload (RandomResizedCrop 224 + flip, uint8, batches of
256, shuffle_buffer 1024). The figure is this process's CPU time (every thread: the decode
threads run here) per image, not wall time: on a shared, loaded machine wall time measures the
neighbours. Each reader reads one untimed pass first; then `--passes` measurements each, the two
uploads alternating (plain first in even rounds, restarts first in odd ones). A measurement
reads as many passes over the images as take `--min-cpu` seconds of CPU (the count set by the
untimed pass, the same for both uploads): one pass of 400 small images is ~0.1 s, too short to
time among busy neighbours. Both readers go through the same epochs, so they cut the same crops.
Reported per size: the median CPU ms per image of each upload, their ratio (plain / restarts:
above 1 restarts save CPU), and the range of the per-round ratios; then the crossover, the
longer side (interpolated on a log scale) above which restarts pay off.

    python benchmarks/restarts_by_size.py                      # 10 sizes x 400 images
    python benchmarks/restarts_by_size.py --sizes 256 400 640 --images 200 --passes 9
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from imagenet_methods import BATCH, SIZE, trainfeed_options
from make_imagenet_like import ensure_dataset
from read_throughput import DEFAULT_ROOT

from trainfeed import LocalSource, PipelineOptions, dist
from trainfeed.upload import UploadOptions, upload

SIZES = (128, 192, 256, 320, 400, 500, 640, 800, 1000, 1400)
# 400 images: one full and one partial batch of 256 per pass, 0.1-2 s of CPU a pass (small
# sizes repeat passes up to --min-cpu), so that 10 sizes x 2 uploads x (1 + 5) measurements
# take ~4 minutes on a loaded 2-core machine (2026-11-25), after ~5 minutes of generating the
# images on first use.
DEFAULT_IMAGES = 400
UPLOADS = {"plain": UploadOptions(overwrite=True),
           "restarts": UploadOptions(overwrite=True, jpeg_restarts=True)}
ROOT = os.path.join(DEFAULT_ROOT, "restarts-by-size")


def dataset_name(long_side: int, upload_kind: str) -> str:
    return f"restarts-by-size-{long_side}-{upload_kind}"


def prepare(data: str, storage: str, long_side: int, images: int) -> dict[str, Any]:
    """Generates (first use) and uploads (no-op when done) one size; returns its data summary."""
    folder = os.path.join(data, str(long_side))
    list_path = ensure_dataset(folder, images, long_side=long_side)
    for kind, options in UPLOADS.items():
        upload(list_path, dataset_name(long_side, kind), storage, options, progress=False)
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
        summary: dict[str, Any] = json.load(f)
    return summary


def timed_passes(reader: Any, passes: int = 1) -> dict[str, float]:
    """`passes` passes of `reader`: images, process CPU seconds (all threads), wall seconds."""
    cpu0, wall0, images = time.process_time(), time.perf_counter(), 0
    for _ in range(passes):
        for batch in reader():
            image = batch["image"]
            # The last batch of a pass may be partial (no drop_last).
            assert image.dtype == np.uint8 and image.shape[1:] == (SIZE, SIZE, 3), image.shape
            assert 0 < len(image) <= BATCH, len(image)
            images += len(image)
    return {"images": images, "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - wall0, "loadavg_1m": os.getloadavg()[0]}


def measure_size(storage: str, long_side: int, passes: int,
                 min_cpu_s: float) -> list[dict[str, Any]]:
    """The interleaved measurements of one size, after one untimed pass per upload. A
    measurement reads as many passes as make `min_cpu_s` of CPU (the same number for both
    uploads): a pass of small images is too short to time on a loaded machine."""
    pipeline = PipelineOptions.from_keywords(**trainfeed_options("train"))
    readers = {kind: dist.reader(dataset_name(long_side, kind), source=LocalSource(storage),
                                 pipeline=pipeline)
               for kind in UPLOADS}
    rows = []
    try:
        # Warm: page cache, decode threads, buffers.
        warm = min(timed_passes(reader)["cpu_s"] for reader in readers.values())
        epochs = max(1, math.ceil(min_cpu_s / max(warm, 1e-3)))
        for k in range(passes):
            kinds = list(UPLOADS) if k % 2 == 0 else list(reversed(UPLOADS))
            for kind in kinds:
                row: dict[str, Any] = {"long_side": long_side, "upload": kind, "pass": k,
                                       "epochs": epochs,
                                       **timed_passes(readers[kind], epochs)}
                row["cpu_ms_per_image"] = 1000 * row["cpu_s"] / row["images"]
                print(f"    {long_side} px, pass {k} ({epochs} epochs), {kind}: "
                      f"{row['cpu_ms_per_image']:.3f} ms CPU/image, "
                      f"load {row['loadavg_1m']:.1f}", file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        for reader in readers.values():
            reader.close()
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size: median CPU ms/image of each upload, their ratio, the per-round ratios' range."""
    out = []
    for long_side in sorted({r["long_side"] for r in rows}):
        ms = {kind: {r["pass"]: r["cpu_ms_per_image"] for r in rows
                     if r["long_side"] == long_side and r["upload"] == kind}
              for kind in UPLOADS}
        plain, restarts = (statistics.median(ms[kind].values()) for kind in UPLOADS)
        paired = [ms["plain"][k] / ms["restarts"][k] for k in ms["plain"] if k in ms["restarts"]]
        out.append({"long_side": long_side, "plain_ms": plain, "restarts_ms": restarts,
                    "ratio": plain / restarts, "pass_ratios": paired,
                    "passes": len(paired)})
    return out


def crossover(summary: Sequence[dict[str, Any]]) -> str:
    """Where plain / restarts crosses 1 for good, interpolated between the two sizes around it
    on a log scale of the longer side."""
    if not summary:
        return "no sizes measured"
    above = [s["ratio"] >= 1 for s in summary]
    if all(above):
        return (f"--jpeg-restarts saved CPU at every size measured (from "
                f"{summary[0]['long_side']} px)")
    if not above[-1]:
        return (f"--jpeg-restarts cost CPU at the largest size measured "
                f"({summary[-1]['long_side']} px): no crossover")
    last_below = max(i for i, ok in enumerate(above) if not ok)
    a, b = summary[last_below], summary[last_below + 1]
    t = (1 - a["ratio"]) / (b["ratio"] - a["ratio"])
    side = math.exp(math.log(a["long_side"]) + t * (math.log(b["long_side"]) -
                                                    math.log(a["long_side"])))
    return (f"crossover: --jpeg-restarts saves CPU from a longer side of ~{side:.0f} px "
            f"(ratio {a['ratio']:.2f} at {a['long_side']} px, {b['ratio']:.2f} at "
            f"{b['long_side']} px)")


def render(summary: Sequence[dict[str, Any]], data: dict[int, dict[str, Any]]) -> str:
    lines = ["| longer side | mean size (w×h) | mean KB | plain CPU ms/image | "
             "--jpeg-restarts CPU ms/image | plain / restarts | per-round ratios (min-max) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        d = data[s["long_side"]]
        lines.append(
            f"| {s['long_side']} px | {d['mean_width']:.0f}×{d['mean_height']:.0f} | "
            f"{d['mean_bytes'] / 1000:.0f} | {s['plain_ms']:.3f} | {s['restarts_ms']:.3f} | "
            f"{s['ratio']:.2f}x | {min(s['pass_ratios']):.2f}-{max(s['pass_ratios']):.2f} "
            f"(n={s['passes']}) |")
    return "\n".join(lines) + "\n\n" + crossover(summary)


def run(args: argparse.Namespace) -> int:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data: dict[int, dict[str, Any]] = {}
    for long_side in args.sizes:
        print(f"{long_side} px: data and uploads ...", file=sys.stderr, flush=True)
        data[long_side] = prepare(args.data, args.storage, long_side, args.images)
    rows: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    for long_side in args.sizes:
        print(f"{long_side} px: reading ...", file=sys.stderr, flush=True)
        rows += measure_size(args.storage, long_side, args.passes, args.min_cpu)
    summary = summarize(rows)
    table = render(summary, data)
    print(table)
    result = {"benchmark": "restarts_by_size", "started_at": started,
              "command": [os.path.basename(sys.executable), *sys.argv],
              "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
              "data": {str(k): v for k, v in data.items()},
              "settings": {k: v for k, v in vars(args).items() if k != "func"},
              "workload": trainfeed_options("train"), "rows": rows, "summary": summary,
              "table_markdown": table}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                   help="longer sides, px (default: %(default)s)")
    p.add_argument("--images", type=int, default=DEFAULT_IMAGES, help="images per size")
    p.add_argument("--passes", type=int, default=5,
                   help="timed measurements per upload and size (median; default %(default)s)")
    p.add_argument("--min-cpu", type=float, default=0.5,
                   help="CPU seconds a measurement lasts at least: small images are read for "
                        "several epochs (default %(default)s)")
    p.add_argument("--data", default=os.path.join(ROOT, "data"),
                   help="generated JPEGs, one folder per size")
    p.add_argument("--storage", default=os.path.join(ROOT, "storage"),
                   help="trainfeed storage for the uploads")
    p.add_argument("--json", default=os.path.join(ROOT, "results.json"))
    args = p.parse_args(argv)
    for name in ("images", "passes"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be ≥ 1, got {getattr(args, name)}")
    if args.min_cpu < 0:
        p.error(f"--min-cpu must be ≥ 0, got {args.min_cpu}")
    if min(args.sizes) < 16:
        p.error(f"--sizes must be ≥ 16 px, got {min(args.sizes)}")
    args.sizes = sorted(set(args.sizes))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
