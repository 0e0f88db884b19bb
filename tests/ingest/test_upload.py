from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sample_data import file_digests, make_image_list

from trainfeed.errors import DatasetExistsError, InvalidNameError, ListFileError, MissingFilesError
from trainfeed.formats.manifest import ID_COLUMN, list_datasets, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

SMALL = UploadOptions(row_group_rows=8, shard_row_groups=4)


def without_time(manifest: bytes) -> dict:
    """A manifest's content but the time it was written."""
    body = json.loads(manifest)
    body.pop("created_at")
    for version in body.get("versions", ()):  # its history names the time too
        version.pop("created_at")
    return body


def stored_rows(storage_dir: str, dataset: str) -> dict[int, tuple[str, str]]:
    """Record id -> (sha256 of stored bytes, label), read back from the Parquet shards."""
    storage = open_storage(storage_dir)
    manifest = read_manifest(storage, dataset)
    rows = {}
    for shard in manifest.shards:
        table = pq.read_table(storage.path(dataset, shard.path))
        for rid, image, label in zip(table[ID_COLUMN].to_pylist(), table["image"].to_pylist(),
                                     table["label"].to_pylist()):
            rows[rid] = (hashlib.sha256(image).hexdigest(), label)
    return rows


def test_upload_stores_every_file_undecoded_with_stable_ids(image_list: Path,
                                                            storage_dir: str) -> None:
    result = upload(str(image_list), "flowers", storage_dir, SMALL, progress=False)
    manifest = read_manifest(open_storage(storage_dir), "flowers")
    assert result.num_records == manifest.num_records == 100
    assert stored_rows(storage_dir, "flowers") == file_digests(image_list)
    assert manifest.label_histogram == {"bird": 33, "cat": 34, "dog": 33}
    assert manifest.field_names == ("image", "label")
    # Row groups and shards are bounded as asked: 13 groups of ≤ 8 rows in 4 shards.
    assert [len(s.row_groups) for s in manifest.shards] == [4, 4, 4, 1]
    assert all(g.num_rows <= 8 for s in manifest.shards for g in s.row_groups)
    for shard in manifest.shards:
        data = open_storage(storage_dir).read_bytes("flowers", shard.path)
        assert hashlib.sha256(data).hexdigest() == shard.sha256
        assert pq.ParquetFile(open_storage(storage_dir).path("flowers", shard.path)) \
            .num_row_groups == len(shard.row_groups)


def test_row_groups_are_bounded_by_bytes_too(image_list: Path, storage_dir: str) -> None:
    size = max(os.path.getsize(p) for p in (image_list.parent / "images").iterdir())
    upload(str(image_list), "flowers", storage_dir,
           UploadOptions(row_group_bytes=3 * size + 20), progress=False)
    manifest = read_manifest(open_storage(storage_dir), "flowers")
    assert all(g.num_rows <= 3 for s in manifest.shards for g in s.row_groups)
    assert manifest.num_records == 100


def test_same_upload_twice_is_a_no_op(image_list: Path, storage_dir: str) -> None:
    first = upload(str(image_list), "flowers", storage_dir, SMALL, progress=False)
    manifest_path = Path(storage_dir, "flowers", "manifest.json")
    before = manifest_path.stat().st_mtime_ns
    again = upload(str(image_list), "flowers", storage_dir, SMALL, progress=False)
    assert again.already_published and not first.already_published
    assert manifest_path.stat().st_mtime_ns == before


@pytest.mark.parametrize("processes", [1, 2])
def test_interrupted_upload_publishes_nothing_and_resumes(image_list: Path, storage_dir: str,
                                                          processes: int) -> None:
    """Shards are planned before packing: a re-run skips every shard finished before the
    interruption (with several processes, more than the ones the caller saw), in any order."""
    class Interrupted(Exception):
        pass

    def crash_after_two(shard: int) -> None:
        if shard == 1:
            raise Interrupted

    options = dataclasses.replace(SMALL, processes=processes)
    with pytest.raises(Interrupted):
        upload(str(image_list), "flowers", storage_dir, options, progress=False,
               on_shard=crash_after_two)
    assert list_datasets(open_storage(storage_dir)) == []  # nothing visible
    written = sorted(Path(storage_dir, "flowers").rglob("shard-*.parquet"))
    assert len(written) == 2 if processes == 1 else 2 <= len(written) <= 4
    mtimes = [p.stat().st_mtime_ns for p in written]

    result = upload(str(image_list), "flowers", storage_dir, options, progress=False)
    assert result.resumed_shards == len(written)
    assert [p.stat().st_mtime_ns for p in written] == mtimes  # not rewritten
    assert stored_rows(storage_dir, "flowers") == file_digests(image_list)


