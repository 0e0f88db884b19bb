"""Where a reader's partitions come from: straight from storage (local) or leased from a master.

Both backends hand the Reader the same thing, one pass at a time: a stream of loaded partitions
(`PassStream`) that it acknowledges as the trainer consumes them, read by the one producer loop
(trainfeed.reader.producer) from a task source: the local epoch plan, or the master's leases. So
`TRAIN_LOCAL=1` and a cluster run yield the same instances through the same code.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from trainfeed.errors import CheckpointError
from trainfeed.formats.manifest import SQL_KIND, Manifest
from trainfeed.io.load import Load, plain_load
from trainfeed.io.partition_reader import ReadStats
from trainfeed.io.prefetch import LoadedPartition, PrefetchStream, TaskRef, prefetch_depth
from trainfeed.planning.order import epoch_order
from trainfeed.planning.partitions import plan_of_state, plan_partitions
from trainfeed.reader.label_ids import check_saved, delivered
from trainfeed.reader.position import ReaderPosition
from trainfeed.reader.producer import Dataset, PlannedTasks, prefetched
from trainfeed.reader.world import SyncGroup
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)


class PassStream(Protocol):
    """One epoch's partitions, in the order the trainer gets them."""

    epoch: int | None
    # Partition -> records of it handed to the trainer (skipped ones included); a consumer may
    # write it directly, per instance, where calling `progress` would cost too much.
    positions: dict[int, int]
    # Records handed to the trainer in batches this epoch (a synchronous rank's progress
    # toward its quota, saved in its state).
    delivered: int

    def __iter__(self) -> Iterator[LoadedPartition | None]:
        """Loaded partitions; None means "nothing is coming for now: flush partial batches"."""
        ...

    def entered(self, part: LoadedPartition) -> None:
        """The trainer's side met `part` (its epoch may be a new one: positions start afresh)."""
        ...

    def taken(self, part: LoadedPartition) -> None:
        """Every row of `part` moved into the consumer's batch buffer: its prefetch slot is free.
        (Prefetch bounds memory; it must not wait for acknowledgement, or a batch larger than
        the prefetched partitions could never fill.)"""
        ...

    def consumed(self, part: LoadedPartition) -> None:
        """The trainer was handed every record of `part` (and asked for more): acknowledge it."""
        ...

    def progress(self, part: LoadedPartition, handed: int) -> None:
        """The trainer consumed the first `handed` rows of `part.table` (reported to the master,
        so that a crash repeats only what came after)."""
        ...

    def close(self, finished: bool) -> None:
        """Ends the pass; `finished` tells whether it ran to its end. Idempotent."""
        ...

    def lost(self, part: LoadedPartition) -> bool:
        """The master took `part`'s lease away (or it was given back to an idle reader): its
        rows not yet handed to the trainer must be dropped (another reader delivers them).
        Otherwise the lease is claimed: the trainer is about to get its rows, and from now on it
        is never given back. May block on a heartbeat (see WorkerSession.lease_lost)."""
        ...

    def forget(self, part: LoadedPartition) -> None:
        """Drops a lost partition from the pass: not done, no report (the lease is gone)."""
        ...


class Backend(Protocol):
    epoch: int | None  # of the current or last pass

    @property
    def field_names(self) -> tuple[str, ...]: ...

    @property
    def seed(self) -> int: ...

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest (label histogram, field types) for the pipeline."""
        ...

    @property
    def dataset_folder(self) -> Storage:
        """Where the dataset's shards, manifest and saved transformers are."""
        ...

    def open_pass(self, load: Load = plain_load, threads: int = 1) -> PassStream:
        """Starts a pass; `load` reads each partition in its delivery order (see
        trainfeed.reader.batcher.partition_loader), on up to `threads` threads at once
        (trainfeed.io.loads: `load` must then be thread-safe)."""
        ...

    @property
    def read_stats(self) -> ReadStats: ...

    def position(self) -> ReaderPosition:
        """Where the trainer stands (a copy): see trainfeed.reader.position."""
        ...

    def close(self) -> None: ...


