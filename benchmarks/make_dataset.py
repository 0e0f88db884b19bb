"""Synthetic image datasets for the benchmarks: N small JPEGs and their `train_data.list`.

Every benchmark that needs images makes them with this script, so a user who clones the repository
reproduces each figure in docs/benchmarks.md without any other folder. The images are built to
cost what real small photos cost to decode: a smooth two-colour background, a few random
ellipses, the class drawn as a regular polygon with `label + 3` corners, and mild Gaussian noise,
saved at JPEG quality 90 (2-4 KB at 64x64, like thumbnails of photos, not the few hundred bytes of
a flat synthetic image). Everything is a pure function of `--seed`: image i draws from its own
random stream (seed, i), so the same command gives byte-identical files on any machine with the
same Pillow/libjpeg.

    python benchmarks/make_dataset.py --out DIR                 # 20,000 images, 10 balanced classes
    python benchmarks/make_dataset.py --out DIR --imbalanced    # class k has weight 2^-k
    python benchmarks/make_dataset.py --out DIR -n 2000 --size 320
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

NUM_CLASSES = 10
LIST_NAME = "train_data.list"


def class_probabilities(imbalanced: bool) -> np.ndarray:
    """Balanced, or class k with weight 2^-k (a long tail for the rebalancing benchmark)."""
    weights = 0.5 ** np.arange(NUM_CLASSES) if imbalanced else np.ones(NUM_CLASSES)
    return weights / weights.sum()


def draw_image(rng: np.random.Generator, label: int, size: int) -> Image.Image:
    """One image of class `label` (see the module docstring for what it holds and why)."""
    ramp = np.linspace(0.0, 1.0, size)
    angle = rng.uniform(0, math.tau)
    mix = (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None] + 1.5) / 3.0
    start, stop = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    background = start + (stop - start) * mix[..., None]
    image = Image.fromarray(background.astype(np.uint8), "RGB")
    pen = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy, radius = *rng.uniform(0, size, 2), rng.uniform(size / 20, size / 5)
        pen.ellipse((cx - radius, cy - radius, cx + radius, cy + radius),
                    fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    corners = label + 3
    cx, cy = rng.uniform(0.3 * size, 0.7 * size, 2)
    radius, turn = rng.uniform(0.15 * size, 0.35 * size), rng.uniform(0, math.tau)
    pen.polygon([(cx + radius * math.cos(turn + math.tau * k / corners),
                  cy + radius * math.sin(turn + math.tau * k / corners)) for k in range(corners)],
                fill=tuple(int(c) for c in rng.integers(0, 256, 3)), outline=(0, 0, 0))
    noisy = np.asarray(image, np.float32) + rng.normal(0.0, 8.0, (size, size, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def make_dataset(out: str, count: int, size: int = 64, seed: int = 0,
                 imbalanced: bool = False, quality: int = 90) -> dict[str, object]:
    """Writes OUT/images/NNNNNN.jpg and OUT/train_data.list; returns a summary."""
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    labels = np.random.default_rng(seed).choice(NUM_CLASSES, size=count,
                                                p=class_probabilities(imbalanced))
    total = 0
    lines = []
    for i, label in enumerate(labels.tolist()):
        rel = f"images/{i:06d}.jpg"
        path = os.path.join(out, rel)
        draw_image(np.random.default_rng((seed, i)), label, size).save(path, "JPEG",
                                                                       quality=quality)
        total += os.path.getsize(path)
        lines.append(f"{rel}\t{label}\n")
    tmp = os.path.join(out, LIST_NAME + ".tmp")
    with open(tmp, "w") as f:  # the list last: its presence means the images are all there
        f.writelines(lines)
    os.replace(tmp, os.path.join(out, LIST_NAME))
    return {"images": count, "size": size, "jpeg_bytes": total,
            "mean_jpeg_bytes": round(total / max(count, 1)),
            "class_counts": np.bincount(labels, minlength=NUM_CLASSES).tolist()}


def ensure_dataset(out: str, count: int = 20_000, **kwargs: object) -> str:
    """The list of a dataset made with these arguments, generating it on first use."""
    list_path = os.path.join(out, LIST_NAME)
    if not os.path.exists(list_path):
        print(f"generating {count} images in {out} ...", file=sys.stderr, flush=True)
        make_dataset(out, count, **kwargs)  # type: ignore[arg-type]
    return list_path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--out", required=True, help="folder to write images/ and train_data.list")
    p.add_argument("-n", "--count", type=int, default=20_000, help="number of images")
    p.add_argument("--size", type=int, default=64, help="side of the square images, pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    p.add_argument("--imbalanced", action="store_true", help="class k has weight 2^-k")
    args = p.parse_args(argv)
    summary = make_dataset(args.out, args.count, args.size, args.seed, args.imbalanced,
                           args.quality)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
