"""Ready-made augmentations for `TransformOptions(augment=[...])`: each takes a batch (dict of
arrays), a numpy Generator and its parameters, and returns the augmented batch. They run in
training mode only. Write your own with the same signature and name it "module:function"."""
from __future__ import annotations

from typing import Any

import numpy as np


def random_flip(batch: dict[str, Any], rng: np.random.Generator, field: str = "image",
                probability: float = 0.5) -> dict[str, Any]:
    """Mirrors each image left-right with `probability` (images are (n, H, W, C)).

    This copies the batch on the pipeline thread, serially. For decoded images prefer the
    decode stage's `DecodeOptions(random_flip=True)` (with `random_resized_crop=` or
    `resize_shorter=`): each decode thread mirrors its images in place while resizing them,
    seeded per record (docs/imagenet.md)."""
    images = np.array(batch[field])  # a copy: the batch may share memory with a buffer
    flip = rng.random(len(images)) < probability
    images[flip] = images[flip, :, ::-1]
    return {**batch, field: images}


def random_brightness(batch: dict[str, Any], rng: np.random.Generator, field: str = "image",
                      max_delta: float = 0.1) -> dict[str, Any]:
    """Adds one uniform offset in [-max_delta, max_delta] per image (float images)."""
    images = np.asarray(batch[field])
    if images.dtype.kind != "f":
        raise ValueError(f"random_brightness needs float images (normalizing_const=...), "
                         f"got {images.dtype}")
    delta = rng.uniform(-max_delta, max_delta, size=(len(images),) + (1,) * (images.ndim - 1))
    return {**batch, field: (images + delta).astype(images.dtype)}