class Pass:
    """A PassStream over a PrefetchStream, with hooks for acknowledging and ending. Keeps the
    backend's `ReaderPosition` up to date as the trainer consumes."""

    def __init__(self, stream: PrefetchStream, position: ReaderPosition,
                 on_consumed: Callable[[TaskRef], None],
                 on_close: Callable[[bool], None],
                 on_progress: Callable[[TaskRef, int], None] = lambda task, handed: None,
                 on_lost: Callable[[TaskRef], bool] = lambda task: False,
                 on_claim: Callable[[TaskRef], bool] | None = None):
        self._stream = stream
        self._position = position
        self.epoch: int | None = position.epoch if position.epoch >= 0 else None
        self.positions = position.positions
        self._on_consumed = on_consumed
        self._on_progress = on_progress
        self._on_close = on_close
        self._on_lost = on_lost
        self._on_claim = on_claim or on_lost
        self._closed = False

    @property
    def delivered(self) -> int:
        return self._position.delivered

    @delivered.setter
    def delivered(self, value: int) -> None:
        self._position.delivered = value

    def __iter__(self) -> Iterator[LoadedPartition | None]:
        for part in self._stream:
            if part is not None and self._on_lost(part.task):  # revoked or given back: drop
                self._stream.release(part)
                self._on_consumed(part.task)  # (the session sends no report for it)
                continue
            if part is not None:
                self.epoch = part.task.epoch
            yield part

    def entered(self, part: LoadedPartition) -> None:
        epoch = part.task.epoch
        if self._position.epoch != epoch:  # joined another epoch: start afresh
            self._position.epoch, self._position.finished = epoch, False
            self._position.done.clear()
            self._position.positions.clear()
            self._position.delivered = 0

    def taken(self, part: LoadedPartition) -> None:
        self._stream.release(part)

    def lost(self, part: LoadedPartition) -> bool:
        return self._on_claim(part.task)

    def forget(self, part: LoadedPartition) -> None:
        self._position.positions.pop(part.task.partition, None)
        self._on_consumed(part.task)  # frees its place in the session (no report is sent)

    def consumed(self, part: LoadedPartition) -> None:
        self._position.done.add(part.task.partition)
        self._position.positions.pop(part.task.partition, None)
        self._on_consumed(part.task)

    def progress(self, part: LoadedPartition, handed: int) -> None:
        self._position.positions[part.task.partition] = part.task.skip + handed
        self._on_progress(part.task, handed)

    def close(self, finished: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        if finished and self._position.epoch >= 0:
            self._position.finished = True
            self._position.positions.clear()
        self._on_close(finished)


class LocalBackend:
    """Reads every partition of a dataset straight from storage, no master (TRAIN_LOCAL)."""

    def __init__(self, dataset: str, storage: Storage, seed: int, prefetch: int | None,
                 resume: ReaderPosition | None = None, group: SyncGroup | None = None,
                 version: int | None = None, pinned: tuple[str, ...] | None = None):
        self.group = group
        self.dataset = Dataset.in_storage(storage, dataset, version)
        manifest = self.dataset.manifest
        if resume is not None:  # class ids first: what a model trained on the state needs
            check_restored_classes(resume, manifest, pinned)
            resume.check_version(manifest.dataset_version)
        # A restored reader keeps the plan its state counts in (see plan_of_state).
        try:
            self.partitions = (plan_partitions(manifest) if resume is None
                               else plan_of_state(manifest, resume.partitions))
        except ValueError as e:  # no plan of that many partitions
            raise CheckpointError(str(e)) from None
        self.prefetch = prefetch or prefetch_depth(manifest.num_bytes, len(self.partitions))
        self.epoch: int | None = None
        # The one position of this reader (and the one place its seed is kept): updated in
        # place as passes go, copied out by `position()`.
        self._position = ReaderPosition("local", dataset, 0, seed=seed,
                                        dataset_version=manifest.dataset_version)
        if resume is not None:
            sql = manifest.kind == SQL_KIND  # a bucket's rows are known once queried
            resume.check_plan([None if sql else p.num_records for p in self.partitions])
            self._position = dataclasses.replace(copy_position(resume), seed=seed,
                                                 dataset_version=manifest.dataset_version)
            if resume.finished:
                advance(self._position, resume.next_epoch)

    @property
    def seed(self) -> int:
        return self._position.seed

    @property
    def field_names(self) -> tuple[str, ...]:
        return self.dataset.field_names

    @property
    def manifest(self) -> Manifest:
        return self.dataset.manifest

    @property
    def dataset_folder(self) -> Storage:
        return self.dataset.folder

    def position(self) -> ReaderPosition:
        return dataclasses.replace(copy_position(self._position), partitions=len(self.partitions))

    @property
    def read_stats(self) -> ReadStats:
        return self.dataset.stats

    def open_pass(self, load: Load = plain_load, threads: int = 1) -> PassStream:
        position = self._position
        if position.finished:
            advance(position, position.epoch + 1)
        self.epoch = position.epoch
        return Pass(prefetched(PlannedTasks(self._plan(position), at_once=threads),
                                self.dataset, load, self.prefetch, "trainfeed-local-prefetch",
                                threads), position,
                     on_consumed=lambda task: None, on_close=lambda finished: None)

    def _plan(self, position: ReaderPosition) -> list[TaskRef]:
        """The pass's tasks in epoch order. A resumed or abandoned pass goes on where the
        trainer was: without the partitions it consumed, and with each partition it was in the
        middle of after what it had."""
        epoch = position.epoch
        skip = dict(position.positions)
        stop: dict[int, int] = {}
        order = [p for p in epoch_order(len(self.partitions), self.seed, epoch)
                 if p not in position.done]
        if self.group is not None:
            order = self._share(order, epoch, skip, stop)
        tasks = []
        for index in order:
            p = self.partitions[index]
            tasks.append(TaskRef(epoch, index, p.shard, p.row_group_start, p.row_group_stop,
                                 p.num_records, skip.get(index, 0), stop=stop.get(index, 0),
                                 row_start=p.row_start))
        return tasks

    def _share(self, order: list[int], epoch: int, skip: dict[int, int],
               stop: dict[int, int]) -> list[int]:
        """A synchronous rank's static share of the epoch, with no master to balance it: its
        contiguous `quota` records of the epoch's record order (partitions in epoch order), the
        part past the group's kept records dropped. Fills `skip`/`stop` per partition (records
        counted from its start) and returns the partitions that deliver anything."""
        assert self.group is not None
        start, end = self.group.share(self.manifest.num_records)
        mine: list[int] = []
        offset = 0
        for index in epoch_order(len(self.partitions), self.seed, epoch):
            size = self.partitions[index].num_records
            first, last = max(start - offset, 0), min(end - offset, size)
            offset += size
            if first >= last or index not in order:
                continue
            skip[index] = max(first, skip.get(index, 0))
            if last < size:
                stop[index] = last
            if skip[index] < last:
                mine.append(index)
        return mine

    def close(self) -> None:
        pass


def check_restored_classes(resume: ReaderPosition, manifest: Manifest,
                           pinned: tuple[str, ...] | None) -> None:
    """Refuses a state whose reader delivered other class ids than a reader of `manifest`
    with the pin `pinned` would (trainfeed.reader.label_ids.check_saved)."""
    check_saved(resume.dataset, resume.class_values, resume.dataset_version,
                delivered(manifest.classes, pinned), manifest.dataset_version)


def advance(position: ReaderPosition, epoch: int) -> None:
    """A finished pass's position moves on to `epoch`, in place: nothing of it done yet."""
    position.epoch, position.finished, position.delivered = epoch, False, 0
    position.done.clear()
    position.positions.clear()


def copy_position(position: ReaderPosition) -> ReaderPosition:
    return dataclasses.replace(position, done=set(position.done),
                               positions=dict(position.positions))
