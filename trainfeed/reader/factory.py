"""`dist.reader(name, ...)`: one call for a laptop and a cluster alike."""
from __future__ import annotations

import json
import logging
from typing import Any

from trainfeed import settings
from trainfeed.formats.manifest import split_version
from trainfeed.names import validate_dataset_name
from trainfeed.reader.backends import LocalBackend
from trainfeed.reader.pipeline import PipelineOptions
from trainfeed.reader.reader import Reader
from trainfeed.reader.shortcuts import translate
from trainfeed.reader.sources import LocalSource, MasterSource, from_environment
from trainfeed.reader.world import SyncGroup, SyncOptions, locate
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)


def train_local() -> bool:
    """Whether `$TRAIN_LOCAL` asks for local reading: any non-empty value other than `0`."""
    return settings.TRAIN_LOCAL.get()


def reader(name: str, *, source: LocalSource | MasterSource | None = None,
           pipeline: PipelineOptions | None = None, sync: SyncOptions | None = None,
           state: dict[str, Any] | None = None, **shortcuts: Any) -> Reader:
    """A reader creator over dataset `name`: each call of it yields one pass (epoch).

    Nothing connects or reads until the first pass, so creating a reader is free.

    Args:
        name: The dataset, as uploaded (e.g. "flowers", "public/digits"), read at its current
            version; "flowers@2" reads version 2 (`trainfeed info flowers` lists them). A
            reader keeps the version it opened; master-fed, its job's (see docs/usage.md).
        source: Where partitions come from: `LocalSource(...)` (storage, no master) or
            `MasterSource(...)` (a job on a master, whose readers split each epoch). None: the
            environment's, `LocalSource()` with `TRAIN_LOCAL` set, else `MasterSource()`.
        pipeline: What is done to records (decoding, labels, sampling, batching, transforms).
            None: raw Paddle-style tuples in the `.list` file's column order.
        sync: `SyncOptions(...)` for synchronous data-parallel training: every rank takes the
            same whole batches per epoch. None: readers take what they get.
        state: A `reader.state_dict()` saved with a checkpoint: the reader continues from it.
        **shortcuts: The keywords of earlier releases (`batch_size=32`, `local=True`,
            `sync=True`, ...), deprecated: each warns with its grouped spelling.

    Returns:
        A Reader, a context manager whose `close()` hands unfinished work back.

    Raises:
        TypeError: a value of the wrong type, or an unknown or retired keyword (the message
            names the closest option or what replaces it).
        ValueError: an invalid option value (the message names it and the rule).

    Example:
        >>> from trainfeed import dist, LocalSource
        >>> reader = dist.reader("flowers", source=LocalSource())   # doctest: +SKIP
        >>> for raw_image_bytes, label in reader():                 # doctest: +SKIP
        ...     pass
    """
    name, version = split_version(name)
    validate_dataset_name(name)
    if shortcuts or isinstance(sync, bool):
        source, pipeline, sync = translate(source, pipeline, sync, shortcuts)
    _check_values(source, pipeline, sync, state)
    source = source or from_environment()
    options = pipeline or PipelineOptions()
    group = _sync_group(options, sync) if sync is not None else None
    seed, depth = source.seed, source.prefetch_partitions
    pinned = options.labels.class_values  # a restored state's class ids must match them
    if isinstance(source, LocalSource):
        store = open_storage(source.storage)
        return Reader(lambda resume: LocalBackend(name, store, seed, depth, resume, group,
                                                  version, pinned), name,
                      "local", state, options, seed, group)
    # Imported here: the distributed backend brings the lease session and gRPC, which a local
    # reader never needs (tests/reader/test_local_imports.py).
    from trainfeed.reader.distributed import DistributedBackend

    order = delivery_order(options, seed, group)
    master = source.resolved()
    return Reader(lambda resume: DistributedBackend(name, master, resume, group, order,
                                                    version=version, pinned=pinned),
                  name, "distributed", state, options, seed, group)


def _check_values(source: Any, pipeline: Any, sync: Any, state: Any) -> None:
    """Each argument is of its type (a wrong one is named here, not deep inside a pass)."""
    if source is not None and not isinstance(source, LocalSource | MasterSource):
        raise TypeError(f"source must be a LocalSource(...), a MasterSource(...) or None (the "
                        f"environment's), got {type(source).__name__}")
    if pipeline is not None and not isinstance(pipeline, PipelineOptions):
        raise TypeError(f"pipeline must be a PipelineOptions(...) or None (raw records), got "
                        f"{type(pipeline).__name__}")
    if sync is not None and not isinstance(sync, SyncOptions):
        raise TypeError(f"sync must be a SyncOptions(world_size, rank) or None, got "
                        f"{type(sync).__name__}")
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"state must be a reader.state_dict() saved with a checkpoint (a "
                        f"dict) or None, got {type(state).__name__}")


def _sync_group(options: PipelineOptions, sync: SyncOptions) -> SyncGroup:
    """The synchronous group of a reader given `sync`, its pipeline checked."""
    if options.batch.size is None:
        raise ValueError("sync=SyncOptions(...) needs a batch_size (pipeline=PipelineOptions("
                         "batch=BatchOptions(size=...))): every rank takes the same number of "
                         "batches per epoch")
    if options.resamples:
        raise ValueError("sync=SyncOptions(...) cannot resample (SamplingOptions.resample): a "
                         "rank's record count would vary per epoch; use "
                         "LabelOptions.class_weights instead")
    if options.decode.errors != "raise":
        raise ValueError('sync=SyncOptions(...) needs decode_errors="raise" (DecodeOptions('
                         'errors="raise")): a skipped record would leave its rank a record short '
                         "of the others")
    size, index, where = locate(sync.world_size, sync.rank)
    logger.info("synchronous reader: rank %d of world size %d (from %s)", index, size, where)
    return SyncGroup(size, index, options.batch.size)


def delivery_order(options: PipelineOptions, seed: int,
                   group: SyncGroup | None) -> pb.DeliveryOrder:
    """What shapes the order this reader delivers a job's records in, as it takes effect: the
    master refuses a reader whose order differs from its job's
    (trainfeed.master.core.delivery_order) rather than let the two deliver records twice or hang."""
    resample = options.sampling.resample if options.resamples else None
    buffer = options.sampling.shuffle_buffer
    return pb.DeliveryOrder(
        seed=seed, shuffle_buffer=buffer if options.mode == "train" and buffer > 1 else 0,
        resample="" if resample is None else json.dumps(resample, sort_keys=True, default=str),
        sync_batch_size=group.batch_size if group is not None else 0)
