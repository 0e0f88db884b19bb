"""A reader's partitions leased from a master: the distributed backend.

Apart from trainfeed.reader.backends (the backend contract and the local backend) because it is
the only part of a reader that speaks to the master: it brings the lease session and gRPC with it,
and a local (`TRAIN_LOCAL=1`) reader imports neither (issue 36; tests/reader/test_local_imports.py).
"""
from __future__ import annotations

import dataclasses
import logging

from trainfeed.errors import CheckpointError, JobError, LostRecordsError
from trainfeed.formats.manifest import Manifest
from trainfeed.io.load import Load, plain_load
from trainfeed.io.partition_reader import ReadStats
from trainfeed.io.prefetch import prefetch_depth
from trainfeed.lease.client import MasterClient
from trainfeed.lease.session import JOIN_CURRENT_EPOCH, Join, WorkerSession
from trainfeed.lease.tasks import LeasedTasks
from trainfeed.reader.backends import (
    Pass,
    PassStream,
    advance,
    check_restored_classes,
    copy_position,
)
from trainfeed.reader.label_ids import mapping
from trainfeed.reader.position import ReaderPosition
from trainfeed.reader.producer import Dataset, prefetched
from trainfeed.reader.sources import MasterSource
from trainfeed.reader.world import SyncGroup
from trainfeed.storage import Storage
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)


class DistributedBackend:
    """Leases partitions from the master; readers of one job split each epoch between them.

    Building it connects nothing: the session joins the job on the first pass, or when the
    dataset's folder, fields or manifest are first asked for (they come from the master)."""

    def __init__(self, dataset: str, source: MasterSource,
                 resume: ReaderPosition | None = None, group: SyncGroup | None = None,
                 order: pb.DeliveryOrder | None = None, version: int | None = None,
                 pinned: tuple[str, ...] | None = None):
        """`source` as the user gave it, checked (MasterSource validates itself), its job
        resolved (MasterSource.resolved)."""
        self._pinned = pinned  # LabelOptions.class_values: checked against a restored state
        self.lost_policy = source.lost_partitions
        self.group = group
        # (epoch, partition, records, reason) of every partition a finished pass went without.
        self.lost: list[tuple[int, int, int, str]] = []
        if resume is not None and resume.partitions:
            # Checked here, before the state goes to the master; the master holds the plan and
            # checks it again (and a partition's records: see batcher.past_the_end).
            resume.check_plan(None, resume.partitions)
        self._resume = resume
        self.client = MasterClient(source.address)
        sync = None if group is None else pb.SyncGroup(
            world_size=group.world_size, rank=group.rank, batch_size=group.batch_size)
        job, seed = source.job or "", source.seed
        self.session = WorkerSession(self.client, Join(
            job, dataset, seed, source.distribution_rules or "", _rewind_request(resume), sync,
            order, version or 0))
        # None: from the dataset's size, once the master named it.
        self.prefetch = source.prefetch_partitions
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
        try:
            dataset = Dataset.joined(opened)
            if self._resume is not None:  # the job's version (0: a master before versions)
                if self._resume.class_values:  # class ids first, as a local reader's
                    check_restored_classes(self._resume, dataset.manifest, self._pinned)
                self._resume.check_version(opened.dataset_version)
        except BaseException:
            # Refused after the job was joined: the session hands its leases back and stops
            # heartbeating now, not when the reader is closed or collected.
            session.close()
            raise
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
            return copy_position(self._resume if self._resume is not None else self._position)
        position = dataclasses.replace(copy_position(self._position),
                                       partitions=self.session.opened.num_partitions)
        self.session.flush(position.epoch, position.positions)
        return position

    @property
    def read_stats(self) -> ReadStats:
        return self._dataset.stats if self._dataset is not None else ReadStats()

    def open_pass(self, load: Load = plain_load, threads: int = 1) -> PassStream:
        dataset = self._open()
        if self._position.finished:
            advance(self._position, self._next_epoch)
        quota = None
        if self.group is not None:
            quota = self.group.quota(self.session.opened.num_records)
            if self._next_epoch >= 0 and self._position.epoch == self._next_epoch:
                quota -= self._position.delivered  # a restored or abandoned pass goes on
        assert self.prefetch is not None
        source = LeasedTasks(self.session, self._next_epoch, self._learn_epoch, quota)
        stream = prefetched(source, dataset, load, self.prefetch,
                            f"trainfeed-fetch-{self.session.worker}", threads)

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

        return Pass(stream, self._position, on_consumed=self.session.report_done,
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
