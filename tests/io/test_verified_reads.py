"""No silent wrong bytes: page checksums, per-record checksums of ranged reads, bounds-checked
payload indexes, and clear errors for missing or truncated shards (issue 14, verified reads)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import LocalSource, dist
from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.manifest import Manifest, dataset_storage, read_manifest
from trainfeed.formats.shards import (
    CRC32_COLUMN,
    CRC32C_COLUMN,
    INDEX_COLUMNS,
    PAYLOAD_INDEX_SUFFIX,
)
from trainfeed.io.partition_reader import PartitionReader
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

N = 40


@pytest.fixture
def verified_dataset(tmp_path: Path, storage_dir: str) -> tuple[str, Manifest]:
    upload(str(make_image_list(tmp_path / "src", N)), "flowers", storage_dir,
           UploadOptions(row_group_rows=10), progress=False)
    return storage_dir, read_manifest(open_storage(storage_dir), "flowers")


def shard_file(storage_dir: str, manifest: Manifest) -> Path:
    return Path(storage_dir) / "flowers" / manifest.shards[0].path


def payload_offsets(storage_dir: str, manifest: Manifest) -> np.ndarray:
    index_path = shard_file(storage_dir, manifest).with_name(
        Path(manifest.shards[0].path).name + PAYLOAD_INDEX_SUFFIX)
    return np.load(index_path)


def write_index(storage_dir: str, manifest: Manifest, index: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(index))
    shard_file(storage_dir, manifest).with_name(
        Path(manifest.shards[0].path).name + PAYLOAD_INDEX_SUFFIX).write_bytes(buffer.getvalue())


def reader(storage_dir: str) -> PartitionReader:
    return PartitionReader(dataset_storage(open_storage(storage_dir), "flowers"),
                           ["image", "label"], binary=["image"])


def flip(path: Path, offset: int, count: int = 3) -> None:
    data = bytearray(path.read_bytes())
    for k in range(count):
        data[offset + k] ^= 0xFF
    path.write_bytes(bytes(data))


def every_id_choose(meta: object) -> np.ndarray:
    return np.ones(len(meta), dtype=np.int64)  # type: ignore[arg-type]


def test_the_index_records_a_checksum_per_payload(verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    index = payload_offsets(storage_dir, manifest)
    assert index.shape == (manifest.shards[0].num_rows, 1, INDEX_COLUMNS)
    table = reader(storage_dir).read(manifest.shards[0].path, 0, 1, 10)
    import zlib

    from trainfeed.formats.crc import crc32c
    values = table.column("image").to_pylist()
    assert [zlib.crc32(v) for v in values] == index[:10, 0, CRC32_COLUMN].tolist()
    assert [crc32c(v) for v in values] == index[:10, 0, CRC32C_COLUMN].tolist()


@pytest.mark.parametrize("columns", [3, INDEX_COLUMNS])
def test_the_checksum_readers_verify_is_the_one_the_index_has(
        verified_dataset: tuple[str, Manifest], columns: int) -> None:
    """Readers verify the CRC-32C of a 4-column index, and the CRC-32 of a 3-column one (as
    earlier versions wrote them): a wrong value in that column is caught, by every read path,
    and a wrong value in the column not checked changes nothing."""
    storage_dir, manifest = verified_dataset
    index = payload_offsets(storage_dir, manifest)[:, :, :columns].copy()
    checked = CRC32C_COLUMN if columns == INDEX_COLUMNS else CRC32_COLUMN
    shard = manifest.shards[0].path
    if columns == INDEX_COLUMNS:
        index[12, 0, CRC32_COLUMN] ^= 1  # not what this index is checked by
    write_index(storage_dir, manifest, index)
    assert reader(storage_dir).read(shard, 1, 2, 10).num_rows == 10
    index[12, 0, checked] ^= 1
    write_index(storage_dir, manifest, index)
    with pytest.raises(CorruptDatasetError, match="record 12 of shard .*checksum"):
        reader(storage_dir).read(shard, 1, 2, 10)
    with pytest.raises(CorruptDatasetError, match="record 12 of shard .*checksum"):
        reader(storage_dir).read_selected(shard, 1, 2, 10, every_id_choose)


def test_flipped_payload_bytes_fail_every_read_path(verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    index = payload_offsets(storage_dir, manifest)
    at = int(index[13, 0, 0]) + 100  # inside record 13's JPEG (row group 1)
    flip(shard_file(storage_dir, manifest), at)
    shard = manifest.shards[0].path
    # Whole row groups and selected rows alike: payloads read by range, checked per record.
    with pytest.raises(CorruptDatasetError, match="record 13 of shard .*checksum"):
        reader(storage_dir).read(shard, 1, 2, 10)
    with pytest.raises(CorruptDatasetError, match="record 13 of shard .*checksum"):
        reader(storage_dir).read_selected(shard, 1, 2, 10, every_id_choose)
    assert reader(storage_dir).read(shard, 0, 1, 10).num_rows == 10  # other pages are fine
    # Through the user's API, locally: the pass raises instead of yielding a wrong image.
    local = dist.reader("flowers", source=LocalSource(storage=storage_dir))
    with pytest.raises(CorruptDatasetError):
        for _ in local():
            pass
    local.close()
    # An older index without checksums: whole row groups are Parquet's read, whose page
    # checksums catch the same bytes.
    write_index(storage_dir, manifest, index[:, :, :2])
    with pytest.raises(CorruptDatasetError, match=r"row groups \[1, 2\): corrupt data"):
        reader(storage_dir).read(shard, 1, 2, 10)


def test_a_shifted_index_is_caught_by_the_checksums(verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    index_path = shard_file(storage_dir, manifest).with_name(
        Path(manifest.shards[0].path).name + PAYLOAD_INDEX_SUFFIX)
    index = np.load(index_path)
    index[:, 0, 0] += 1
    buffer = io.BytesIO()
    np.save(buffer, index)
    index_path.write_bytes(buffer.getvalue())
    with pytest.raises(CorruptDatasetError, match="record 0 of shard .*checksum"):
        reader(storage_dir).read_selected(manifest.shards[0].path, 0, 1, 10, every_id_choose)


def test_an_index_pointing_outside_the_shard_is_refused(
        verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    index_path = shard_file(storage_dir, manifest).with_name(
        Path(manifest.shards[0].path).name + PAYLOAD_INDEX_SUFFIX)
    index = np.load(index_path)
    index[5, 0, 1] = 1 << 40  # once: MemoryError in the reader
    buffer = io.BytesIO()
    np.save(buffer, index)
    index_path.write_bytes(buffer.getvalue())
    with pytest.raises(CorruptDatasetError, match="row 5 points at 1099511627776 bytes"):
        reader(storage_dir).read_selected(manifest.shards[0].path, 0, 1, 10, every_id_choose)


def test_a_truncated_or_deleted_shard_is_an_error_naming_it(
        verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    path = shard_file(storage_dir, manifest)
    shard = manifest.shards[0].path
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptDatasetError, match=f"shard {shard} .*unreadable"):
        reader(storage_dir).read(shard, 0, 1, 10)
    path.unlink()
    with pytest.raises(CorruptDatasetError, match=f"shard {shard} .*missing"):
        reader(storage_dir).read(shard, 0, 1, 10)


def test_inflated_row_counts_are_an_error(verified_dataset: tuple[str, Manifest]) -> None:
    storage_dir, manifest = verified_dataset
    with pytest.raises(CorruptDatasetError, match="hold 10 rows, the manifest says 12"):
        reader(storage_dir).read(manifest.shards[0].path, 0, 1, 12)
