"""An upload as N packers and a commit: the indexes of a Kubernetes Indexed Job, or N local
processes given JOB_COMPLETION_INDEX (how it is tested).

Every packer computes the same plan on its own: the shards are a pure function of the list,
its files' sizes and the layout (trainfeed.ingest.plan), and the staging area is the upload's
shard folder, `data/<fingerprint>/` in the dataset's folder, which no manifest names until the
commit. Index i packs the i-th contiguous run of shards (`slice_of`), skipping those an earlier
attempt finished (each shard and its progress record are written atomically, so a packer
killed mid-slice loses at most the shard it was writing), then writes its slice record
`_slices/slice-<i>.json`. A slice that fails writes `_slices/slice-<i>.failed.json` with the
error instead. While it packs, each index keeps its live progress on the storage's uploads
board (trainfeed.ingest.board), which `trainfeed status --uploads` and the master's status page
read.

The commit validates every slice (its record, and every shard's progress record, file and size)
and publishes one manifest, atomically: readers never see a partial dataset. The manifest's
bytes depend only on the input and `created_at`, which the submitter fixes once for the whole
job: re-running an index, or the commit, writes the same bytes. Each packer tries the commit
after its slice (the last one to finish publishes; concurrent commits write identical bytes);
`trainfeed upload-commit` runs it on demand and names any slice that is missing or failed.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from trainfeed.errors import DatasetExistsError, IncompleteUploadError
from trainfeed.formats.manifest import (
    Manifest,
    check_name_is_free,
    dataset_storage,
    write_manifest,
)
from trainfeed.ingest import board
from trainfeed.ingest.inputs import Inputs, layout_of, read_inputs
from trainfeed.ingest.lock import PublishLock, published_fingerprint
from trainfeed.ingest.options import UploadOptions
from trainfeed.ingest.pack import field_specs, pack_tasks
from trainfeed.ingest.plan import ShardPlan, plan_shards, slice_of
from trainfeed.ingest.pool import Packers
from trainfeed.ingest.progress import ShardProgress, finished
from trainfeed.ingest.publish import build_manifest, remove_stale_data
from trainfeed.ingest.transform import describe, make_transform
from trainfeed.storage import Storage, open_storage

logger = logging.getLogger(__name__)

SLICES_DIR = "_slices"
# Incomplete slices whose packer's last report (trainfeed.ingest.board) a refusal quotes: each
# costs a read, and every packer's commit attempt refuses until the last slice is done.
MAX_REPORTS = 5


@dataclass(frozen=True)
class SliceJob:
    """One cluster upload: the same for every index and for the commit."""

    list_path: str
    dataset: str
    storage: Storage
    workers: int
    created_at: str  # fixed by the submitter: the manifest's bytes depend on it
    options: UploadOptions = UploadOptions()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be ≥ 1, got {self.workers}")

    @property
    def folder(self) -> Storage:
        return dataset_storage(self.storage, self.dataset)


@dataclass(frozen=True)
class SliceResult:
    index: int
    shards: tuple[int, ...]
    resumed: int  # shards an earlier attempt had finished
    published: bool  # this packer's commit published the dataset


def slice_path(data_dir: str, index: int, failed: bool = False) -> str:
    return f"{data_dir}/{SLICES_DIR}/slice-{index:05d}{'.failed' if failed else ''}.json"


def _plans(job: SliceJob) -> tuple[Inputs, tuple[ShardPlan, ...]]:
    inputs = read_inputs(job.list_path, job.options)
    return inputs, plan_shards(inputs.sizes, layout_of(job.options))


def pack_slice(job: SliceJob, index: int, commit_after: bool = True) -> SliceResult:
    """Packs slice `index` of `job` (resumable, idempotent), records it, then tries the
    commit if `commit_after` (publishing if every slice is done; waiting for none).

    Raises:
        Whatever packing raised (a file that cannot be read, say), after writing the slice's
        failure record, so that the commit names it.
    """
    inputs, plans = _plans(job)
    mine = slice_of(plans, index, job.workers)
    folder = job.folder
    reporter = board.ProgressReporter(job.storage, _packer_progress(job, inputs, plans, index))
    try:
        resumed = _pack_shards(job, folder, inputs, mine, reporter)
    except Exception as e:
        reporter.close(e)  # on the board first: the slice record says the upload's outcome
        _record_failure(folder, inputs.data_dir, index, mine, e)
        raise
    _record_slice(job, folder, inputs, index, mine)
    published = commit_after and _try_commit(job, inputs, plans, index)
    return SliceResult(index, tuple(p.index for p in mine), resumed, published)


def _pack_shards(job: SliceJob, folder: Storage, inputs: Inputs, mine: tuple[ShardPlan, ...],
                 reporter: board.ProgressReporter) -> int:
    """Packs the shards of `mine` into `folder` that an earlier attempt did not finish,
    reporting each on the uploads board; how many were finished already (resumed)."""
    if inputs.parsed.kind == "file":
        make_transform(job.options, 1)  # refuses at once if the transform cannot run
    done = {p.index: d for p in mine
            if (d := finished(folder, inputs.data_dir, p)) is not None}
    reporter.resumed([p for p in mine if p.index in done], inputs.sizes)
    todo = [p for p in mine if p.index not in done]
    tasks = pack_tasks(inputs, job.options, folder, todo, job.options.processes)
    # The reporter's thread starts after the packing processes are forked.
    with Packers(tasks, job.options.processes) as packers, reporter:
        for task, _ in zip(tasks, packers.results()):
            reporter.add(len(task.plan), sum(inputs.sizes[task.plan.start:task.plan.stop]))
    return len(done)


def _record_failure(folder: Storage, data_dir: str, index: int, mine: tuple[ShardPlan, ...],
                    error: Exception) -> None:
    """Writes slice `index`'s failure record, so that the commit names the slice and its
    error instead of waiting for it."""
    record = {"index": index, "error": f"{type(error).__name__}: {error}",
              "shards": [p.index for p in mine]}
    folder.write_atomic(slice_path(data_dir, index, failed=True),
                        json.dumps(record, sort_keys=True).encode())


def _record_slice(job: SliceJob, folder: Storage, inputs: Inputs, index: int,
                  mine: tuple[ShardPlan, ...]) -> None:
    """Writes slice `index`'s record, the commit's sign that it is done, after removing the
    failure record an earlier attempt may have left (which the commit would report first)."""
    failed = slice_path(inputs.data_dir, index, failed=True)
    if folder.exists(failed):
        folder.fs.rm(folder.path(failed))
    record = {"index": index, "workers": job.workers, "fingerprint": inputs.fingerprint,
              "shards": [p.index for p in mine]}
    folder.write_atomic(slice_path(inputs.data_dir, index),
                        json.dumps(record, sort_keys=True).encode())


def _try_commit(job: SliceJob, inputs: Inputs, plans: tuple[ShardPlan, ...],
                index: int) -> bool:
    """Publishes the upload if every slice is done: whether this call published it. Slices
    still packing are no error here (the last packer to finish publishes)."""
    try:
        commit(job, inputs=inputs, plans=plans)
    except IncompleteUploadError as e:
        logger.info("slice %d of %d done; not published yet: %s", index, job.workers, e)
        return False
    return True


def commit(job: SliceJob, inputs: Inputs | None = None,
           plans: tuple[ShardPlan, ...] | None = None) -> Manifest:
    """Validates every slice and publishes the manifest atomically; idempotent.

    Raises:
        IncompleteUploadError: naming every slice that has not finished, failed (with its error), or
            whose shards are not as planned. Nothing is published then.
        DatasetExistsError: another dataset of that name is published (`overwrite` not set).
    """
    if inputs is None or plans is None:
        inputs, plans = _plans(job)
    folder = job.folder
    previous = published_fingerprint(folder)
    if previous is not None and previous != inputs.fingerprint and not job.options.overwrite:
        raise DatasetExistsError(
            f"dataset {job.dataset!r} already exists in {job.storage.url} with different "
            f"content; use --overwrite to replace it, or upload under another name")
    shards = _validated(job, inputs, plans)
    manifest = build_manifest(job.dataset, inputs,
                              field_specs(inputs.parsed.kind, inputs.parsed.field_names),
                              shards, folder, job.created_at, describe(job.options))
    with PublishLock(job.storage):  # nested names published meanwhile: see PublishLock
        check_name_is_free(job.storage, job.dataset)
        write_manifest(job.storage, manifest)
    remove_stale_data(folder, keep=inputs.data_dir)
    board.publish(job.storage, job.dataset, inputs.fingerprint, manifest.num_records,
                  len(manifest.shards), manifest.num_bytes, job.workers)
    return manifest


def _packer_progress(job: SliceJob, inputs: Inputs, plans: tuple[ShardPlan, ...],
                     index: int) -> board.PackerProgress:
    """Slice `index`'s record on the uploads board, nothing packed yet."""
    mine = slice_of(plans, index, job.workers)
    return board.PackerProgress(
        dataset=job.dataset, fingerprint=inputs.fingerprint[:16], index=index,
        slices=job.workers, records_total=sum(len(p) for p in mine),
        bytes_total=sum(inputs.sizes[mine[0].start:mine[-1].stop]) if mine else 0,
        shards_total=len(mine), upload_records=len(inputs.entries), upload_shards=len(plans))


