"""Each record keeps its source file and list line; `--check-images` refuses corrupt images."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions
from trainfeed.errors import UndecodableImagesError
from trainfeed.formats.manifest import dataset_storage, list_datasets, read_manifest
from trainfeed.formats.sources import SourceIndex
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload


def corrupt(image_list: Path, numbers: tuple[int, ...]) -> list[str]:
    """Truncates the JPEGs of the given record numbers; returns their list-relative paths."""
    rels = [image_list.read_text().splitlines()[n].split("\t")[0] for n in numbers]
    for rel in rels:
        path = image_list.parent / rel
        path.write_bytes(path.read_bytes()[:40])  # a JPEG header and nothing else
    return rels


def test_sources_name_each_records_file_and_list_line(image_list: Path,
                                                      storage_dir: str) -> None:
    text = image_list.read_text()
    image_list.write_text("# a comment first\n" + text.replace("\n", "\n\n", 1))
    upload(str(image_list), "flowers", storage_dir, progress=False)
    storage = open_storage(storage_dir)
    manifest = read_manifest(storage, "flowers")
    assert manifest.num_records == 100 and manifest.sources is not None
    index = SourceIndex(dataset_storage(storage, "flowers"), manifest.sources, manifest.source)
    # Record 0 is on line 2 (after the comment), record 1 on line 4 (after a blank line).
    assert index.describe(0) == "images/00000.jpg, train_data.list line 2"
    assert index.describe(1) == "images/00001.jpg, train_data.list line 4"
    assert index.describe(99) == "images/00099.jpg, train_data.list line 102"
    assert index.describe(100) == ""


def test_text_lists_name_the_line(tmp_path: Path, storage_dir: str) -> None:
    path = tmp_path / "pairs.list"
    path.write_text("# src\ttgt\nhello\tbonjour\nbye\tsalut\n")
    upload(str(path), "pairs", storage_dir, UploadOptions(kind="text"), progress=False)
    storage = open_storage(storage_dir)
    manifest = read_manifest(storage, "pairs")
    index = SourceIndex(dataset_storage(storage, "pairs"), manifest.sources, manifest.source)
    assert index.describe(1) == "pairs.list line 3"


def test_check_images_lists_every_corrupt_file_and_publishes_nothing(
        image_list: Path, storage_dir: str) -> None:
    rels = corrupt(image_list, (13, 57))
    with pytest.raises(UndecodableImagesError) as caught:
        upload(str(image_list), "flowers", storage_dir, UploadOptions(check_images=True),
               progress=False)
    message = str(caught.value)
    assert f"train_data.list:14: {image_list.parent / rels[0]}" in message
    assert f"train_data.list:58: {image_list.parent / rels[1]}" in message
    assert [line for line, _, _ in caught.value.bad] == [14, 58]
    assert "flowers" not in list_datasets(open_storage(storage_dir))


def test_without_the_check_a_corrupt_image_is_stored_as_is(image_list: Path,
                                                          storage_dir: str) -> None:
    """The check is opt-in: raw bytes are the dataset (formats other than images exist)."""
    corrupt(image_list, (5,))
    result = upload(str(image_list), "flowers", storage_dir, progress=False)
    assert result.num_records == 100


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainfeed.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_check_images_and_single_messages(image_list: Path, storage_dir: str) -> None:
    corrupt(image_list, (3,))
    failed = run_cli("upload", str(image_list), "--dataset", "flowers", "--storage",
                     storage_dir, "--check-images", "--no-progress")
    assert failed.returncode == 2
    assert "train_data.list:4:" in failed.stderr and "not decodable" in failed.stderr
    # Without the check (and with a missing file skipped) each message is printed once.
    with image_list.open("a") as f:
        f.write("images/gone.jpg\tcat\n")
    args = ("upload", str(image_list), "--dataset", "flowers", "--storage", storage_dir,
            "--skip-missing", "--no-progress")
    first, again = run_cli(*args), run_cli(*args)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    output = first.stdout + first.stderr
    assert output.count("gone.jpg") == 1, output
    output = again.stdout + again.stderr
    assert output.count("already published") == 1, output


def test_a_decode_error_names_the_file_and_list_line(image_list: Path,
                                                     storage_dir: str) -> None:
    """Once `DecodeError: record 14 of shard data/…/shard-00000.parquet`: now the user learns
    which file to open and which line of their list to fix."""
    from trainfeed import dist
    from trainfeed.decode.pixels import DecodeError

    (rel,) = corrupt(image_list, (14,))
    upload(str(image_list), "flowers", storage_dir, progress=False)
    reader = dist.reader("flowers", source=LocalSource(storage=storage_dir),
                         pipeline=PipelineOptions(decode=DecodeOptions(True),
                                                  batch=BatchOptions(size=10)))
    with pytest.raises(DecodeError, match=rf"record 14 \({rel}, train_data.list line 15\) "
                                          r"of shard data/.*: cannot decode image"):
        for _ in reader():
            pass
    reader.close()
    skipping = dist.reader("flowers", source=LocalSource(storage=storage_dir),
                           pipeline=PipelineOptions(decode=DecodeOptions(True, errors="skip"),
                                                    batch=BatchOptions(size=10)))
    assert sum(len(b["_id"]) for b in skipping()) == 99 and skipping.decode_failures == 1
    skipping.close()
