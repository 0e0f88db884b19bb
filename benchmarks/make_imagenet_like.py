"""ImageNet-like JPEGs for benchmarks/imagenet_like.py: natural-photo content at ImageNet's sizes.

ImageNet's training JPEGs average about 400x350-500x400 pixels and ~110 KB; what makes them cost
what they cost to decode is photo content (texture, edges, sensor noise) at those sizes, not the
objects they show. Each image here is a window of one of scikit-learn's two sample photos
(`sklearn.datasets.load_sample_images`: a temple in China and a flower, 640x427 each), of a
random aspect ratio (3 in 4 landscape), scaled so that its sides fall in 300-640 px (mean about
475x405), mirrored half of the time, with its colours jittered (brightness, contrast,
saturation), an unsharp mask and Gaussian "sensor" noise, saved by Pillow at quality 90 with
4:2:0 chroma subsampling (the camera default). That lands at ~80 KB per image. Image i depends on
(seed, i) only, so the same command writes the same files on any machine with the same Pillow.

Labels are i mod 10, one folder per class, listed in OUT/train_data.list (`path<TAB>label`),
written last; OUT/summary.json records sizes and bytes.

    python benchmarks/make_imagenet_like.py --out DIR -n 10000
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

NUM_CLASSES = 10
LIST_NAME = "train_data.list"
# Sides of ImageNet-like images (ILSVRC-2012 train: most images between these after the usual
# 500 px long-side scaling of Flickr photos; a few are larger).
MIN_SIDE, MAX_SIDE = 300, 640
# Per-pixel Gaussian noise, grey levels: tuned so that the mean file is ~80 KB at quality 90,
# as a real photo's sensor noise and fine texture make it.
NOISE_SIGMA = 8.0


def sample_photos() -> list[Image.Image]:
    """scikit-learn's sample photos as RGB Pillow images (shipped with the package: no download)."""
    from sklearn.datasets import load_sample_images
    return [Image.fromarray(np.asarray(photo, np.uint8)) for photo in load_sample_images().images]


def output_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) of one image: a landscape (3 in 4) or portrait aspect, sides 300-640."""
    landscape = rng.random() < 0.75
    aspect = rng.uniform(1.15, 1.5)  # long side / short side
    long_side = rng.uniform(400, MAX_SIDE) if landscape else rng.uniform(360, 560)
    short_side = max(MIN_SIDE, long_side / aspect)
    width, height = (long_side, short_side) if landscape else (short_side * 0.95, long_side)
    return int(np.clip(width, MIN_SIDE, MAX_SIDE)), int(np.clip(height, MIN_SIDE, MAX_SIDE))


def make_image(photos: Sequence[Image.Image], rng: np.random.Generator,
               long_side: int | None = None) -> Image.Image:
    """One ImageNet-like image (see the module docstring for what it is made of and why).
    `long_side` scales its drawn size so that the longer side has that many pixels, aspect kept
    (benchmarks/restarts_by_size.py); the texture and noise are made at the output's size, as a
    camera's are, not scaled with it."""
    photo = photos[int(rng.integers(len(photos)))]
    width, height = output_size(rng)
    if long_side is not None:
        scale = long_side / max(width, height)
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    # A window of the photo with the output's aspect ratio, 60-100% of the largest one that fits.
    fit = min(photo.width / width, photo.height / height)
    scale = fit * rng.uniform(0.6, 1.0)
    win_w, win_h = width * scale, height * scale
    left = rng.uniform(0, photo.width - win_w)
    top = rng.uniform(0, photo.height - win_h)
    image = photo.resize((width, height), Image.Resampling.LANCZOS,
                         box=(left, top, left + win_w, top + win_h))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.75, 1.25))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.8, 1.25))
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    image = image.filter(ImageFilter.UnsharpMask(radius=1.5, percent=int(rng.integers(40, 120)),
                                                 threshold=2))
    noise = rng.standard_normal((height, width, 3), dtype=np.float32) * NOISE_SIGMA
    noisy = np.asarray(image, np.float32) + noise
    return Image.fromarray(np.clip(noisy + 0.5, 0, 255).astype(np.uint8), "RGB")


def make_dataset(out: str, count: int, seed: int = 0, quality: int = 90,
                 long_side: int | None = None) -> dict[str, object]:
    """Writes OUT/<class>/NNNNNN.jpg, OUT/train_data.list and OUT/summary.json; returns the
    summary. `long_side`: see make_image."""
    photos = sample_photos()
    lines = []
    sizes = np.zeros((count, 2), np.int64)
    nbytes = np.zeros(count, np.int64)
    for i in range(count):
        label = i % NUM_CLASSES
        rel = f"class{label}/{i:06d}.jpg"
        os.makedirs(os.path.join(out, f"class{label}"), exist_ok=True)
        image = make_image(photos, np.random.default_rng((seed, i)), long_side)
        path = os.path.join(out, rel)
        image.save(path, "JPEG", quality=quality, subsampling="4:2:0")
        sizes[i] = image.size
        nbytes[i] = os.path.getsize(path)
        lines.append(f"{rel}\t{label}\n")
    tmp = os.path.join(out, LIST_NAME + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:  # the list last: it means all images are there
        f.writelines(lines)
    os.replace(tmp, os.path.join(out, LIST_NAME))
    summary = {
        "images": count, "classes": NUM_CLASSES, "seed": seed, "quality": quality,
        "mean_bytes": round(float(nbytes.mean())) if count else 0,
        "p10_p90_bytes": np.percentile(nbytes, [10, 90]).round().tolist() if count else [],
        "mean_width": round(float(sizes[:, 0].mean()), 1) if count else 0,
        "mean_height": round(float(sizes[:, 1].mean()), 1) if count else 0,
        "min_side": int(sizes.min()) if count else 0, "max_side": int(sizes.max()) if count else 0,
        "landscape": int((sizes[:, 0] > sizes[:, 1]).sum()),
        **({"long_side": long_side} if long_side is not None else {}),
    }
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary


def ensure_dataset(out: str, count: int, seed: int = 0, long_side: int | None = None) -> str:
    """The list file of OUT, generating the images on first use (or if the count differs).
    `long_side`: see make_image (one folder per size: only the count is checked)."""
    list_path = os.path.join(out, LIST_NAME)
    if os.path.exists(list_path):
        with open(list_path, encoding="utf-8") as f:
            if sum(1 for line in f if line.strip()) == count:
                return list_path
    print(f"generating {count} ImageNet-like JPEGs in {out} ...", file=sys.stderr, flush=True)
    make_dataset(out, count, seed, long_side=long_side)
    return list_path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--out", required=True, help="folder for the class folders and the list")
    p.add_argument("-n", "--count", type=int, default=10_000, help="number of images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    args = p.parse_args(argv)
    print(json.dumps(make_dataset(args.out, args.count, args.seed, args.quality)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
