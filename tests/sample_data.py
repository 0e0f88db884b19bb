"""Small real datasets for tests: JPEG files and the .list that names them."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from PIL import Image


def make_image_list(folder: Path, count: int, labels: tuple[str, ...] = ("cat", "dog", "bird"),
                    size: int = 16, seed: int = 0, name: str = "train_data.list") -> Path:
    """Writes `count` distinct JPEGs under folder/images and a `path<TAB>label` list; returns it.

    Labels cycle through `labels`, so record id i has label labels[i % len(labels)].
    """
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        rng = np.random.default_rng((seed, i))
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        rel = f"images/{i:05d}.jpg"
        Image.fromarray(pixels).save(folder / rel, quality=85)
        lines.append(f"{rel}\t{labels[i % len(labels)]}\n")
    path = folder / name
    path.write_text("".join(lines))
    return path


def file_digests(list_path: Path) -> dict[int, tuple[str, str]]:
    """Record id -> (sha256 of the file's bytes, label), read straight from the source files."""
    out = {}
    for i, line in enumerate(l for l in list_path.read_text().splitlines() if l.strip()):
        rel, label = line.split("\t")
        out[i] = (hashlib.sha256((list_path.parent / rel).read_bytes()).hexdigest(), label)
    return out
