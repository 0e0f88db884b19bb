"""The one producer loop: reads a pass's partitions ahead of the trainer, whoever plans them.

A pass is a stream of tasks from a `TaskSource` (the local epoch order, `PlannedTasks`; or leases
from a master, trainfeed.lease.tasks.LeasedTasks), each read with the pass's `Load` and handed to
the consumer through a `PrefetchStream`, whose credits bound how many are loaded ahead. The
source decides which tasks and when (a master-fed one may wait, long-poll, or have the consumer
flush); the loop only reads and hands over, so `TRAIN_LOCAL=1` and a cluster run read through the
same code.

`Dataset` is the dataset as a reader reads it, resolved once: its folder, its fields, its manifest
(read once), and what the passes' partition readers share.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from trainfeed.formats.manifest import Manifest, dataset_storage, load_manifest, read_manifest
from trainfeed.io.array_pool import ArrayPool
from trainfeed.io.load import Load
from trainfeed.io.loads import Loads
from trainfeed.io.partition_reader import PartitionReader, ReadStats, payload_buffer_pool
from trainfeed.io.prefetch import Credits, LoadedPartition, PrefetchStream, TaskRef
from trainfeed.storage import Storage

if TYPE_CHECKING:  # (a local reader imports nothing of the master's wire)
    from trainfeed.v1 import master_pb2 as pb


class TaskSource(Protocol):
    """Where a pass's tasks come from. Driven by one producer thread."""

    # Read errors after which a pass goes on without the partition (`failed` is told); any
    # other error ends the pass. () for a source that cannot go on without one.
    read_errors: tuple[type[BaseException], ...]

    def next_tasks(self, credits: Credits, out: PrefetchStream) -> Sequence[TaskRef] | None:
        """The next tasks to read, each having taken one of `credits` (the source takes them,
        and gives back what it does not use); None: the pass is over. May block, and may have
        the consumer `out.flush()` its partial batch."""
        ...

    def loaded(self, task: TaskRef) -> None:
        """`task` was read and goes to the consumer."""
        ...

    def failed(self, task: TaskRef, error: BaseException) -> None:
        """`task` could not be read (one of `read_errors`); its credit is given back."""
        ...

    def close(self) -> None:
        """The pass's producer ends (finished, failed or stopped)."""
        ...


def produce(source: TaskSource, dataset: Dataset, load: Load, out: PrefetchStream,
            credits: Credits, loads: Loads | None = None) -> None:
    """The producer of one pass: reads what `source` hands out into `out`, in order (`loads`:
    how, on how many threads; default one, this one)."""
    loads = loads or Loads(dataset.partition_reader, load)
    try:
        while (tasks := source.next_tasks(credits, out)) is not None:
            # Minus what an earlier holder's trainer already got (task.skip).
            for task, outcome in loads.in_order(tasks):
                try:
                    table = outcome()
                except source.read_errors as e:
                    source.failed(task, e)
                    credits.give(1)
                    continue
                source.loaded(task)
                out.put(LoadedPartition(task, table))
    finally:
        try:
            loads.close()
        finally:
            source.close()


def prefetched(source: TaskSource, dataset: Dataset, load: Load, depth: int,
               name: str, threads: int = 1) -> PrefetchStream:
    """A pass's stream: `produce` in a background thread, `depth` partitions ahead, loading
    up to `threads` partitions at once (trainfeed.io.loads)."""
    return PrefetchStream(lambda out, credits: produce(
        source, dataset, load, out, credits,
        Loads(dataset.partition_reader, load, threads, f"{name}-load")), depth, name)


class PlannedTasks:
    """A local pass's tasks: a planned list, read in order as credits free up. A partition
    that cannot be read ends the pass (no master could give it to another reader).

    `at_once`: tasks handed out together where the window allows (the pass's load threads):
    it waits for that many free credits, unless the consumer runs dry, so that the loads of
    one call can overlap (one credit at a time would load one partition at a time)."""

    read_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, tasks: Sequence[TaskRef], at_once: int = 1):
        self._todo: Iterator[TaskRef] = iter(tasks)
        self._at_once = max(1, at_once)

    def next_tasks(self, credits: Credits, out: PrefetchStream) -> list[TaskRef] | None:
        free = credits.take_all(min(self._at_once, credits.total),
                                starving=lambda: out.buffered <= 1)
        tasks = [task for _, task in zip(range(free), self._todo)]
        if len(tasks) < free:  # the plan ends: the credits not used go back
            credits.give(free - len(tasks))
        return tasks or None

    def loaded(self, task: TaskRef) -> None:
        pass

    def failed(self, task: TaskRef, error: BaseException) -> None:
        raise error

    def close(self) -> None:
        pass


@dataclasses.dataclass
class Dataset:
    """A dataset as one reader reads it: where it is and its fields, resolved once (from the
    storage and the name, or from the master's OpenJob answer), its manifest read once on first
    use, and the read statistics and payload buffers its passes' partition readers share."""

    folder: Storage
    field_names: tuple[str, ...]
    binary_fields: tuple[str, ...]
    _manifest: Manifest | None = None
    stats: ReadStats = dataclasses.field(default_factory=ReadStats)
    buffers: ArrayPool = dataclasses.field(default_factory=payload_buffer_pool)
    _load_manifest: Callable[[], Manifest] | None = None
    # The version read (trainfeed.formats.manifest, "Versions"); None: the current one when the
    # manifest is first read (a master before versions names none).
    version: int | None = None

    @classmethod
    def in_storage(cls, storage: Storage, name: str, version: int | None = None) -> Dataset:
        """Dataset `name` of `storage` (its `version`, None: the current one), its manifest read
        now, and its version pinned. Raises DatasetNotFoundError (naming the datasets, or the
        versions, there) if it is not published."""
        folder = dataset_storage(storage, name)
        try:
            manifest = load_manifest(folder, version)
        except FileNotFoundError:
            read_manifest(storage, name)  # raises DatasetNotFoundError with what is there
            raise
        return cls(folder, manifest.field_names,
                   tuple(f.name for f in manifest.fields if f.type == "binary"), manifest,
                   version=manifest.dataset_version)

    @classmethod
    def joined(cls, opened: pb.OpenJobResponse) -> Dataset:
        """The dataset a master's OpenJob answer names: its folder, fields and version (None:
        a master before versions); its manifest read on first use."""
        fields = opened.fields
        folder = Storage(opened.dataset_url, json.loads(opened.storage_options_json or "{}"))
        return cls(folder, tuple(f.name for f in fields),
                   tuple(f.name for f in fields if f.type == "binary"),
                   version=opened.dataset_version or None)

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest (of its pinned version), read from its folder on first use
        (raw readers skip it)."""
        if self._manifest is None:
            self._manifest = load_manifest(self.folder, self.version)
        return self._manifest

    def partition_reader(self) -> PartitionReader:
        """A reader of this dataset's partitions for one pass (close it at its end)."""
        return PartitionReader(self.folder, self.field_names, list(self.binary_fields),
                               self.stats, self.buffers)
