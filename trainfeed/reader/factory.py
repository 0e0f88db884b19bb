"""`dist.reader(name, ...)`: one call for a laptop and a cluster alike."""
from __future__ import annotations

import json
import logging
import warnings
from typing import Any

from trainfeed import settings
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.planning.distribution import DistributionRules
from trainfeed.reader.backends import DistributedBackend, LocalBackend, check_lost_policy
from trainfeed.reader.options import ReaderArguments
from trainfeed.reader.pipeline import PipelineOptions
from trainfeed.reader.reader import Reader
from trainfeed.reader.world import SyncGroup, locate
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)


def train_local() -> bool:
    """Whether `$TRAIN_LOCAL` asks for local reading: any non-empty value other than `0`."""
    return settings.TRAIN_LOCAL.get()


def reader(name: str, *, job: str | None = None, seed: int = 0,
           prefetch_partitions: int | None = None, master: str | None = None,
           storage: str | None = None, local: bool | None = None,
           distribution_rules: str | None = None,
           state: dict[str, Any] | None = None,
           pipeline: PipelineOptions | None = None,
           prefetch: int | None = None,
           lost_partitions: str = "raise",
           sync: bool = False, world_size: int | None = None, rank: int | None = None,
           **shortcuts: Any) -> Reader:
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
    worker they exclude is refused with the reason. `prefetch_partitions` is how many partitions
    are loaded ahead of the trainer; by default as many as fit 64 MiB
    (trainfeed.io.prefetch.DEFAULT_PREFETCH_BYTES), between 2 and 32 (`prefetch` is its
    deprecated old name). `state` is a `reader.state_dict()` (or `state()`) saved with a
    checkpoint: the reader continues from there (see Reader.state_dict).

    The input pipeline (all optional; without it the reader yields raw Paddle-style tuples) is
    `pipeline=PipelineOptions(...)` (trainfeed.reader.options: DecodeOptions, LabelOptions,
    SamplingOptions, BatchOptions, TransformOptions, mode), or these keyword shortcuts, applied
    on top of `pipeline` (trainfeed.reader.options.KEYWORDS maps them to the groups):
    - `decode`: JPEG/PNG fields to uint8 HxWxC arrays (`channels` 3 or 1), on all cores;
      `image_size=(h, w)` resizes to a fixed shape (`crop=True`: centre-crops to its aspect
      ratio first, nothing stretched); `normalizing_const` divides (float32);
      `decode_errors`: "raise" (a `trainfeed.DecodeError` naming the record) or "skip"
      (dropped, counted in `reader.decode_failures`); `decode_threads`: None for this
      process's cores, shared among the LOCAL_WORLD_SIZE processes torchrun started on the
      node.
    - decode-stage crops (each image decoded, cropped, resized to `image_size` and flipped on
      the decode threads, uint8; docs/imagenet.md): `random_resized_crop=(scale, ratio)`, e.g.
      `((0.08, 1.0), (3/4, 4/3))`, torchvision's RandomResizedCrop, `random_flip=True`
      (probability 0.5) and `color_jitter=(brightness, contrast, saturation)` (torchvision's
      ColorJitter factors, e.g. (0.4, 0.4, 0.4)), all in mode "train" only and seeded per
      (seed, epoch, record) so that a re-read makes the same crops; `resize_shorter=256` (or,
      unset, image_size / 0.875) with a centre crop of `image_size` in modes "validation" and
      "score" (and in training without random_resized_crop).
    - labels become int64 class ids 0..K-1 (class values: the dataset's labels, sorted, integer
      labels by value (trainfeed.formats.labels), or, in the given order,
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

    `lost_partitions`: what a master-fed pass does when the master gave up on partitions of
    its epoch (no reader could read them, --max-failures times): "raise" (the default) raises
    LostRecordsError at the end of the pass, naming them and why; "skip" goes on and lists them
    in `reader.lost_partitions`. A local pass raises at the first unreadable partition.

    `sync=True`: synchronous data-parallel training (DDP, Horovod, MultiWorkerMirroredStrategy):
    every rank yields exactly `reader.steps_per_epoch` full batches per epoch,
    records // (world_size × batch_size), while the master balances partitions between the
    ranks; the epoch's remaining records (fewer than world_size × batch_size) are dropped and
    counted in `reader.dropped_per_epoch`. World size and rank come from `world_size=`/`rank=`,
    else torchrun's WORLD_SIZE/RANK, else TF_CONFIG, else a group of one. Needs `batch_size`;
    not with `resample` or decode_errors="skip" (either would change a rank's record count).
    With TRAIN_LOCAL each rank reads its own contiguous share of every epoch's order.

    Raises:
        TypeError: an unknown keyword (the message names the closest option).
        ValueError: an invalid option value (the message names it and the rule).

    Example:
        >>> from trainfeed import dist
        >>> reader = dist.reader("flowers")            # doctest: +SKIP
        >>> for raw_image_bytes, label in reader():   # doctest: +SKIP
        ...     pass
    """
    validate_dataset_name(name)
    ReaderArguments(seed, prefetch_partitions, local, sync, world_size, rank, lost_partitions,
                    job, master, storage, distribution_rules, state)  # types and ranges
    if prefetch is not None:
        warnings.warn("dist.reader(prefetch=...) is deprecated: it is prefetch_partitions= "
                      "(partitions loaded ahead; prefetch_batches= counts prepared batches)",
                      DeprecationWarning, stacklevel=2)
        if prefetch_partitions is not None and prefetch_partitions != prefetch:
            raise ValueError(f"prefetch={prefetch} and prefetch_partitions="
                             f"{prefetch_partitions} disagree: pass prefetch_partitions alone")
        prefetch_partitions = prefetch
    if prefetch_partitions is not None and prefetch_partitions < 1:
        raise ValueError(f"prefetch_partitions must be ≥ 1 partition, got {prefetch_partitions}")
    options = PipelineOptions.from_keywords(pipeline, **shortcuts)
    depth = prefetch_partitions
    group = _sync_group(options, world_size, rank) if sync else None
    if not sync and (world_size is not None or rank is not None):
        raise ValueError("world_size= and rank= are for synchronous readers: pass sync=True")
    use_local = train_local() if local is None else local
    if use_local:
        store = open_storage(storage)
        return Reader(lambda resume: LocalBackend(name, store, seed, depth, resume, group), name,
                      "local", state, options, seed, group)
    job_name = validate_job_name(job or settings.JOB.get())
    # A bad value fails here, early; none given ("") lets the master apply the dataset's own
    # (a packed dataset's summary) or "all".
    rules = str(DistributionRules.parse(distribution_rules)) if distribution_rules else ""
    check_lost_policy(lost_partitions)
    order = delivery_order(options, seed, group)
    return Reader(lambda resume: DistributedBackend(name, job_name, master, seed, depth, rules,
                                                    resume, lost_partitions, group, order),
                  name, "distributed", state, options, seed, group)


def _sync_group(options: PipelineOptions, world_size: int | None,
                rank: int | None) -> SyncGroup:
    """The synchronous group of a `sync=True` reader, its options checked."""
    if options.batch.size is None:
        raise ValueError("sync=True needs batch_size=...: every rank takes the same number of "
                         "batches per epoch")
    if options.resamples:
        raise ValueError("sync=True cannot resample (resample=...): a rank's record count would "
                         "vary per epoch; use class_weights=... instead")
    if options.decode.errors != "raise":
        raise ValueError('sync=True needs decode_errors="raise": a skipped record would leave '
                         "its rank a record short of the others")
    size, index, source = locate(world_size, rank)
    logger.info("synchronous reader: rank %d of world size %d (from %s)", index, size, source)
    return SyncGroup(size, index, options.batch.size)


def delivery_order(options: PipelineOptions, seed: int,
                   group: SyncGroup | None) -> pb.DeliveryOrder:
    """What shapes the order this reader delivers a job's records in, as it takes effect: the
    master refuses a reader whose order differs from its job's (trainfeed.master.delivery_order)
    rather than let the two deliver records twice or hang."""
    resample = options.sampling.resample if options.resamples else None
    buffer = options.sampling.shuffle_buffer
    return pb.DeliveryOrder(
        seed=seed, shuffle_buffer=buffer if options.mode == "train" and buffer > 1 else 0,
        resample="" if resample is None else json.dumps(resample, sort_keys=True, default=str),
        sync_batch_size=group.batch_size if group is not None else 0)
