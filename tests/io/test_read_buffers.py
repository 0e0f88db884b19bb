"""The buffers a partition's payloads were read into are let go (and so recycled) as soon as no
batch still to be decoded holds its rows: not when the trainer had its last record, and not
while a few of its rows wait in the shuffle buffer. Counted on the ImageNet-like train reader,
holding them longer kept up to 48 partitions' buffers alive for a shuffle buffer of ~15, more
than the read-buffer pool kept: every row group was read into pages the kernel zeroed first."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from trainfeed import BatchOptions, LocalSource, PipelineOptions, SamplingOptions, dist
from trainfeed.io import array_pool
from trainfeed.io.gather import compacted
from trainfeed.io.prefetch import LoadedPartition, TaskRef
from trainfeed.reader import pipeline as pipeline_module
from trainfeed.reader.batcher import Cutter, Piece, deliver
from trainfeed.upload import UploadOptions, upload

ROWS = 10  # per partition
BLOB = 5000  # bytes per record: large enough to be gathered as slices (trainfeed.io.gather)


def blob(record: int) -> bytes:
    return bytes([record % 251]) * BLOB


class Partitions:
    """A PassStream that makes each partition when the batcher asks for it, its payloads in one
    numpy buffer (as PartitionReader reads them), and keeps nothing but a weak reference."""

    def __init__(self, count: int):
        self.count = count
        self.buffers: list[weakref.ref[np.ndarray]] = []
        self.epoch: int | None = 0
        self.positions: dict[int, int] = {}
        self.delivered = 0

    def __iter__(self) -> Iterator[LoadedPartition]:
        for p in range(self.count):
            ids = range(p * ROWS, (p + 1) * ROWS)
            data = np.frombuffer(b"".join(blob(i) for i in ids), np.uint8).copy()
            self.buffers.append(weakref.ref(data))
            offsets = np.arange(0, (ROWS + 1) * BLOB, BLOB, dtype=np.int32)
            images = pa.Array.from_buffers(pa.binary(), ROWS, [None, pa.py_buffer(offsets),
                                                               pa.py_buffer(data)])
            del data
            table = pa.table({"_id": pa.array(ids, pa.int64()), "image": images})
            yield LoadedPartition(TaskRef(0, p, "s", 0, 1, ROWS), table)

    def alive(self) -> list[int]:
        gc.collect()
        return [p for p, ref in enumerate(self.buffers) if ref() is not None]

    def entered(self, part: LoadedPartition) -> None: ...
    def taken(self, part: LoadedPartition) -> None: ...
    def consumed(self, part: LoadedPartition) -> None: ...
    def progress(self, part: LoadedPartition, handed: int) -> None: ...
    def close(self, finished: bool) -> None: ...
    def forget(self, part: LoadedPartition) -> None: ...

    def lost(self, part: LoadedPartition) -> bool:
        return False


def copied(piece: Piece) -> list[tuple[int, bytes]]:
    """A batch that holds nothing of the partitions (as decoded images hold nothing)."""
    table = piece.table
    assert table is not None
    return list(zip(table.column("_id").to_pylist(), table.column("image").to_pylist()))


def test_a_partition_s_buffer_is_let_go_while_its_leftover_rows_wait_in_the_shuffle() -> None:
    # A window of 20 rows (2 partitions) cut into batches of 8: 4 rows of partitions 0 and 1
    # wait for the next window, which comes once partitions 2 and 3 are in.
    stream = Partitions(4)
    batches = deliver(stream, Cutter(8, shuffle=(0, 20)), copied)  # type: ignore[arg-type]
    got = [next(batches), next(batches)]  # window 1 (partitions 0, 1)
    assert stream.alive() == [0, 1]  # ... the pieces of window 1 hold them until decoded
    got.append(next(batches))  # window 2 cut: partitions 0 and 1 have 4 rows left in it
    assert 0 not in stream.alive() and 1 not in stream.alive()
    got += list(batches)
    records = [record for batch in got for record in batch]
    assert sorted(r for r, _ in records) == list(range(4 * ROWS))
    assert all(image == blob(r) for r, image in records)


def test_compacted_rows_point_into_no_buffer_of_the_source() -> None:
    table = pa.table({"_id": pa.array(range(6), pa.int64()),
                      "image": pa.array([blob(i) for i in range(6)], pa.binary())})
    leftover = table.slice(2, 3)
    alone = compacted(leftover)
    assert alone.to_pylist() == leftover.to_pylist() and alone.schema == table.schema
    source = {b.address for b in table.column("image").chunk(0).buffers() if b is not None}
    assert not source & {b.address for chunk in alone.column("image").chunks
                         for b in chunk.buffers() if b is not None}
    assert compacted(table.slice(0, 0)).num_rows == 0


def test_a_table_too_large_for_one_array_keeps_its_slices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainfeed.io import gather
    table = pa.table({"image": pa.array([blob(i) for i in range(6)], pa.binary())})
    monkeypatch.setattr(gather, "COMPACT_MAX_BYTES", BLOB)
    leftover = table.slice(2, 3)
    assert compacted(leftover) is leftover


def test_later_passes_read_into_the_buffers_of_earlier_ones(
        image_list: Path, storage_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool per pass was empty at each pass's start (a pass of the 5,000-image benchmark
    lasts two seconds): every pass mapped fresh buffers again."""
    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=8),
           progress=False)
    fresh: list[int] = []
    real = array_pool.ArrayPool._hand

    def counted(pool: array_pool.ArrayPool, array: np.ndarray) -> np.ndarray:
        if array.ndim == 1:  # a read buffer (batches of images are 4-D)
            fresh[-1] += 1
        return real(pool, array)
    monkeypatch.setattr(array_pool.ArrayPool, "_hand", counted)
    # One load thread: with two, a pass can need a second buffer at a moment the pool has one
    # free (two loads at once), which is not what this counts; a pass of one thread reuses
    # the first pass's buffers or it does not.
    monkeypatch.setattr(pipeline_module, "load_threads", lambda: 1)
    reader = dist.reader("flowers", source=LocalSource(storage=storage_dir, seed=1),
                         pipeline=PipelineOptions(batch=BatchOptions(size=10),
                                                  sampling=SamplingOptions(shuffle_buffer=30)))
    records = []
    for _ in range(3):
        fresh.append(0)
        for batch in reader():
            records += batch["_id"].tolist()
            del batch
    assert sorted(records) == sorted(list(range(100)) * 3)
    assert fresh[0] >= 1 and fresh[1] + fresh[2] <= fresh[0] // 2, fresh
