"""`upload` trusts nothing in the list: kind detection that cannot flip silently, no files from
outside the list's folder, no dataset inside another, bounded records, no stale temporary files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed.errors import (
    InvalidNameError,
    MissingFilesError,
    OutsidePathsError,
    OversizeRecordsError,
)
from trainfeed.formats.listfile import ListEntry, parse_list
from trainfeed.formats.manifest import list_datasets, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import READ_AHEAD_BYTES, UploadOptions, _read_ahead_windows, upload


def write_list(folder: Path, text: str | bytes, name: str = "train_data.list") -> Path:
    path = folder / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# -- kind detection never flips a file list into a text dataset ------------------------------
@pytest.mark.parametrize("first", ["images/missing.jpg", "photo.png", "images"])
def test_a_first_line_naming_a_missing_file_or_a_folder_is_still_a_file_list(
        tmp_path: Path, storage_dir: str, first: str) -> None:
    source = make_image_list(tmp_path / "src", 3)
    text = f"{first}\tcat\n" + source.read_text()
    with pytest.raises(MissingFilesError, match=r"train_data.list:1: .*" + first.split("/")[-1]):
        upload(str(write_list(source.parent, text)), "flowers", storage_dir, progress=False)
    assert list_datasets(open_storage(storage_dir)) == []


def test_a_byte_order_mark_does_not_make_a_text_dataset(tmp_path: Path,
                                                        storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 5)
    write_list(source.parent, b"\xef\xbb\xbf" + source.read_bytes())
    upload(str(source), "flowers", storage_dir, progress=False)
    manifest = read_manifest(open_storage(storage_dir), "flowers")
    assert manifest.kind == "file" and manifest.num_records == 5


def test_plain_sentences_are_still_detected_as_text(tmp_path: Path) -> None:
    parsed = parse_list(str(write_list(tmp_path, "hello world\tbonjour\nbye now\tsalut\n")))
    assert parsed.kind == "text"


# -- nothing from outside the list's folder ---------------------------------------------------
def test_paths_outside_the_lists_folder_are_refused(tmp_path: Path, storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 4)
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (source.parent / "link.jpg").symlink_to(secret)
    lines = source.read_text() + (f"../secret.txt\tcat\n{secret}\tdog\nlink.jpg\tcat\n")
    write_list(source.parent, lines)
    with pytest.raises(OutsidePathsError) as caught:
        upload(str(source), "flowers", storage_dir, progress=False)
    assert [line for line, _ in caught.value.outside] == [5, 6, 7]
    assert "--allow-outside" in str(caught.value)
    assert list_datasets(open_storage(storage_dir)) == []
    result = upload(str(source), "flowers", storage_dir, UploadOptions(allow_outside=True),
                    progress=False)
    assert result.num_records == 7


def test_symlinks_inside_the_folder_are_fine(tmp_path: Path, storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 2)
    (source.parent / "alias.jpg").symlink_to(source.parent / "images" / "00000.jpg")
    write_list(source.parent, source.read_text() + "alias.jpg\tcat\n")
    assert upload(str(source), "flowers", storage_dir, progress=False).num_records == 3


# -- names ------------------------------------------------------------------------------------
def test_a_dataset_cannot_nest_inside_another_or_hold_one(tmp_path: Path,
                                                          storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 3)
    upload(str(source), "dup", storage_dir, progress=False)
    with pytest.raises(InvalidNameError, match="inside dataset 'dup'"):
        upload(str(source), "dup/data", storage_dir, progress=False)
    upload(str(source), "ns/one", storage_dir, progress=False)
    with pytest.raises(InvalidNameError, match="namespace holding dataset"):
        upload(str(source), "ns", storage_dir, progress=False)
    # Re-uploading `dup` (changed) keeps working and nothing else was stored under it.
    upload(str(make_image_list(tmp_path / "src2", 4)), "dup", storage_dir,
           UploadOptions(overwrite=True), progress=False)
    assert list_datasets(open_storage(storage_dir)) == ["dup", "ns/one"]


# -- bounded records and memory ---------------------------------------------------------------
def test_records_above_the_limit_are_refused_by_name(tmp_path: Path, storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 3)
    (source.parent / "video.jpg").write_bytes(os.urandom(300_000))
    write_list(source.parent, source.read_text() + "video.jpg\tcat\n")
    with pytest.raises(OversizeRecordsError, match=r"train_data.list:4: .*video.jpg "
                                                   r"\(300,000 bytes\)"):
        upload(str(source), "flowers", storage_dir, UploadOptions(max_record_bytes=100_000),
               progress=False)
    assert list_datasets(open_storage(storage_dir)) == []


def test_read_ahead_is_bounded_in_bytes() -> None:
    entries = tuple(ListEntry(i, i + 1, (f"f{i}", "x")) for i in range(40))
    sizes = [READ_AHEAD_BYTES // 3] * 40
    windows = list(_read_ahead_windows(entries, sizes, threads=8))
    assert [len(w) for w in windows] == [3] * 13 + [1]
    assert [e for w in windows for e in w] == list(entries)
    huge = [READ_AHEAD_BYTES * 4] + [1] * 5
    assert [len(w) for w in _read_ahead_windows(entries[:6], huge, threads=8)] == [1, 5]
    assert [len(w) for w in _read_ahead_windows(entries, None, threads=2)] == [16, 16, 8]


def test_a_killed_uploads_temporary_files_are_removed(tmp_path: Path, storage_dir: str) -> None:
    source = make_image_list(tmp_path / "src", 3)
    folder = Path(storage_dir) / "flowers" / "data" / "0123456789abcdef"
    folder.mkdir(parents=True)
    stale = folder / "shard-00000.parquet.tmp-0a1b2c"
    stale.write_bytes(b"half a shard")
    upload(str(source), "flowers", storage_dir, progress=False)
    assert not stale.exists()
    assert not [p for p in Path(storage_dir).rglob("*") if ".tmp-" in p.name]


def test_every_dataset_writer_refuses_a_nested_name(tmp_path: Path, storage_dir: str) -> None:
    """SQL datasets and packed outputs are datasets too: the same rule, before any work."""
    import sqlite3

    import pyarrow as pa

    from trainfeed.preprocess import training_preprocessor
    from trainfeed.sql import register_sql_dataset, sql

    upload(str(make_image_list(tmp_path / "src", 3)), "dup", storage_dir, progress=False)
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, y TEXT)")
        conn.execute("INSERT INTO t VALUES (1, 'a')")
    with pytest.raises(InvalidNameError, match="inside dataset 'dup'"):
        register_sql_dataset("dup/sql", sql("SELECT * FROM t", f"sqlite:///{db}"), storage_dir)
    table = pa.table({"x": [[1.0, 2.0]] * 4, "y": ["a", "b", "a", "b"]})
    with pytest.raises(InvalidNameError, match="inside dataset 'dup'"):
        training_preprocessor(table, "dup/packed", "y", "x", storage=storage_dir)
    assert list_datasets(open_storage(storage_dir)) == ["dup"]
