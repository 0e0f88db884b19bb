"""JPEGs for the region decoder's tests: natural-looking photos in every sampling, and a window
decoded the way trainfeed/worker/roi.py does (tests/worker/test_jpeg_region.py,
test_jpeg_restarts.py)."""
from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from trainfeed.upload import UploadOptions, upload
from trainfeed.worker import roi

region = roi._jpeg_region


def photo(height: int, width: int, sample: str = "flower.jpg") -> np.ndarray:
    """A natural photo (one of scikit-learn's samples, shipped with it: "flower.jpg" or
    "china.jpg") resized to (height, width)."""
    from sklearn.datasets import load_sample_image
    source = Image.fromarray(load_sample_image(sample))
    return np.asarray(source.resize((width, height), Image.Resampling.BICUBIC))


def encode(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def decode_window(data: bytes, left: int, top: int, width: int, height: int, scale: int = 1,
                  channels: int = 3) -> np.ndarray:
    out = np.empty(height * (width + region.MARGIN) * channels, np.uint8)
    row, dx = region.decode_region(data, out, left, top, width, height, scale, channels, False)
    assert row >= width and dx <= region.MARGIN
    return out[:height * row * channels].reshape(height, row, channels)[:, dx:dx + width]


def upload_photos(folder: Path, photos: Iterable[np.ndarray]) -> str:
    """Stores `photos` as JPEGs in dataset "photos" (labels a, b in turn; row groups of 8, so
    partitions of 8) under folder/storage, which it returns."""
    source = folder / "photos"
    (source / "images").mkdir(parents=True)
    lines = []
    for i, pixels in enumerate(photos):
        (source / f"images/{i:03d}.jpg").write_bytes(encode(pixels))
        lines.append(f"images/{i:03d}.jpg\t{'ab'[i % 2]}\n")
    (source / "train_data.list").write_text("".join(lines))
    storage = str(folder / "storage")
    upload(str(source / "train_data.list"), "photos", storage, UploadOptions(row_group_rows=8),
           progress=False)
    return storage
