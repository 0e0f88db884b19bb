"""One shard packed: its files read (on threads), transformed, cut into row groups, encoded,
written with its payload index, and its progress record written last.

`pack_shard` is what every packing process runs, in an upload's process pool
(trainfeed.ingest.pool) or as an index of a cluster job (trainfeed.ingest.slices): it needs
nothing but its `PackTask`, which pickles. Its output depends on the task alone.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

from trainfeed.errors import ListFileError
from trainfeed.formats import shards as shard_format
from trainfeed.formats.listfile import ListEntry
from trainfeed.formats.manifest import FieldSpec, ShardInfo
from trainfeed.ingest.inputs import Inputs
from trainfeed.ingest.options import DECODE_MEMORY_BYTES, READ_AHEAD_BYTES, UploadOptions
from trainfeed.ingest.plan import ShardPlan
from trainfeed.ingest.progress import ShardProgress, progress_path
from trainfeed.ingest.transform import Transform, make_transform
from trainfeed.storage import Storage

# One record as read: its entry, field values (file bytes first for file lists), payload bytes.
Payload = tuple[ListEntry, tuple[bytes | str, ...], int]


@dataclass(frozen=True)
class PackTask:
    """Everything one shard's packer needs (picklable: it crosses to a packing process)."""

    folder: Storage  # the dataset's folder
    data_dir: str  # the upload's shard folder, in `folder`
    list_path: str
    kind: str
    fields: tuple[FieldSpec, ...]
    label_index: int | None
    options: UploadOptions
    plan: ShardPlan
    entries: tuple[ListEntry, ...]  # the shard's: entries[plan.start:plan.stop] of the upload
    sizes: tuple[int, ...]  # their planned sizes (files' sizes plus other columns)
    # This process's share of the read-ahead and of the budget for images being transformed.
    read_ahead_bytes: int = READ_AHEAD_BYTES
    transform_memory_bytes: int = 256 << 20

    @property
    def shard_path(self) -> str:
        return f"{self.data_dir}/shard-{self.plan.index:05d}.parquet"


def field_specs(kind: str, field_names: tuple[str, ...]) -> tuple[FieldSpec, ...]:
    """The schema fields of a list: file bytes are binary, every other column a string."""
    return tuple(FieldSpec(name, "binary" if kind == "file" and i == 0 else "string")
                 for i, name in enumerate(field_names))


def pack_shard(task: PackTask) -> ShardProgress:
    """Packs shard `task.plan` and returns its progress (also written, after the shard).

    Idempotent: packing a shard again writes the same bytes (atomically) under the same names.
    Memory: the row group being filled (at most `row_group_bytes` plus one record, and its Arrow
    copy), the encoded shard (its bytes so far), and the files read ahead."""
    options = task.options
    transform = (make_transform(options, task.transform_memory_bytes)
                 if task.kind == "file" else None)
    encoder = shard_format.ShardEncoder(shard_format.arrow_schema(task.fields))
    group = shard_format.RowGroupBuffer.empty(len(task.fields))
    labels: Counter[str] = Counter()
    payload = 0
    for entry, values, size in read_payloads(task, transform):
        if len(group) and (len(group) >= options.row_group_rows
                           or group.payload_bytes + size > options.row_group_bytes):
            encoder.add(group)
            group = shard_format.RowGroupBuffer.empty(len(task.fields))
        group.add(entry.record_id, values, size)
        payload += size
        if task.label_index is not None:
            labels[str(values[task.label_index])] += 1
    if len(group):
        encoder.add(group)
    del group
    return _write(task, encoder, labels, payload)


