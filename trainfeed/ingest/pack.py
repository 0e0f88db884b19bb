"""One shard packed: its files read (on threads), transformed, cut into row groups, encoded,
written with its payload index, and its progress record written last.

`pack_shard` is what every packing process runs, in an upload's process pool
(trainfeed.ingest.pool) or as an index of a cluster job (trainfeed.ingest.slices): it needs
nothing but its `PackTask`, which pickles. Its output depends on the task alone.
"""
from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from trainfeed.errors import ListFileError
from trainfeed.formats import shards as shard_format
from trainfeed.formats.listfile import ListEntry
from trainfeed.formats.manifest import FieldSpec, ShardInfo
from trainfeed.formats.shards import PackedValues, RowGroupBuffer
from trainfeed.ingest.inputs import Inputs, layout_of
from trainfeed.ingest.options import DECODE_MEMORY_BYTES, READ_AHEAD_BYTES, UploadOptions
from trainfeed.ingest.plan import ShardPlan, row_groups
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


class Scratch(threading.local):
    """The two buffers a packing thread reads row groups into (trainfeed.ingest.pack.read_groups)
    and reads a finished shard back into (ShardEncoder.finish, into the first), kept from shard
    to shard: a fresh bytearray per shard is fresh pages, each faulted in and zeroed by the
    kernel (65,000 page faults, most of them, in an upload of 10,000 photos; issue 30 §2).
    Per thread, so that uploads run by two threads of one process never share one. They hold
    what the largest row group needs until `release` (trainfeed.ingest.pool.Packers does, in
    the caller's process; a packing process ends instead)."""

    def __init__(self) -> None:
        self.buffers = [bytearray(), bytearray()]

    def buffer(self, index: int, size: int) -> bytearray:
        """Buffer `index` (0 or 1), of at least `size` bytes; its content is left over. One
        that must grow gets an eighth more than asked (at most GROWTH_CAP): row groups' sizes
        vary a little around
        `row_group_bytes`, and each growth is new pages again (6,000 faults per growth by 1 MiB
        at 8 MiB buffers)."""
        if len(self.buffers[index]) < size:
            self.buffers[index] = bytearray()  # the old one freed before the new one is made
            self.buffers[index] = bytearray(size + min(size // GROWTH_SHARE, GROWTH_CAP))
        return self.buffers[index]

    def release(self) -> None:
        self.buffers = [bytearray(), bytearray()]


SCRATCH = Scratch()
# A growing buffer gets 1/GROWTH_SHARE more than asked (Scratch.buffer).
GROWTH_SHARE = 8
# ... and at most this much more: the margin is for row groups of about `row_group_bytes`
# (1 MiB at 8 MiB), not for a group of one large record (128 MiB more for a 1 GiB file).
GROWTH_CAP = 4 << 20


def field_specs(kind: str, field_names: tuple[str, ...]) -> tuple[FieldSpec, ...]:
    """The schema fields of a list: file bytes are binary, every other column a string."""
    return tuple(FieldSpec(name, "binary" if kind == "file" and i == 0 else "string")
                 for i, name in enumerate(field_names))


def pack_shard(task: PackTask) -> ShardProgress:
    """Packs shard `task.plan` and returns its progress (also written, after the shard).

    Idempotent: packing a shard again writes the same bytes (atomically) under the same names.
    Memory: the row group being encoded (at most `row_group_bytes` plus one record) and Arrow's
    pages of it, the next one being read (within the read-ahead), a buffer to read back one
    encoded row group, and, for object stores only, the encoded shard (its bytes so far): a
    local shard is encoded into its file (trainfeed.formats.shards.ShardEncoder)."""
    transform = (make_transform(task.options, task.transform_memory_bytes)
                 if task.kind == "file" else None)
    schema = shard_format.arrow_schema(task.fields)
    groups = (read_groups(task) if task.kind == "file" and transform is None
              else cut_groups(task, read_payloads(task, transform)))
    if not task.folder.is_local:
        return _pack(task, shard_format.ShardEncoder(schema), groups)
    # Local folders: the shard is encoded straight into a temporary sibling of its name, synced,
    # then renamed over it (what Storage.write_atomic does with bytes).
    target = task.folder.path(task.shard_path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temporary = f"{target}.tmp-{uuid.uuid4().hex}"
    try:
        return _pack(task, shard_format.ShardEncoder(schema, temporary, _read_back_buffer),
                     groups)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _read_back_buffer(size: int) -> bytearray:
    """Where a finished shard is read back (ShardEncoder.finish): the first of the row groups'
    buffers, free once every group is encoded."""
    return SCRATCH.buffer(0, size)


def _pack(task: PackTask, encoder: shard_format.ShardEncoder,
          groups: Iterator[RowGroupBuffer]) -> ShardProgress:
    labels: Counter[str] = Counter()
    payload = 0
    for group in groups:
        encoder.add(group)
        payload += group.payload_bytes
        if task.label_index is not None:
            labels.update(str(v) for v in group.columns[task.label_index])
    return _write(task, encoder, labels, payload)


def cut_groups(task: PackTask, payloads: Iterator[Payload]) -> Iterator[RowGroupBuffer]:
    """Row groups of records as they stream past (their stored sizes known only once read):
    a group ends at `row_group_rows` records or before passing `row_group_bytes`."""
    options, width = task.options, len(task.fields)
    group = RowGroupBuffer.empty(width)
    for entry, values, size in payloads:
        if len(group) and (len(group) >= options.row_group_rows
                           or group.payload_bytes + size > options.row_group_bytes):
            yield group
            group = RowGroupBuffer.empty(width)
        group.add(entry.record_id, values, size)
    if len(group):
        yield group


def read_groups(task: PackTask) -> Iterator[RowGroupBuffer]:
    """The row groups of a file list's shard stored as they are, each group's files read
    straight into one buffer (PackedValues) on `read_threads` threads, the next group read
    while the caller encodes this one when it fits the read-ahead.

    Stored sizes are the files' sizes, known from the plan: the groups are those `cut_groups`
    would make (trainfeed.ingest.plan.row_groups), so the shard is byte-identical to the
    streaming path's. A file whose size changed since it was listed is an error naming it
    (its shard was planned from the old size)."""
    groups = _FileGroups.of(task)
    with ThreadPoolExecutor(task.options.read_threads,
                            thread_name_prefix="trainfeed-read") as pool:
        ahead = groups.start(pool, 0) if groups.count else None
        for k in range(groups.count):
            assert ahead is not None
            values, reads = ahead
            ahead = None
            for future in reads:
                future.result()
            following = k + 1 < groups.count
            if following and groups.file_bytes(k + 1) <= task.read_ahead_bytes:
                ahead = groups.start(pool, k + 1)
            yield groups.group(k, values)
            if following and ahead is None:
                ahead = groups.start(pool, k + 1)


@dataclass(frozen=True)
class _FileGroups:
    """A file list shard's row groups as `read_groups` reads them: group k holds entries
    bounds[k]..bounds[k+1]-1, whose files fill one of the two scratch buffers in turn."""

    task: PackTask
    file_sizes: list[int]  # each entry's file's size: its planned size less its other columns
    bounds: list[int]
    largest: int  # the most file bytes of any group: what each scratch buffer must hold

    @classmethod
    def of(cls, task: PackTask) -> _FileGroups:
        other = [sum(len(c.encode()) for c in e.columns[1:]) for e in task.entries]
        file_sizes = [size - extra for size, extra in zip(task.sizes, other)]
        counts = row_groups(task.sizes, layout_of(task.options))
        bounds = [0, *itertools.accumulate(counts)]
        largest = max((sum(file_sizes[a:b]) for a, b in itertools.pairwise(bounds)), default=0)
        return cls(task, file_sizes, bounds, largest)

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    def file_bytes(self, k: int) -> int:
        """The bytes of group k's files: what reading it ahead holds."""
        return sum(self.file_sizes[self.bounds[k]:self.bounds[k + 1]])

    def start(self, pool: ThreadPoolExecutor, k: int
              ) -> tuple[PackedValues, list[Future[None]]]:
        """Starts reading group k's files on `pool`: the buffer they fill, and the reads to
        wait for before it is used."""
        a, b = self.bounds[k], self.bounds[k + 1]
        offsets = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(self.file_sizes[a:b], out=offsets[1:])
        # Two buffers: the group handed to the encoder, and the next one being read. The second
        # is made when a second group is read, not before: a bytearray's pages are all touched
        # (zeroed) when it is made, and a shard of one large record (a 1 GiB file) never needs
        # it (it held 1.125x the record for nothing).
        buffer = SCRATCH.buffer(k % 2, self.largest)
        values = PackedValues(memoryview(buffer)[:int(offsets[-1])], offsets)
        # Runs of files per thread: a task per file cost more than reading a cached 80 KB file.
        step = -(-(b - a) // self.task.options.read_threads)
        return values, [pool.submit(_read_run, self.task, a, values, i, min(i + step, b - a))
                        for i in range(0, b - a, step)]

    def group(self, k: int, values: PackedValues) -> RowGroupBuffer:
        """Group k, its files read into `values`, its other columns from the list."""
        a, b = self.bounds[k], self.bounds[k + 1]
        entries = self.task.entries[a:b]
        return RowGroupBuffer([e.record_id for e in entries], [values] + [
            [e.columns[i] for e in entries] for i in range(1, len(self.task.fields))],
            sum(self.task.sizes[a:b]))


def _read_run(task: PackTask, first: int, values: PackedValues, lo: int, hi: int) -> None:
    """Reads the files of values lo..hi-1 (entries first+lo...) into their places."""
    offsets = values.offsets[lo:hi + 1].tolist()
    for i in range(lo, hi):
        entry = task.entries[first + i]
        path = entry.columns[0]
        target = values.data[offsets[i - lo]:offsets[i - lo + 1]]
        try:
            # Unbuffered: readinto fills the target directly, with the GIL released.
            with open(path, "rb", buffering=0) as f:
                got = 0
                while got < len(target):
                    n = f.readinto(target[got:])
                    if not n:
                        break
                    got += n
                if got == len(target) and f.read(1):
                    got += 1
        except OSError as e:
            raise ListFileError(f"{task.list_path}:{entry.line}: cannot read "
                                f"{path}: {e.strerror or e}") from e
        if got != len(target):
            raise ListFileError(
                f"{task.list_path}:{entry.line}: {path} changed while being uploaded: "
                f"{len(target)} bytes when listed, {'more' if got > len(target) else got} now; "
                f"upload files that are not being written to, or re-run the upload")


def _write(task: PackTask, encoder: shard_format.ShardEncoder, labels: Counter[str],
           payload: int) -> ShardProgress:
    """Finishes the shard (written in place, or its bytes written now), writes its payload
    index, then its progress record."""
    data, sha, groups, index = encoder.finish()
    folder = task.folder
    if data is None:
        assert encoder.path is not None
        os.replace(encoder.path, folder.path(task.shard_path))
    else:
        # A view of the encoder's buffer: written as it is to files, copied for object stores.
        folder.write_atomic(task.shard_path, cast(bytes, data) if folder.is_local
                            else bytes(data))
        data.release()
    index_rel = None
    if index is not None and index.shape[1]:
        index_rel = task.shard_path + shard_format.PAYLOAD_INDEX_SUFFIX
        folder.write_atomic(index_rel, shard_format.payload_index_bytes(index))
    info = ShardInfo(path=task.shard_path, num_rows=len(task.plan), num_bytes=encoder.size,
                     sha256=sha, row_groups=groups, payload_index=index_rel)
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