def test_a_shard_missing_in_the_middle_is_packed_again_alone(image_list: Path,
                                                             storage_dir: str) -> None:
    upload(str(image_list), "flowers", storage_dir, SMALL, progress=False)
    manifest_path = Path(storage_dir, "flowers", "manifest.json")
    before = manifest_path.read_bytes()
    manifest_path.unlink()
    progress = sorted(Path(storage_dir, "flowers").rglob("_progress/shard-*.json"))
    progress[1].unlink()
    result = upload(str(image_list), "flowers", storage_dir, SMALL, progress=False)
    assert result.resumed_shards == 3
    assert without_time(manifest_path.read_bytes()) == without_time(before)
    assert stored_rows(storage_dir, "flowers") == file_digests(image_list)


def test_missing_files_are_all_listed_and_nothing_is_published(image_list: Path,
                                                               storage_dir: str) -> None:
    for i in (3, 50, 97):
        (image_list.parent / f"images/{i:05d}.jpg").unlink()
    with pytest.raises(MissingFilesError) as e:
        upload(str(image_list), "flowers", storage_dir, progress=False)
    assert [line for line, _ in e.value.missing] == [4, 51, 98]
    message = str(e.value)
    assert "3 file(s) named in" in message and "--skip-missing" in message
    for line, i in ((4, 3), (51, 50), (98, 97)):
        assert f"train_data.list:{line}: {image_list.parent}/images/{i:05d}.jpg" in message
    assert list_datasets(open_storage(storage_dir)) == []
    assert not Path(storage_dir, "flowers").exists()


def test_skip_missing_publishes_the_rest_and_reports(image_list: Path, storage_dir: str) -> None:
    (image_list.parent / "images/00007.jpg").unlink()
    result = upload(str(image_list), "flowers", storage_dir,
                    UploadOptions(skip_missing=True), progress=False)
    assert result.num_records == 99
    assert len(result.skipped) == 1 and result.skipped[0].endswith("images/00007.jpg")
    expected = file_digests_without(image_list, 7)
    assert stored_rows(storage_dir, "flowers") == expected
    assert read_manifest(open_storage(storage_dir), "flowers").skipped == result.skipped


def file_digests_without(list_path: Path, missing: int) -> dict[int, tuple[str, str]]:
    """Like file_digests, for a list one of whose files is gone (ids keep their list position)."""
    out = {}
    for i, line in enumerate(list_path.read_text().splitlines()):
        if i != missing:
            rel, label = line.split("\t")
            out[i] = (hashlib.sha256((list_path.parent / rel).read_bytes()).hexdigest(), label)
    return out


def test_a_different_dataset_of_the_same_name_needs_overwrite(tmp_path: Path,
                                                              storage_dir: str) -> None:
    first = make_image_list(tmp_path / "a", 10)
    second = make_image_list(tmp_path / "b", 12, seed=1)
    upload(str(first), "flowers", storage_dir, progress=False)
    with pytest.raises(DatasetExistsError, match="--overwrite"):
        upload(str(second), "flowers", storage_dir, progress=False)
    assert read_manifest(open_storage(storage_dir), "flowers").num_records == 10
    upload(str(second), "flowers", storage_dir, UploadOptions(overwrite=True), progress=False)
    assert read_manifest(open_storage(storage_dir), "flowers").num_records == 12
    # The replaced upload's shards are gone; only the live one's data folder remains.
    assert len(list(Path(storage_dir, "flowers", "data").iterdir())) == 1


def test_text_lists_store_every_column_as_text(tmp_path: Path, storage_dir: str) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"source {i}\tcible {i}\n" for i in range(50)))
    upload(str(pairs), "wmt", storage_dir, UploadOptions(columns=("src", "dst")), progress=False)
    manifest = read_manifest(open_storage(storage_dir), "wmt")
    assert manifest.kind == "text" and manifest.field_names == ("src", "dst")
    assert manifest.label_field is None and manifest.label_histogram == {}
    table = pq.read_table(open_storage(storage_dir).path("wmt", manifest.shards[0].path))
    assert table["dst"].to_pylist()[:2] == ["cible 0", "cible 1"]


def test_malformed_list_publishes_nothing(image_list: Path, storage_dir: str) -> None:
    image_list.write_text(image_list.read_text() + "images/00001.jpg\tcat\textra\n")
    with pytest.raises(ListFileError, match=r"train_data.list:101: expected 2"):
        upload(str(image_list), "flowers", storage_dir, progress=False)
    assert not Path(storage_dir).exists()


def test_dataset_names_cannot_escape_the_storage(image_list: Path, storage_dir: str) -> None:
    with pytest.raises(InvalidNameError):
        upload(str(image_list), "../outside", storage_dir, progress=False)


def test_upload_options_validate_themselves() -> None:
    with pytest.raises(ValueError, match="row_group_rows must be ≥ 1"):
        UploadOptions(row_group_rows=0)
