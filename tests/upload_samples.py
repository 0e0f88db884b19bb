"""Lists of JPEG photos for the upload tests (tests/ingest/test_upload_parallel.py,
test_upload_resize.py): smooth gradients with noise, of varied sizes, so that some exceed a
--max-side and every one rewrites with restart markers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def photo_list(folder: Path, count: int = 60) -> Path:
    """`count` JPEGs of varied sizes (some larger than 64 px on a side), two labels."""
    (folder / "images").mkdir(parents=True)
    rng = np.random.default_rng(7)
    lines = []
    for i in range(count):
        height, width = int(rng.integers(24, 120)), int(rng.integers(24, 120))
        smooth = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
        pixels = np.clip(smooth + rng.normal(0, 20, (height, width, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"images/{i}.jpg", quality=90)
        lines.append(f"images/{i}.jpg\t{'ab'[i % 2]}\n")
    listing = folder / "photos.list"
    listing.write_text("".join(lines))
    return listing
