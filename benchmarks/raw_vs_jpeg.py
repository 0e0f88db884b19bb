"""CPU per image of the training crop from a small JPEG against the same crop from raw pixels
(issue 39, item 3: where `upload --raw-below` pays).

Data: ImageNet-like photos (benchmarks/make_imagenet_like.py), shrunk as `upload --max-side N
--quality 90` shrinks them (trainfeed.ingest.transform: the same code), and the same images as
raw pixel records (what `--raw-below` stores: the resized pixels). Both are held in memory.

What is timed, in this process, on one thread: trainfeed's decode stage
(`ImageDecoder(crops=RandomResizedCrop 224 + flip)`), every image once per pass, alternating
JPEG and raw pass by pass; CPU seconds of this process (`time.process_time`) per image, the
median of `--passes`. benchmarks/fairness.py records the busy cores (of the 1 asked for) and
the foreign load over each pass; the ratio is printed only when every pass was fair.

    python benchmarks/raw_vs_jpeg.py --images 300 --max-side 256 --passes 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

from fairness import PassMeter, pass_ratios_text
from make_imagenet_like import ensure_dataset
from read_throughput import DEFAULT_ROOT

from trainfeed.decode import raw
from trainfeed.decode.crops import DEFAULT_RATIO, DEFAULT_SCALE, CropOptions
from trainfeed.decode.pixel_budget import max_image_pixels
from trainfeed.decode.pixels import ImageDecoder
from trainfeed.ingest.transform import shrink, stored_pixels


def datasets(list_path: str, max_side: int) -> tuple[list[bytes], list[bytes]]:
    """(JPEGs as --max-side stores them, the same images as raw records)."""
    folder = os.path.dirname(list_path)
    budget = max_image_pixels()
    jpegs, raws = [], []
    with open(list_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                with open(os.path.join(folder, line.split("\t", 1)[0]), "rb") as image:
                    data = image.read()
                jpegs.append(shrink(data, max_side, 90, budget))
                pixels = stored_pixels(data, max_side, budget)
                assert pixels is not None
                raws.append(raw.encode(pixels[0]))
    return jpegs, raws


def one_pass(decoder: ImageDecoder, blobs: Sequence[bytes], epoch: int) -> tuple[float, float]:
    """(CPU s per image, wall s) of one pass over `blobs` in batches of 256."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    for start in range(0, len(blobs), 256):
        chunk = blobs[start:start + 256]
        ids = list(range(start, start + len(chunk)))
        decoder.decode(chunk, [str(i) for i in ids], ids, seed=0, epoch=epoch)
    return (time.process_time() - cpu0) / len(blobs), time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--max-side", type=int, default=256)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--data", default=os.path.join(DEFAULT_ROOT, "raw-vs-jpeg"))
    args = p.parse_args(argv)
    jpegs, raws = datasets(ensure_dataset(args.data, args.images), args.max_side)
    decoder = ImageDecoder(crops=CropOptions((224, 224), random_resized_crop=(
        DEFAULT_SCALE, DEFAULT_RATIO), flip=0.5), threads=1)
    one_pass(decoder, jpegs[:32], 0)  # OpenCV's import, the decoders' first calls
    results: dict[str, list[float]] = {"jpeg": [], "raw": []}
    loads: dict[str, list] = {"jpeg": [], "raw": []}
    for k in range(args.passes):
        for kind in (("jpeg", "raw") if k % 2 == 0 else ("raw", "jpeg")):
            with PassMeter(1, own_cpu_s=time.process_time) as meter:
                cpu, _ = one_pass(decoder, jpegs if kind == "jpeg" else raws, k)
            results[kind].append(cpu)
            loads[kind].append(meter.load(kind))
    jpeg_ms, raw_ms = (1000 * statistics.median(results[k]) for k in ("jpeg", "raw"))
    passes = [(results["jpeg"][k] / results["raw"][k], [loads["jpeg"][k], loads["raw"][k]])
              for k in range(args.passes)]
    print(f"| stored as | KB per image | CPU ms per image (median of {args.passes}) | "
          f"cores busy | foreign cores |\n|---|---:|---:|---:|---:|")
    for kind, blobs, ms in (("jpeg q90", jpegs, jpeg_ms), ("raw", raws, raw_ms)):
        side = loads[kind.split()[0]]
        print(f"| {kind} | {sum(map(len, blobs)) / len(blobs) / 1e3:.1f} | {ms:.3f} | "
              f"{statistics.median(s.cores_busy for s in side):.2f} | "
              f"{statistics.median(s.foreign_cores for s in side):.2f} |")
    print(f"\nJPEG CPU / raw CPU at max side {args.max_side}: {pass_ratios_text(passes)}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(json.dumps({"max_side": args.max_side, "images": len(jpegs), "jpeg_ms": jpeg_ms,
                      "raw_ms": raw_ms, "passes": [(round(r, 3), [s.as_dict() for s in sides])
                                                   for r, sides in passes]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
