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

from trainfeed.errors import CheckpointError, JobError, LostRecordsError
from trainfeed.formats.manifest import SQL_KIND, Manifest
from trainfeed.io.partition_reader import ReadStats
from trainfeed.io.prefetch import LoadedPartition, PrefetchStream, TaskRef, prefetch_depth
from trainfeed.lease.client import MasterClient
from trainfeed.lease.session import (
    JOIN_CURRENT_EPOCH,
    Load,
    StatsHook,
    WorkerSession,
    plain_load,
)
from trainfeed.lease.tasks import LeasedTasks
from trainfeed.planning.order import epoch_order
from trainfeed.planning.partitions import plan_of_state, plan_partitions
from trainfeed.reader.label_ids import check_saved, delivered, mapping
from trainfeed.reader.position import ReaderPosition
from trainfeed.reader.producer import Dataset, PlannedTasks, prefetched
from trainfeed.reader.world import SyncGroup
from trainfeed.storage import Storage
from trainfeed.v1 import master_pb2 as pb

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

    def open_pass(self, load: Load = plain_load) -> PassStream:
        """Starts a pass; `load` reads each partition in its delivery order (see
        trainfeed.reader.batcher.partition_loader)."""
        ...

    @property
    def read_stats(self) -> ReadStats: ...

    def position(self) -> ReaderPosition:
        """Where the trainer stands (a copy): see trainfeed.reader.position."""
        ...

    def close(self) -> None: ...


