"""`dist.reader(name, ...)`: one call for a laptop and a cluster alike."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from trainfeed.master.distribution import DistributionRules
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.reader.backends import DistributedBackend, LocalBackend
from trainfeed.reader.pipeline import PipelineOptions
from trainfeed.reader.reader import Reader
from trainfeed.reader.transforms import AugmentStep, Standardize
from trainfeed.storage import open_storage
from trainfeed.worker.resample import Target

TRAIN_LOCAL_ENV = "TRAIN_LOCAL"
JOB_ENV = "TRAINFEED_JOB"
DEFAULT_JOB = "default"


def train_local() -> bool:
    """Whether `$TRAIN_LOCAL` asks for local reading: any non-empty value other than `0`."""
    value = os.environ.get(TRAIN_LOCAL_ENV, "")
    return value not in ("", "0")


def reader(name: str, *, job: str | None = None, seed: int = 0,
           prefetch: int | None = None, master: str | None = None,
           storage: str | None = None, local: bool | None = None,
           distribution_rules: str | None = None,
           state: dict[str, Any] | None = None,
           decode: bool = False, image_size: tuple[int, int] | None = None,
           crop: bool = False,
           channels: int = 3, normalizing_const: float | None = None, one_hot: bool = False,
           shuffle_buffer: int = 0, resample: Target | None = None,
           batch_size: int | None = None, decode_errors: str = "raise",
           decode_threads: int | None = None, prefetch_batches: int = 2,
           mode: str = "train", transform: str | Standardize | None = None,
           augment: Sequence[AugmentStep] = (),
           class_weights: Target | None = None,
           class_values: Sequence[str] | None = None,
           random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None,
           random_flip: bool = False, resize_shorter: int | None = None) -> Reader:
    """A reader creator over dataset `name`; each call yields one pass (epoch).

    With `TRAIN_LOCAL` set it reads the whole dataset from storage (`storage`, else
    `$TRAINFEED_STORAGE`, else `./trainfeed-data`); otherwise it joins job `job` (else
    `$TRAINFEED_JOB`, else "default") on the master at `master` (else `$TRAINFEED_MASTER`), and
    readers of the same job split each epoch between them. Nothing connects until the first pass.
    The master's token comes from `$TRAINFEED_TOKEN` (or the file named by
    `$TRAINFEED_TOKEN_FILE`), TLS settings from `$TRAINFEED_TLS_*` (see docs/security.md); a
    refused token raises AuthenticationError.
    `distribution_rules` ("all", "gpu", or a comma-separated list of worker names) restricts
    which workers may take the job's tasks; the reader that creates the job sets them, and a
    worker they exclude is refused with the reason. `prefetch` is how many partitions are
    loaded ahead of the trainer; by default as many as fit 64 MiB
    (trainfeed.worker.prefetch.DEFAULT_PREFETCH_BYTES), between 2 and 32. `state` is a
    `reader.state()` saved with a checkpoint: the reader continues from there (see
    Reader.state).

    The input pipeline (all optional; without them the reader yields raw Paddle-style tuples):
    - `decode`: JPEG/PNG fields to uint8 HxWxC arrays (`channels` 3 or 1), on all cores;
      `image_size=(h, w)` resizes to a fixed shape (`crop=True`: centre-crops to its aspect
      ratio first, nothing stretched); `normalizing_const` divides (float32);
      `decode_errors`: "raise" (a DecodeError naming the record) or "skip" (dropped, counted
      in `reader.decode_failures`).
    - decode-stage crops (each image decoded, cropped, resized to `image_size` and flipped on
      the decode threads, uint8; docs/imagenet.md): `random_resized_crop=(scale, ratio)`, e.g.
      `((0.08, 1.0), (3/4, 4/3))`, torchvision's RandomResizedCrop, and `random_flip=True`
      (probability 0.5), both in mode "train" only and seeded per (seed, epoch, record) so
      that a re-read makes the same crops; `resize_shorter=256` (or, unset, image_size / 0.875)
      with a centre crop of `image_size` in modes "validation" and "score" (and in training
      without random_resized_crop).
    - labels become int64 class ids 0..K-1 (class values: the dataset's labels, sorted, or
      `class_values`, e.g. a validation reader given `train_reader.class_values` so that ids
      agree even where it lacks classes); `one_hot=True` gives float32 (n, K) instead.
    - `resample`: rebalance classes toward "uniform", a dict class -> weight, or a power of the
      source distribution (under-sample p < 1, over-sample p > 1).
    - `shuffle_buffer`: records shuffled together beyond the master's partition order.
    - `batch_size`: yield dicts of arrays keyed by field name (and "_id"); `prefetch_batches`
      batches are prepared ahead. `mode` "validation" or "score" never shuffles, resamples or
      augments.
    - `transform`: a fitted transformer (trainfeed.reader.transforms.Standardize) or the name
      of one saved with the dataset, applied to every batch; `augment`: importable functions
      ("module:function" or (path, params)), e.g. "trainfeed.augment:random_flip", applied to
      training batches only.
    - `class_weights`: instead of (or with) resampling, a per-record loss weight in the batch
      field "_weight" (Keras's sample_weight): "uniform" weights each class by B/A, as resample
      would, a dict or a power likewise.

    Example:
        >>> from trainfeed import dist
        >>> reader = dist.reader("flowers")            # doctest: +SKIP
        >>> for raw_image_bytes, label in reader():   # doctest: +SKIP
        ...     pass
    """
    validate_dataset_name(name)
    if prefetch is not None and prefetch < 1:
        raise ValueError(f"prefetch must be ≥ 1 partition, got {prefetch}")
    options = PipelineOptions(
        decode=decode, image_size=tuple(image_size) if image_size else None,  # type: ignore
        crop=crop,
        channels=channels, normalizing_const=normalizing_const, one_hot=one_hot,
        shuffle_buffer=shuffle_buffer, resample=resample, batch_size=batch_size,
        decode_errors=decode_errors, decode_threads=decode_threads,
        prefetch_batches=prefetch_batches, mode=mode, transform=transform,
        augment=tuple(augment), class_weights=class_weights,
        class_values=tuple(class_values) if class_values is not None else None,
        random_resized_crop=(tuple(map(tuple, random_resized_crop))  # type: ignore[arg-type]
                             if random_resized_crop is not None else None),
        random_flip=random_flip, resize_shorter=resize_shorter)
    use_local = train_local() if local is None else local
    if use_local:
        store = open_storage(storage)
        return Reader(lambda resume: LocalBackend(name, store, seed, prefetch, resume), name,
                      "local", state, options)
    job_name = validate_job_name(job or os.environ.get(JOB_ENV) or DEFAULT_JOB)
    # A bad value fails here, early; none given ("") lets the master apply the dataset's own
    # (a packed dataset's summary) or "all".
    rules = str(DistributionRules.parse(distribution_rules)) if distribution_rules else ""
    return Reader(lambda resume: DistributedBackend(name, job_name, master, seed, prefetch, rules,
                                                    resume), name, "distributed", state,
                  options)
