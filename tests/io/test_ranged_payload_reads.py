"""Whole row groups of a local shard read their payloads by range into one buffer (no copy
through Parquet's builder): the same table as Parquet's read, few system calls, and every
fault still an error naming the record."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sample_data import make_image_list

from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.manifest import Manifest, dataset_storage, read_manifest
from trainfeed.io import partition_reader
from trainfeed.io.partition_reader import PartitionReader
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

ROWS = 60  # per row group; 3 row groups in one shard


@pytest.fixture(scope="module")
def repeated_files_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Manifest]:
    root = tmp_path_factory.mktemp("ranged")
    source = make_image_list(root / "source", 3 * ROWS - 4, size=32)
    # Repeated files: equal values, which Parquet may store once (in a dictionary page).
    lines = source.read_text().splitlines(keepends=True)
    source.write_text("".join(lines + lines[:4]))
    storage = str(root / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=ROWS),
           progress=False)
    return storage, read_manifest(open_storage(storage), "flowers")


def reader_of(storage: str) -> PartitionReader:
    return PartitionReader(dataset_storage(open_storage(storage), "flowers"),
                           ["image", "label"], binary=["image"])


def parquet_read(storage: str, shard: str, start: int, stop: int) -> pa.Table:
    """What Parquet itself reads (page checksums verified): the reference."""
    reader = reader_of(storage)
    held = sum(reader._shard(shard).metadata.row_group(i).num_rows for i in range(start, stop))
    return reader._row_groups(shard, start, stop, held, reader.columns)


def test_whole_row_groups_equal_parquet_s_own_read(
        repeated_files_dataset: tuple[str, Manifest]) -> None:
    storage, manifest = repeated_files_dataset
    shard = manifest.shards[0].path
    reader = reader_of(storage)
    for start, stop in ((0, 1), (1, 3), (0, 3)):
        table = reader.read(shard, start, stop, ROWS * (stop - start))
        assert table.equals(parquet_read(storage, shard, start, stop))
    last = reader.read(shard, 2, 3, ROWS).column("image").to_pylist()
    assert last[-4:] == reader.read(shard, 0, 1, ROWS).column("image").to_pylist()[:4]


def test_a_row_group_s_payloads_are_one_buffer_and_one_system_call(
        repeated_files_dataset: tuple[str, Manifest], monkeypatch: pytest.MonkeyPatch) -> None:
    storage, manifest = repeated_files_dataset
    calls, real = [], os.preadv

    def counted(fd: int, buffers: list, offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, buffers, offset)
    monkeypatch.setattr(partition_reader.os, "preadv", counted, raising=False)
    table = reader_of(storage).read(manifest.shards[0].path, 0, 1, ROWS)
    column = table.column("image")
    assert column.num_chunks == 1 and column.chunk(0).buffers()[2].size == sum(
        len(v) for v in column.to_pylist())
    assert len(calls) == 1 and calls[0] >= ROWS  # the values, and the gaps between them


def test_small_limits_give_the_same_table(repeated_files_dataset: tuple[str, Manifest],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No coalescing (gap 0), 7 values per call, buffers of ~3 values: the same rows."""
    storage, manifest = repeated_files_dataset
    shard = manifest.shards[0].path
    expected = parquet_read(storage, shard, 0, 3)
    sizes = [len(v) for v in expected.column("image").to_pylist()]
    monkeypatch.setattr(partition_reader, "COALESCE_GAP", 0)
    monkeypatch.setattr(partition_reader, "COALESCE_VALUES", 7)
    monkeypatch.setattr(partition_reader, "MAX_CHUNK_BYTES", 3 * max(sizes))
    table = reader_of(storage).read(shard, 0, 3, 3 * ROWS)
    assert table.column("image").num_chunks > 3
    assert table.to_pylist() == expected.to_pylist()


def test_a_shard_truncated_after_it_was_opened_is_an_error_naming_the_record(
        repeated_files_dataset: tuple[str, Manifest], tmp_path: Path) -> None:
    storage, manifest = repeated_files_dataset
    copy = tmp_path / "storage"
    shutil.copytree(storage, copy)
    shard = manifest.shards[0].path
    reader = reader_of(str(copy))
    reader.read(shard, 0, 1, ROWS)  # footer and index loaded, file open
    path = copy / "flowers" / shard
    cut = int(reader._index(shard)[ROWS + 5, 0, 0]) + 10  # inside row group 1's sixth value
    os.truncate(path, cut)
    first_id = manifest.shards[0].row_groups[1].first_id
    with pytest.raises(CorruptDatasetError, match=f"shard {shard} "):
        reader.read(shard, 1, 2, ROWS)
    # The payloads alone (Parquet's small columns, after them in the file, fail first above).
    rows = np.arange(ROWS, 2 * ROWS)
    with pytest.raises(CorruptDatasetError, match=f"record {first_id + 5} of shard .*ends "
                                                  f"before its payload"):
        reader._fetch(shard, reader._index(shard)[rows, 0], first_id + rows - ROWS)


def test_no_rows_read_as_an_empty_column(repeated_files_dataset: tuple[str, Manifest]) -> None:
    storage, manifest = repeated_files_dataset
    reader = reader_of(storage)
    empty = reader._fetch(manifest.shards[0].path, np.zeros((0, 3), np.int64),
                          np.zeros(0, np.int64))
    assert len(empty) == 0 and empty.type == pa.binary()


def test_payload_buffers_are_reused_only_once_nothing_holds_their_rows(
        repeated_files_dataset: tuple[str, Manifest]) -> None:
    """Each row group's payloads go into a recycled buffer (no fresh pages to zero): a slice
    a shuffle buffer still holds keeps its bytes while later reads reuse released buffers."""
    storage, manifest = repeated_files_dataset
    shard = manifest.shards[0].path
    reader = reader_of(storage)
    table = reader.read(shard, 0, 1, ROWS)
    expected = table.column("image").to_pylist()[5:8]
    held = table.slice(5, 3)
    del table
    for _ in range(4):
        other = reader.read(shard, 1, 2, ROWS)
        assert other.equals(parquet_read(storage, shard, 1, 2))
        del other
    assert reader._payload_buffers.reused >= 3
    assert held.column("image").to_pylist() == expected
