"""The input pipelines benchmarks/imagenet_like.py times: one function per tool and workload.

Every method yields batches of 256 uint8 images of 224x224x3 (or 3x224x224) and runs over as
many epochs as it is asked for batches. The workloads:

- `val`: decode, resize the shorter side to 256, centre-crop 224 (torchvision's Resize(256) +
  CenterCrop(224), tf.data's and DALI's equivalents);
- `train`: RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) and a random horizontal
  flip.

Each method does the closest thing its tool has; `OPS[method][workload]` says exactly what, and
the harness records it beside every figure. torchvision cannot be installed beside this
machine's CPU build of torch (its PyPI wheel is a CUDA build whose C ops fail to load), so the
PyTorch DataLoader row uses the Pillow transforms below, which are what torchvision's do on PIL
images: RandomResizedCrop's window (trainfeed.decode.crops implements its documented sampling)
then `Image.resize(..., BILINEAR, box=window)` (torchvision's `resized_crop` on PIL),
`transpose(FLIP_LEFT_RIGHT)`, and `PILToTensor` (a CHW uint8 tensor).
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image

from trainfeed.decode.crops import DEFAULT_RATIO, DEFAULT_SCALE, DRAWS, random_resized_crop

SIZE = 224
SHORTER = 256
BATCH = 256
WORKLOADS = ("val", "train")

OPS: dict[str, dict[str, str]] = {
    "plain": {
        "val": "Pillow open+convert, resize shorter 256 (bilinear, antialiased), centre crop 224",
        "train": "Pillow open+convert, RRC window, resize(box=window) 224 (bilinear), flip"},
    "torch": {
        "val": "DataLoader(2 workers): Pillow Resize(256)+CenterCrop(224)+PILToTensor",
        "train": "DataLoader(2 workers): Pillow RandomResizedCrop(224)+HorizontalFlip+"
                 "PILToTensor"},
    "tfdata": {
        "val": "decode_jpeg + resize shorter 256 (bilinear) + central crop 224, AUTOTUNE",
        "train": "extract_jpeg_shape + sample_distorted_bounding_box + decode_and_crop_jpeg + "
                 "flip + resize 224 (bilinear), AUTOTUNE (the official ResNet recipe)"},
    "dali": {
        "val": "CPU: decoders.image + resize(resize_shorter=256) + crop 224, 2 threads",
        "train": "CPU: decoders.image_random_crop (ROI decode) + resize 224 + flip, 2 threads"},
    "grain": {
        "val": "MapDataset + mp_prefetch(2 workers, 1 thread each): the Pillow ops of `plain`",
        "train": "MapDataset + mp_prefetch(2 workers, 1 thread each): the Pillow ops of "
                 "`plain`"},
    "trainfeed-local": {
        "val": "dist.reader(local, decode, image_size=224, resize_shorter=256, "
               "mode=validation), uint8",
        "train": "dist.reader(local, decode, image_size=224, random_resized_crop, random_flip, "
                 "shuffle_buffer=1024), uint8"},
    "trainfeed-dist": {
        "val": "master + 2 reader processes, the options of trainfeed-local",
        "train": "master + 2 reader processes, the options of trainfeed-local"},
    "trainfeed-local-rst": {
        "val": "trainfeed-local on the dataset uploaded with --jpeg-restarts",
        "train": "trainfeed-local on the dataset uploaded with --jpeg-restarts"},
    "trainfeed-dist-rst": {
        "val": "trainfeed-dist on the dataset uploaded with --jpeg-restarts",
        "train": "trainfeed-dist on the dataset uploaded with --jpeg-restarts"},
}
METHODS = tuple(OPS)
# The dataset each trainfeed method reads: the plain upload, or the one with restart markers
# (`trainfeed upload --jpeg-restarts`, the same images, pixel for pixel).
DATASET = "imagenet-like"
RESTARTS_DATASET = "imagenet-like-restarts"


def dataset_of(method: str) -> str:
    return RESTARTS_DATASET if method.endswith("-rst") else DATASET


def read_list(data: str) -> tuple[list[str], list[int]]:
    """Absolute paths and labels of DATA/train_data.list."""
    base = os.path.abspath(data)
    paths, labels = [], []
    with open(os.path.join(base, "train_data.list"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rel, label = line.rstrip("\n").split("\t")
                paths.append(os.path.join(base, rel))
                labels.append(int(label))
    return paths, labels


# -- Pillow ops with torchvision's semantics (plain loop, DataLoader, Grain) ---------------------
def pil_val(path: str) -> np.ndarray:
    """Resize(256) + CenterCrop(224), as torchvision does them on a PIL image."""
    with Image.open(path) as image:
        image = image.convert("RGB")
    w, h = image.size
    if w <= h:
        size = (SHORTER, int(SHORTER * h / w))
    else:
        size = (int(SHORTER * w / h), SHORTER)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left = int(round((size[0] - SIZE) / 2.0))
    top = int(round((size[1] - SIZE) / 2.0))
    return np.asarray(image.crop((left, top, left + SIZE, top + SIZE)))


def pil_train(path: str, rng: random.Random) -> np.ndarray:
    """RandomResizedCrop(224) + RandomHorizontalFlip on a PIL image."""
    with Image.open(path) as image:
        image = image.convert("RGB")
    w, h = image.size
    win = random_resized_crop(h, w, [rng.random() for _ in range(DRAWS)], DEFAULT_SCALE,
                              DEFAULT_RATIO)
    image = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR,
                         box=(win.left, win.top, win.left + win.width, win.top + win.height))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)


def plain_batches(paths: Sequence[str], workload: str) -> Iterator[np.ndarray]:
    rng = random.Random(0)
    order = list(range(len(paths)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - BATCH + 1, BATCH):
            chunk = order[start:start + BATCH]
            yield np.stack([pil_val(paths[i]) if workload == "val" else pil_train(paths[i], rng)
                            for i in chunk])


def torch_batches(paths: Sequence[str], workload: str) -> Iterator[Any]:
    import torch

    class Files(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> Any:
            rng = random.Random()
            image = pil_val(paths[i]) if workload == "val" else pil_train(paths[i], rng)
            return torch.from_numpy(image).permute(2, 0, 1)  # PILToTensor: CHW uint8

    loader = torch.utils.data.DataLoader(Files(), batch_size=BATCH, shuffle=True, num_workers=2,
                                         persistent_workers=True, drop_last=True)
    while True:
        yield from loader


def tfdata_batches(paths: Sequence[str], workload: str) -> Iterator[Any]:
    import tensorflow as tf

    def val(path: Any) -> Any:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = SHORTER / tf.reduce_min(shape)
        resized = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
        h, w = tf.shape(resized)[0], tf.shape(resized)[1]
        top, left = (h - SIZE) // 2, (w - SIZE) // 2
        return tf.cast(resized[top:top + SIZE, left:left + SIZE], tf.uint8)

    def train(path: Any) -> Any:
        data = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.1, aspect_ratio_range=DEFAULT_RATIO, area_range=DEFAULT_SCALE,
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        top, left, _ = tf.unstack(begin)
        height, width, _ = tf.unstack(size)
        image = tf.io.decode_and_crop_jpeg(data, tf.stack([top, left, height, width]),
                                           channels=3)
        image = tf.image.random_flip_left_right(image)
        return tf.cast(tf.image.resize(image, [SIZE, SIZE]), tf.uint8)

    dataset = (tf.data.Dataset.from_tensor_slices(list(paths)).shuffle(len(paths)).repeat()
               .map(val if workload == "val" else train, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=False)
               .batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    yield from dataset.as_numpy_iterator()


def dali_batches(paths: Sequence[str], labels: Sequence[int], workload: str) -> Iterator[Any]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe() -> Any:
        jpegs, _ = fn.readers.file(files=list(paths), labels=list(labels), random_shuffle=True,
                                   initial_fill=1024, name="files")
        if workload == "val":
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=SHORTER)
            return fn.crop(images, crop=(SIZE, SIZE))
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB, random_area=list(DEFAULT_SCALE),
            random_aspect_ratio=list(DEFAULT_RATIO), num_attempts=10)
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip())

    p = pipe()
    p.build()
    while True:
        (out,) = p.run()
        yield out.as_array()


class GrainLoad:
    """Grain's map function: a module-level class, so that its spawned workers can unpickle it."""

    def __init__(self, paths: Sequence[str], workload: str):
        self.paths, self.workload = list(paths), workload

    def __call__(self, i: int) -> np.ndarray:
        if self.workload == "val":
            return pil_val(self.paths[i])
        return pil_train(self.paths[i], random.Random())


