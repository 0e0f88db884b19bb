"""Reading partitions that are slices of a row group (issue 13, point 3): a slice delivers exactly
its rows, ids and payloads included, with or without a payload index, through every read path,
and without fetching its row group's other payloads."""
from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from sample_data import file_digests, make_image_list

from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.manifest import ID_COLUMN, Manifest, dataset_storage, read_manifest
from trainfeed.formats.shards import PAYLOAD_INDEX_SUFFIX
from trainfeed.io.partition_reader import COPIES_COLUMN, PartitionReader, read_task
from trainfeed.io.prefetch import TaskRef
from trainfeed.planning.partitions import Partition, plan_partitions
from trainfeed.storage import Storage, open_storage
from trainfeed.upload import UploadOptions, upload

N = 600  # 3 row groups of 200 (2 in the first shard, 1 in the second): 64 slices of 9 or 10


@pytest.fixture(scope="module")
def sliced_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Manifest, Path]:
    root = tmp_path_factory.mktemp("slices")
    source = make_image_list(root / "source", N)
    storage = str(root / "storage")
    upload(str(source), "flowers", storage,
           UploadOptions(row_group_rows=200, shard_row_groups=2), progress=False)
    return storage, read_manifest(open_storage(storage), "flowers"), source


def reader_of(storage: str) -> PartitionReader:
    return PartitionReader(dataset_storage(open_storage(storage), "flowers"),
                           ["image", "label"], binary=["image"])


def task_of(p: Partition, skip: int = 0) -> TaskRef:
    return TaskRef(0, p.index, p.shard, p.row_group_start, p.row_group_stop, p.num_records,
                   skip, row_start=p.row_start)


def expected_ids(manifest: Manifest, p: Partition) -> list[int]:
    shard = next(s for s in manifest.shards if s.path == p.shard)
    first = shard.row_groups[p.row_group_start].first_id + p.row_start
    return list(range(first, first + p.num_records))


def check_rows(table: pa.Table, ids: list[int], digests: dict[int, tuple[str, str]]) -> None:
    assert table.column(ID_COLUMN).to_pylist() == ids
    for record, image, label in zip(ids, table.column("image").to_pylist(),
                                    table.column("label").to_pylist()):
        assert (hashlib.sha256(image).hexdigest(), label) == digests[record]


def test_the_plan_slices_the_three_row_groups_into_64(
        sliced_dataset: tuple[str, Manifest, Path]) -> None:
    _, manifest, _ = sliced_dataset
    assert [len(s.row_groups) for s in manifest.shards] == [2, 1]
    parts = plan_partitions(manifest)
    assert len(parts) == 64
    assert {p.num_records for p in parts} <= {9, 10}
    assert any(p.row_group_start == 1 and p.row_start > 0 for p in parts)


def test_every_slice_reads_exactly_its_rows_and_no_other_payload(
        sliced_dataset: tuple[str, Manifest, Path]) -> None:
    storage, manifest, source = sliced_dataset
    digests = file_digests(source)
    reader = reader_of(storage)
    seen: list[int] = []
    for p in plan_partitions(manifest):
        table = read_task(reader, task_of(p), None)
        check_rows(table, expected_ids(manifest, p), digests)
        seen += table.column(ID_COLUMN).to_pylist()
    reader.close()
    assert sorted(seen) == list(range(N))
    # Each payload fetched once: cutting a row group into slices does not re-read it per slice.
    files = sum((source.parent / "images" / f"{i:05d}.jpg").stat().st_size for i in range(N))
    assert reader.stats.payload_bytes == files


def test_skip_counts_from_the_slice_s_first_record(
        sliced_dataset: tuple[str, Manifest, Path]) -> None:
    storage, manifest, source = sliced_dataset
    p = next(p for p in plan_partitions(manifest) if p.row_start > 0)
    table = read_task(reader_of(storage), task_of(p, skip=3), None)
    check_rows(table, expected_ids(manifest, p)[3:], file_digests(source))