class _Pass:
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
            self._position = dataclasses.replace(_copy(resume), seed=seed,
                                                 dataset_version=manifest.dataset_version)
            if resume.finished:
                _advance(self._position, resume.next_epoch)

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
        return dataclasses.replace(_copy(self._position), partitions=len(self.partitions))

    @property
    def read_stats(self) -> ReadStats:
        return self.dataset.stats

    def open_pass(self, load: Load = plain_load) -> PassStream:
        position = self._position
        if position.finished:
            _advance(position, position.epoch + 1)
        self.epoch = position.epoch
        return _Pass(prefetched(PlannedTasks(self._plan(position)), self.dataset, load,
                                self.prefetch, "trainfeed-local-prefetch"), position,
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


class DistributedBackend:
    """Leases partitions from the master; readers of one job split each epoch between them.

    Building it connects nothing: the session joins the job on the first pass, or when the
    dataset's folder, fields or manifest are first asked for (they come from the master)."""

    def __init__(self, dataset: str, job: str, master: str | None, seed: int,
                 prefetch: int | None, distribution_rules: str = "",
                 resume: ReaderPosition | None = None, lost_partitions: str = "raise",
                 group: SyncGroup | None = None, order: pb.DeliveryOrder | None = None,
                 stats: StatsHook | None = None, version: int | None = None,
                 pinned: tuple[str, ...] | None = None):
        self._pinned = pinned  # LabelOptions.class_values: checked against a restored state
        self.lost_policy = check_lost_policy(lost_partitions)
        self.group = group
        # (epoch, partition, records, reason) of every partition a finished pass went without.
        self.lost: list[tuple[int, int, int, str]] = []
        if resume is not None and resume.partitions:
            # Checked here, before the state goes to the master; the master holds the plan and
            # checks it again (and a partition's records: see batcher.past_the_end).
            resume.check_plan(None, resume.partitions)
        self._resume = resume
        self.client = MasterClient(master)
        sync = None if group is None else pb.SyncGroup(
            world_size=group.world_size, rank=group.rank, batch_size=group.batch_size)
        self.session = WorkerSession(self.client, job, dataset, seed, distribution_rules,
                                     _rewind_request(resume), sync, order, stats,
                                     dataset_version=version or 0)
        self.prefetch = prefetch  # None: from the dataset's size, once the master named it
        self.epoch: int | None = None
        self._dataset: Dataset | None = None
        self._next_epoch = JOIN_CURRENT_EPOCH
        # The one position of this reader (and the one place its seed is kept); the session's
        # worker id and resume credential join it once the session opened.
        self._position = ReaderPosition("distributed", dataset, JOIN_CURRENT_EPOCH, job=job,
                                        seed=seed)
        if resume is not None:
            self._position.class_values = resume.class_values
        if resume is not None and resume.next_epoch >= 0:
            self._next_epoch = resume.next_epoch
            if not resume.finished:  # the master put the rest back; our own view goes on
                self._position.epoch = resume.epoch
                self._position.done = set(resume.done)
                self._position.delivered = resume.delivered

    def _open(self) -> Dataset:
        """Joins the job (once) and resolves the dataset from the master's answer."""
        if self._dataset is not None:
            return self._dataset
        session = self.session
        try:
            session.open()
        except JobError as e:
            if self._resume is not None and _refused_resume(e):
                raise CheckpointError(f"the master refused this reader's state: {e}; restore "
                                      f"the state the reader saved, unchanged, into a reader "
                                      f"of the same job") from None
            if self._resume is not None and self._resume.class_values and _other_version(e):
                raise type(e)(f"{e}. {_saved_classes(self._resume)}") from None
            raise
        opened = session.opened
        dataset = Dataset(session.dataset, session.field_names, session.binary_fields,
                          version=opened.dataset_version or None)
        if self._resume is not None:  # the job's version (0: a master before versions)
            if self._resume.class_values:  # class ids first, as a local reader's
                check_restored_classes(self._resume, dataset.manifest, self._pinned)
            self._resume.check_version(opened.dataset_version)
        self._position.dataset_version = opened.dataset_version
        self._position.worker = opened.worker_id
        self._position.credential = opened.resume_credential
        self.prefetch = self.prefetch or prefetch_depth(opened.num_bytes, opened.num_partitions)
        self._dataset = dataset
        return self._dataset

    def _learn_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def seed(self) -> int:
        return self._position.seed

    @property
    def field_names(self) -> tuple[str, ...]:
        return self._open().field_names

    @property
    def manifest(self) -> Manifest:
        """Read from the dataset folder the master named, on first use (raw readers skip it)."""
        return self._open().manifest

    @property
    def dataset_folder(self) -> Storage:
        return self._open().folder

    def position(self) -> ReaderPosition:
        """Where the trainer stands, once the master knows it too (see WorkerSession.flush),
        with the master's partition count: a restored reader checks the state against it before
        sending it (the master checks the records per partition). Before the session opened:
        the state it would resume from, or the start (nothing is connected for it)."""
        if self._dataset is None:
            return _copy(self._resume if self._resume is not None else self._position)
        position = dataclasses.replace(_copy(self._position),
                                       partitions=self.session.opened.num_partitions)
        self.session.flush(position.epoch, position.positions)
        return position

    @property
    def read_stats(self) -> ReadStats:
        return self._dataset.stats if self._dataset is not None else ReadStats()

    def open_pass(self, load: Load = plain_load) -> PassStream:
        dataset = self._open()
        if self._position.finished:
            _advance(self._position, self._next_epoch)
        quota = None
        if self.group is not None:
            quota = self.group.quota(self.session.opened.num_records)
            if self._next_epoch >= 0 and self._position.epoch == self._next_epoch:
                quota -= self._position.delivered  # a restored or abandoned pass goes on
        assert self.prefetch is not None
        source = LeasedTasks(self.session, self._next_epoch, self._learn_epoch, quota)
        stream = prefetched(source, dataset, load, self.prefetch,
                            f"trainfeed-fetch-{self.session.worker}")

        def on_close(finished: bool) -> None:
            if finished:
                self._next_epoch = (self.epoch + 1) if self.epoch is not None \
                    else JOIN_CURRENT_EPOCH
                if self.epoch is not None:
                    self._tell_lost(self.epoch)
            else:
                # Abandoned mid-way: hand back what we hold; the next pass resumes this epoch.
                self._next_epoch = self.epoch if self.epoch is not None else JOIN_CURRENT_EPOCH
                self.session.end_pass_early()

        return _Pass(stream, self._position, on_consumed=self.session.report_done,
                     on_close=on_close, on_progress=self.session.note_progress,
                     on_lost=self.session.lease_lost, on_claim=self.session.claim)

    def _tell_lost(self, epoch: int) -> None:
        """Raises LostRecordsError if the master gave up on partitions of the epoch this pass
        read (unless the reader was told to skip them, which only counts them)."""
        failed = self.session.epoch_failures.pop(epoch, [])
        if failed is None:
            logger.warning("epoch %d of job %r ended before this reader's pass did; whether "
                           "it lost partitions is no longer known", epoch, self._position.job)
            return
        lost = [(epoch, f.partition, f.num_records, f.reason) for f in failed]
        self.lost += lost
        if lost and self.lost_policy == "raise":
            records = sum(n for _, _, n, _ in lost)
            shown = "; ".join(f"partition {p} ({n} records): {reason}"
                              for _, p, n, reason in lost[:5])
            raise LostRecordsError(
                f"epoch {epoch} of job {self._position.job!r} lost {len(lost)} partition(s), "
                f"{records} records, that no reader could read: {shown}"
                f"{' …' if len(lost) > 5 else ''} (pass lost_partitions='skip' to train on "
                f"without them; reader.lost_partitions lists them)")

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.client.close()


def _advance(position: ReaderPosition, epoch: int) -> None:
    """A finished pass's position moves on to `epoch`, in place: nothing of it done yet."""
    position.epoch, position.finished, position.delivered = epoch, False, 0
    position.done.clear()
    position.positions.clear()


LOST_POLICIES = ("raise", "skip")


def check_lost_policy(policy: str) -> str:
    if policy not in LOST_POLICIES:
        raise ValueError(f"lost_partitions must be one of {LOST_POLICIES}, got {policy!r}")
    return policy


def _copy(position: ReaderPosition) -> ReaderPosition:
    return dataclasses.replace(position, done=set(position.done),
                               positions=dict(position.positions))


def check_restored_classes(resume: ReaderPosition, manifest: Manifest,
                           pinned: tuple[str, ...] | None) -> None:
    """Refuses a state whose reader delivered other class ids than a reader of `manifest`
    with the pin `pinned` would (trainfeed.reader.label_ids.check_saved)."""
    check_saved(resume.dataset, resume.class_values, resume.dataset_version,
                delivered(manifest.classes, pinned), manifest.dataset_version)


def _other_version(error: JobError) -> bool:
    """Whether the master refused OpenJob because the state was saved on another version."""
    return "FAILED_PRECONDITION" in str(error) and "saved reading version" in str(error)


def _saved_classes(resume: ReaderPosition) -> str:
    """What a model trained on a refused state's data expects, for the master's refusal: a
    reader of another version may map labels otherwise, so a pin makes it refuse them."""
    values = resume.class_values
    return (f"The state's model was trained with class ids {mapping(values)} ({len(values)} "
            f"classes): to read another version without the state, pin them "
            f"(LabelOptions(class_values=state['class_values'])), and a reader refuses a "
            f"version whose labels they do not cover")


def _refused_resume(error: JobError) -> bool:
    """Whether the master refused OpenJob for its resume position (INVALID_ARGUMENT naming it:
    a partition it does not have, more records than a partition holds)."""
    text = str(error)
    return "INVALID_ARGUMENT" in text and "resume" in text


def _rewind_request(resume: ReaderPosition | None) -> pb.ResumePosition | None:
    """What the master must undo for a reader restored from `resume` (see Ledger.rewind): in
    the checkpoint's epoch, everything after the checkpoint; if that pass had finished, every
    partition the crashed reader took in the next epoch."""
    if resume is None or resume.next_epoch < 0 or not resume.worker:
        return None
    if resume.finished:
        return pb.ResumePosition(epoch=resume.next_epoch, worker_id=resume.worker,
                                 credential=resume.credential,
                                 dataset_version=resume.dataset_version)
    return pb.ResumePosition(epoch=resume.epoch, worker_id=resume.worker,
                             done=sorted(resume.done), positions=resume.positions,
                             credential=resume.credential, dataset_version=resume.dataset_version)