def grain_batches(paths: Sequence[str], workload: str) -> Iterator[Any]:
    import grain

    dataset = (grain.MapDataset.range(len(paths)).shuffle(seed=0).repeat()
               .map(GrainLoad(paths, workload)).batch(BATCH, drop_remainder=True)
               # One map thread per worker process (Grain's default is 16 per process): two
               # processes on two cores, as the DataLoader row has.
               .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
               .mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    yield from dataset


def trainfeed_options(workload: str) -> dict[str, Any]:
    """What trainfeed's rows read with, as PipelineOptions.from_keywords takes it (and as the
    JSON of a run records it)."""
    common: dict[str, Any] = {"decode": True, "image_size": (SIZE, SIZE), "batch_size": BATCH}
    if workload == "val":
        return {**common, "resize_shorter": SHORTER, "mode": "validation"}
    return {**common, "random_resized_crop": (DEFAULT_SCALE, DEFAULT_RATIO),
            "random_flip": True, "shuffle_buffer": 1024}


def trainfeed_batches(dataset: str, storage: str, workload: str,
                      local: bool = True) -> Iterator[Any]:
    from trainfeed import LocalSource, MasterSource, PipelineOptions, dist
    reader = dist.reader(dataset, source=LocalSource(storage) if local else MasterSource(),
                         pipeline=PipelineOptions.from_keywords(**trainfeed_options(workload)))
    while True:
        for batch in reader():
            yield batch["image"]


def batches(method: str, workload: str, data: str, dataset: str,
            storage: str) -> Iterator[Any]:
    """The method's endless stream of batches."""
    paths, labels = read_list(data)
    factories: dict[str, Callable[[], Iterator[Any]]] = {
        "plain": lambda: plain_batches(paths, workload),
        "torch": lambda: torch_batches(paths, workload),
        "tfdata": lambda: tfdata_batches(paths, workload),
        "dali": lambda: dali_batches(paths, labels, workload),
        "grain": lambda: grain_batches(paths, workload),
        "trainfeed-local": lambda: trainfeed_batches(dataset, storage, workload),
        "trainfeed-local-rst": lambda: trainfeed_batches(dataset, storage, workload),
    }
    if method not in factories:
        raise ValueError(f"unknown method {method!r}; expected one of {sorted(factories)}")
    return factories[method]()