def test_a_selector_sees_the_slice_s_rows_alone(sliced_dataset: tuple[str, Manifest, Path]) -> None:
    storage, manifest, source = sliced_dataset
    p = next(p for p in plan_partitions(manifest) if p.row_group_start == 1 and p.row_start > 0)
    ids = expected_ids(manifest, p)
    offered: list[list[int]] = []

    def selector(task: TaskRef, meta: pa.Table) -> np.ndarray:
        offered.append(meta.column(ID_COLUMN).to_pylist())
        return np.array([i % 3 for i in range(meta.num_rows)])  # 0, 1 or 2 copies

    table = read_task(reader_of(storage), task_of(p, skip=1), selector)
    assert offered == [ids]
    kept = [(ids[k], k % 3) for k in range(1, len(ids)) if k % 3]  # minus the skipped first
    assert list(zip(table.column(ID_COLUMN).to_pylist(),
                    table.column(COPIES_COLUMN).to_pylist())) == kept
    check_rows(table.drop_columns([COPIES_COLUMN]), [i for i, _ in kept], file_digests(source))


def test_slices_of_a_shard_without_payload_index_are_read_whole_and_cut(
        sliced_dataset: tuple[str, Manifest, Path], tmp_path: Path) -> None:
    storage, manifest, source = sliced_dataset
    old = tmp_path / "old"
    shutil.copytree(storage, old)
    for index in old.rglob("*" + PAYLOAD_INDEX_SUFFIX):
        index.unlink()
    digests = file_digests(source)
    reader = reader_of(str(old))
    seen: list[int] = []
    for p in plan_partitions(manifest):
        table = read_task(reader, task_of(p), None)
        check_rows(table, expected_ids(manifest, p), digests)
        selected = read_task(reader, task_of(p), lambda task, meta: np.ones(meta.num_rows))
        check_rows(selected.drop_columns([COPIES_COLUMN]), expected_ids(manifest, p), digests)
        seen += table.column(ID_COLUMN).to_pylist()
    reader.close()
    assert sorted(seen) == list(range(N))


def test_a_slice_past_its_row_group_is_an_error(sliced_dataset: tuple[str, Manifest, Path]) -> None:
    storage, manifest, _ = sliced_dataset
    last = next(p for p in reversed(plan_partitions(manifest)) if p.row_group_start == 0)
    beyond = dataclasses.replace(task_of(last), row_start=last.row_start + 1)
    with pytest.raises(CorruptDatasetError,
                       match=r"row groups \[0, 1\) hold 200 rows, the manifest names rows "
                             rf"\[{last.row_start + 1}, 201\)"):
        read_task(reader_of(storage), beyond, None)


def test_slices_over_a_non_local_filesystem_fetch_ranges_alone(
        sliced_dataset: tuple[str, Manifest, Path]) -> None:
    """The object-store path (fsspec `cat_ranges`), on fsspec's in-memory filesystem: the same
    rows and content, each payload fetched once."""
    storage, manifest, source = sliced_dataset
    memory = fsspec.filesystem("memory")
    root = "/slices-test"
    try:
        for path in (Path(storage) / "flowers").rglob("*"):
            if path.is_file():
                rel = path.relative_to(Path(storage) / "flowers").as_posix()
                memory.pipe(f"{root}/flowers/{rel}", path.read_bytes())
        folder = dataset_storage(Storage(f"memory://{root}"), "flowers")
        assert not folder.is_local
        reader = PartitionReader(folder, ["image", "label"], binary=["image"])
        digests = file_digests(source)
        for p in plan_partitions(manifest):
            check_rows(read_task(reader, task_of(p), None), expected_ids(manifest, p), digests)
        reader.close()
        files = sum((source.parent / "images" / f"{i:05d}.jpg").stat().st_size
                    for i in range(N))
        assert reader.stats.payload_bytes == files
    finally:
        memory.rm(root, recursive=True)