def _validated(job: SliceJob, inputs: Inputs, plans: tuple[ShardPlan, ...],
               ) -> list[ShardProgress]:
    """Every shard's progress, or IncompleteUploadError naming each slice that is not complete."""
    problems: list[str] = []
    by_index: dict[int, ShardProgress] = {}
    for index in range(job.workers):
        mine = slice_of(plans, index, job.workers)
        problem = _slice_problem(job, inputs.data_dir, index, mine, by_index,
                                 with_report=len(problems) < MAX_REPORTS)
        if problem:
            shards = (f"shards {mine[0].index}-{mine[-1].index}" if mine else "no shards")
            problems.append(f"slice {index} ({shards}): {problem}")
    if problems:
        raise IncompleteUploadError(
            f"upload of {job.dataset!r} not published: {len(problems)} of {job.workers} "
            f"slice(s) incomplete: " + "; ".join(problems) + ". Run those indexes again "
            "(JOB_COMPLETION_INDEX=<slice>, `trainfeed upload-slice`); each resumes after "
            "its finished shards")
    return [by_index[p.index] for p in plans]


def _slice_problem(job: SliceJob, data_dir: str, index: int, mine: tuple[ShardPlan, ...],
                   by_index: dict[int, ShardProgress], with_report: bool) -> str:
    """Why slice `index` is not complete ("" when it is); fills `by_index` with its shards.
    `with_report`: add what its packer last said on the uploads board (one more read)."""
    folder, storage, dataset = job.folder, job.storage, job.dataset
    try:
        failure = json.loads(folder.read_bytes(slice_path(data_dir, index, failed=True)))
        return f"failed: {failure.get('error', 'no error recorded')}"
    except FileNotFoundError:
        pass
    if not folder.exists(slice_path(data_dir, index)):
        report = (board.last_report(storage, dataset, data_dir.rsplit("/", 1)[-1], index)
                  if with_report else "")
        return "not finished (no slice record)" + (f"; {report}" if report else "")
    for plan in mine:
        done = finished(folder, data_dir, plan)
        if done is None:
            return f"shard {plan.index} has no valid progress record"
        try:
            size = folder.fs.size(folder.path(done.shard.path))
        except FileNotFoundError:
            return f"shard file {done.shard.path} is missing"
        if size != done.shard.num_bytes:
            return (f"shard file {done.shard.path} has {size} bytes, its record "
                    f"{done.shard.num_bytes}")
        by_index[plan.index] = done
    return ""


def job_from_environment(list_path: str, dataset: str, storage: str | None, workers: int,
                         created_at: str | None, options: UploadOptions) -> SliceJob:
    """A SliceJob from the CLI's arguments (`created_at` defaults to now: a local run)."""
    return SliceJob(list_path, dataset, open_storage(storage), workers,
                    created_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), options)


__all__ = ["SliceJob", "SliceResult", "commit", "pack_slice", "slice_path"]
