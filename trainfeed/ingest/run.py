"""`trainfeed upload`: pack a `.list` file into a published dataset.

The order of work is what makes an upload safe: validate the whole list (every line, every file)
before writing anything; plan every shard from the files' sizes; pack the shards (in several
processes), each written atomically with a progress record, so that an interrupted upload
resumes with the shards it has not finished; publish the manifest last, atomically. Re-running
the same upload (same list, same files) finds the manifest's fingerprint and does nothing.

The steps live in trainfeed.ingest, one module each; this module strings them together. Callers
use it as `trainfeed.upload` (`trainfeed.upload.upload`), which loads it on first use.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from trainfeed.errors import DatasetExistsError, DatasetNotFoundError, InvalidNameError
from trainfeed.formats.manifest import (
    Manifest,
    check_name_is_free,
    dataset_storage,
    read_manifest,
    write_manifest,
)
from trainfeed.ingest import board
from trainfeed.ingest.check import check_images
from trainfeed.ingest.inputs import Inputs, layout_of, read_inputs
from trainfeed.ingest.lock import (
    LOCK_NAME,
    PublishLock,
    UploadLock,
    check_not_replaced,
    published_fingerprint,
)
from trainfeed.ingest.options import (
    DECODE_MEMORY_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_PROCESSES,
    DEFAULT_READ_THREADS,
    READ_AHEAD_BYTES,
    UploadOptions,
)
from trainfeed.ingest.pack import field_specs, pack_tasks
from trainfeed.ingest.plan import plan_shards
from trainfeed.ingest.pool import Packers
from trainfeed.ingest.progress import ShardProgress, finished
from trainfeed.ingest.publish import (
    already_appended,
    build_manifest,
    check_appendable,
    for_append,
    keep_version,
    published_manifest,
    remove_stale_data,
    remove_temporary_files,
)
from trainfeed.ingest.transform import describe, make_transform
from trainfeed.names import check_new_dataset_name
from trainfeed.storage import Storage, open_storage

__all__ = ["DECODE_MEMORY_BYTES", "DEFAULT_MAX_RECORD_BYTES", "DEFAULT_PROCESSES",
           "DEFAULT_READ_THREADS", "LOCK_NAME", "READ_AHEAD_BYTES", "UploadOptions",
           "UploadResult", "check_images", "field_specs", "remove_stale_data",
           "remove_temporary_files", "upload"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadResult:
    dataset: str
    url: str
    num_records: int
    num_bytes: int
    num_shards: int
    skipped: tuple[str, ...]
    already_published: bool
    resumed_shards: int
    seconds: float
    version: int = 1  # the dataset's version published (or found published)
    # Bytes of the shard files this upload wrote (Parquet: payload, ids, labels, metadata):
    # its size on disk, which --max-side and --raw-below change (0 when nothing was written).
    stored_bytes: int = 0


def upload(list_path: str, dataset: str, storage: Storage | str | None = None,
           options: UploadOptions | None = None, progress: bool | None = None,
           on_shard: Callable[[int], None] | None = None) -> UploadResult:
    """What `trainfeed.upload.upload` does (documented there, which loads this module)."""
    started = time.monotonic()
    options = options or UploadOptions()
    store = storage if isinstance(storage, Storage) else open_storage(storage)
    folder = dataset_storage(store, check_new_dataset_name(dataset))  # before any folder
    inputs = read_inputs(list_path, options)
    with UploadLock(folder, dataset):
        previous = published_fingerprint(folder)
        base = None
        if options.append:
            base = _append_base(store, dataset, inputs, options)
            if already_appended(base, inputs.fingerprint):
                logger.debug("dataset %r's current version is this append; nothing to do",
                             dataset)
                return UploadResult(dataset, folder.url, len(inputs.entries), 0, 0,
                                    inputs.skipped, True, 0, time.monotonic() - started,
                                    base.dataset_version)
            inputs = for_append(inputs, base)
        elif previous == inputs.fingerprint:
            logger.debug("dataset %r is already published from this input; nothing to do",
                         dataset)
            return UploadResult(dataset, folder.url, len(inputs.entries), 0, 0, inputs.skipped,
                                True, 0, time.monotonic() - started,
                                _published_version(folder))
        if previous is not None and not (options.overwrite or options.append):
            raise DatasetExistsError(
                f"dataset {dataset!r} already exists in {store.url} with different content; "
                f"use --overwrite to replace it, or upload under another name")
        _prepare(inputs, options, store, folder, dataset)
        shards, resumed = _pack(inputs, options, store, dataset, progress, on_shard)
        manifest = build_manifest(
            dataset, inputs, field_specs(inputs.parsed.kind, inputs.parsed.field_names), shards,
            folder, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), describe(options), base)
        with PublishLock(store):
            _check_still_free(store, folder, dataset, inputs)
            check_not_replaced(folder, dataset, previous)
            if base is not None:
                keep_version(folder, base)
            write_manifest(store, manifest)
        remove_stale_data(folder, keep=inputs.data_dir)
        board.publish(store, dataset, inputs.fingerprint, manifest.num_records,
                      len(manifest.shards), manifest.num_bytes, None)
    return UploadResult(dataset, folder.url, manifest.num_records, manifest.num_bytes,
                        len(manifest.shards), inputs.skipped, False, resumed,
                        time.monotonic() - started, manifest.dataset_version,
                        sum(s.shard.num_bytes for s in shards))


def _check_still_free(store: Storage, folder: Storage, dataset: str, inputs: Inputs) -> None:
    """The check of nested names again, at the moment of publishing (under the storage's
    publish lock): another upload may have published a dataset that holds `dataset`, or that
    `dataset` would hold, since this one started. Then this one publishes nothing and removes
    the shards it packed (they could never be published under this name).

    Raises:
        InvalidNameError: naming both datasets.
    """
    try:
        check_name_is_free(store, dataset)
    except InvalidNameError as e:
        with contextlib.suppress(FileNotFoundError):
            folder.fs.rm(folder.path(inputs.data_dir), recursive=True)
        raise InvalidNameError(
            f"{e}. That dataset was published by another upload while this one ran: this upload "
            f"of {dataset!r} published nothing") from None


def _published_version(folder: Storage) -> int:
    manifest = published_manifest(folder)
    return manifest.dataset_version if manifest is not None else 1


def _append_base(store: Storage, dataset: str, inputs: Inputs,
                 options: UploadOptions) -> Manifest:
    """The version an append extends (the current one), checked to fit the list.

    Raises:
        DatasetNotFoundError: nothing is published to append to.
        AppendMismatchError: the list's fields (named) or transforms differ from the dataset's.
    """
    try:
        base = read_manifest(store, dataset)
    except DatasetNotFoundError as e:
        raise DatasetNotFoundError(f"{e}; --append adds to a published dataset: upload the "
                                   f"first list without --append") from None
    check_appendable(base, inputs,
                     field_specs(inputs.parsed.kind, inputs.parsed.field_names),
                     describe(options))
    return base


def _prepare(inputs: Inputs, options: UploadOptions, store: Storage, folder: Storage,
             dataset: str) -> None:
    """What must hold before a shard is written: the transform can run (refused at once if
    not), the name is free, no temporary files of a killed upload, every image decodes."""
    if inputs.parsed.kind == "file":
        make_transform(options, DECODE_MEMORY_BYTES)
    check_name_is_free(store, dataset)
    remove_temporary_files(folder)
    if options.check_images and inputs.parsed.kind == "file":
        check_images(inputs.parsed, inputs.entries, options.read_threads, list(inputs.sizes))


def _pack(inputs: Inputs, options: UploadOptions, store: Storage, dataset: str,
          progress: bool | None, on_shard: Callable[[int], None] | None,
          ) -> tuple[list[ShardProgress], int]:
    """Packs every planned shard not finished by an earlier run, its progress on the uploads
    board (trainfeed.ingest.board); (all shards' progress in order, how many were resumed)."""
    folder = dataset_storage(store, dataset)
    plans = plan_shards(inputs.sizes, layout_of(options))
    done = {p.index: d for p in plans if (d := finished(folder, inputs.data_dir, p)) is not None}
    if done:
        logger.info("resuming upload of %r: %d of %d shard(s) already written", dataset,
                    len(done), len(plans))
    todo = [p for p in plans if p.index not in done]
    tasks = pack_tasks(inputs, options, folder, todo, options.processes)
    show = progress if progress is not None else sys.stderr.isatty()
    reporter = board.ProgressReporter(store, board.PackerProgress(
        dataset, inputs.fingerprint[:16], None, 1, len(inputs.entries), sum(inputs.sizes),
        len(plans), len(inputs.entries), len(plans)))
    reporter.resumed([p for p in plans if p.index in done], inputs.sizes)
    with Packers(tasks, options.processes) as packers, reporter, _progress_bar(
            show, total=len(inputs.entries),
            initial=sum(len(p) for p in plans if p.index in done), unit="rec",
            unit_scale=True, desc=f"upload {dataset}", smoothing=0.1) as bar:
        for task, written in zip(tasks, packers.results()):
            done[task.plan.index] = written
            bar.update(len(task.plan))
            reporter.add(len(task.plan), sum(inputs.sizes[task.plan.start:task.plan.stop]))
            if on_shard is not None:
                on_shard(task.plan.index)
    return [done[p.index] for p in plans], len(plans) - len(todo)


class _NoBar:
    """What `_progress_bar` hands back when no bar is shown: updates go nowhere."""

    def update(self, n: int = 1) -> None:
        pass


def _progress_bar(show: bool, **options: Any) -> contextlib.AbstractContextManager[Any]:
    """A tqdm bar with `options` when shown, else `_NoBar`: tqdm is imported only by uploads
    that show one (its import took 0.04 CPU-s of every `trainfeed upload --no-progress`, and
    of every upload not run from a terminal)."""
    if not show:
        return contextlib.nullcontext(_NoBar())
    from tqdm import tqdm
    return cast(contextlib.AbstractContextManager[Any], tqdm(**options))