def _write(task: PackTask, encoder: shard_format.ShardEncoder, labels: Counter[str],
           payload: int) -> ShardProgress:
    """Writes the encoded shard, its payload index, then its progress record."""
    data, sha, groups, index = encoder.finish()
    folder = task.folder
    # A view of the encoder's buffer: written as it is to files, copied once for object stores.
    folder.write_atomic(task.shard_path, cast(bytes, data) if folder.is_local else bytes(data))
    index_rel = None
    if index is not None and index.shape[1]:
        index_rel = task.shard_path + shard_format.PAYLOAD_INDEX_SUFFIX
        folder.write_atomic(index_rel, shard_format.payload_index_bytes(index))
    info = ShardInfo(path=task.shard_path, num_rows=len(task.plan), num_bytes=len(data),
                     sha256=sha, row_groups=groups, payload_index=index_rel)
    data.release()
    progress = ShardProgress(info, task.plan.stop, dict(sorted(labels.items())), payload)
    folder.write_atomic(progress_path(task.data_dir, task.plan.index), progress.to_json())
    return progress


def read_ahead_windows(entries: tuple[ListEntry, ...], sizes: tuple[int, ...] | None,
                       threads: int, budget: int = READ_AHEAD_BYTES,
                       ) -> Iterator[tuple[ListEntry, ...]]:
    """Consecutive slices of `entries` read together: at most threads * 8 files and, when the
    sizes are known, at most `budget` bytes (but always at least one file)."""
    start = 0
    while start < len(entries):
        stop, total = start, 0
        while stop < len(entries) and stop - start < threads * 8:
            size = sizes[stop] if sizes is not None else 0
            if stop > start and total + size > budget:
                break
            total += size
            stop += 1
        yield entries[start:stop]
        start = stop


def read_payloads(task: PackTask, transform: Transform | None) -> Iterator[Payload]:
    """Yields (entry, field values, payload bytes) of the task's entries in order, reading files
    on `read_threads` threads within the read-ahead; `transform` maps each file's bytes on the
    reading threads (its C parts release the GIL)."""
    if task.kind == "text":
        for entry in task.entries:
            yield entry, entry.columns, sum(len(c.encode()) for c in entry.columns)
        return

    def load(entry: ListEntry) -> Payload:
        try:
            with open(entry.columns[0], "rb") as f:
                data = f.read()
        except OSError as e:
            raise ListFileError(f"{task.list_path}:{entry.line}: cannot read "
                                f"{entry.columns[0]}: {e.strerror or e}") from e
        if transform is not None:
            data = transform(f"{task.list_path}:{entry.line}: {entry.columns[0]}", data)
        return entry, (data, *entry.columns[1:]), len(data) + sum(
            len(c.encode()) for c in entry.columns[1:])

    def load_run(run: tuple[ListEntry, ...]) -> list[Payload]:
        return [load(entry) for entry in run]

    threads = task.options.read_threads
    with ThreadPoolExecutor(threads, thread_name_prefix="trainfeed-read") as pool:
        for window in read_ahead_windows(task.entries, task.sizes, threads,
                                         task.read_ahead_bytes):
            # Runs of files per thread task: a task per file cost more than reading a cached
            # 80 KB file (0.33 CPU-s of 3.5 for 3,000 photos went to submitting them).
            step = -(-len(window) // threads)
            for run in pool.map(load_run, [window[i:i + step]
                                           for i in range(0, len(window), step)]):
                yield from run


def pack_tasks(inputs: Inputs, options: UploadOptions, folder: Storage,
               plans: Sequence[ShardPlan], processes: int) -> list[PackTask]:
    """One task per planned shard, each with its process's share of the memory budgets."""
    fields = field_specs(inputs.parsed.kind, inputs.parsed.field_names)
    share = max(1, processes)
    return [PackTask(folder=Storage(folder.url, folder.options), data_dir=inputs.data_dir,
                     list_path=inputs.parsed.path, kind=inputs.parsed.kind, fields=fields,
                     label_index=inputs.parsed.label_index, options=options, plan=plan,
                     entries=inputs.entries[plan.start:plan.stop],
                     sizes=inputs.sizes[plan.start:plan.stop],
                     read_ahead_bytes=READ_AHEAD_BYTES // share,
                     transform_memory_bytes=DECODE_MEMORY_BYTES // share)
            for plan in plans]
