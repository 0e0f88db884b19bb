"""`upload --raw-below PIXELS` (issue 39, item 3): images of at most PIXELS pixels after
--max-side are stored as raw uint8 RGB pixels (trainfeed.decode.raw), the pixels the resize made;
larger ones as before. The manifest records it and carries format version 2, which a reader of
version 1 refuses by name; version-1 datasets stay readable; upload reports the size on disk;
--check-images checks raw records (their header against their length)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import simplejpeg
from upload_samples import photo_list

from trainfeed import LocalSource, PipelineOptions, dist
from trainfeed.decode import raw
from trainfeed.decode.pixels import ImageDecoder
from trainfeed.errors import CorruptDatasetError
from trainfeed.formats import manifest as manifest_format
from trainfeed.formats.manifest import ID_COLUMN, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

MAX_SIDE = 64
RAW_BELOW = 64 * 48


def stored_images(storage: str, dataset: str) -> list[bytes]:
    """Every stored image, in record id order."""
    store = open_storage(storage)
    by_id: dict[int, bytes] = {}
    for shard in read_manifest(store, dataset).shards:
        table = pq.read_table(store.path(dataset, shard.path))
        by_id.update(zip(table[ID_COLUMN].to_pylist(), table["image"].to_pylist()))
    return [by_id[i] for i in sorted(by_id)]


def target(height: int, width: int) -> tuple[int, int]:
    if max(height, width) <= MAX_SIDE:
        return height, width
    scale = MAX_SIDE / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("raw")
    listing = photo_list(root / "source", count=30)
    storage = str(root / "storage")
    upload(str(listing), "raw", storage, UploadOptions(max_side=MAX_SIDE, raw_below=RAW_BELOW,
                                                       row_group_rows=8), progress=False)
    return listing, storage


def test_small_images_are_stored_as_their_resized_pixels_and_large_ones_as_jpegs(
        uploaded: tuple[Path, str]) -> None:
    """Round trip: a raw record holds exactly the source's pixels resized to its stored size as
    the reader resizes a whole image (`image_size=`), with no JPEG loss; an image larger than
    the threshold after the resize stays a JPEG of at most MAX_SIDE."""
    listing, storage = uploaded
    originals = [(listing.parent / line.split("\t")[0]).read_bytes()
                 for line in listing.read_text().splitlines()]
    kinds = {"raw": 0, "jpeg": 0, "raw resized": 0}
    for original, stored in zip(originals, stored_images(storage, "raw")):
        height, width = simplejpeg.decode_jpeg_header(original)[:2]
        size = target(height, width)
        if size[0] * size[1] <= RAW_BELOW:
            pixels = raw.pixels(stored, 1 << 20)
            expected = ImageDecoder(image_size=size, threads=1).decode_one(original)
            assert np.array_equal(pixels, expected)
            kinds["raw"] += 1
            kinds["raw resized"] += size != (height, width)
        else:
            assert not raw.is_raw(stored)
            assert max(simplejpeg.decode_jpeg_header(stored)[:2]) <= MAX_SIDE
            kinds["jpeg"] += 1
    assert kinds["raw"] >= 5 and kinds["jpeg"] >= 5 and kinds["raw resized"] >= 1, kinds


def test_the_manifest_records_raw_pixels_and_an_older_reader_refuses_it(
        uploaded: tuple[Path, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    listing, storage = uploaded
    store = open_storage(storage)
    manifest = read_manifest(store, "raw")
    assert manifest.extra["raw_pixels"]["max_pixels"] == RAW_BELOW
    body = json.loads(Path(store.path("raw", "manifest.json")).read_bytes())
    assert body["version"] == 2
    # A plain upload stays version 1: readers before raw pixels read it.
    upload(str(listing), "plain", storage, UploadOptions(max_side=MAX_SIDE), progress=False)
    plain = json.loads(Path(store.path("plain", "manifest.json")).read_bytes())
    assert plain["version"] == 1 and "raw_pixels" not in plain["extra"]
    # A reader that reads version 1 only (the releases before this one) refuses, naming it.
    monkeypatch.setattr(manifest_format, "READABLE_VERSIONS", (1,))
    with pytest.raises(CorruptDatasetError, match="manifest version 2, this trainfeed reads 1: "
                                                  "upgrade trainfeed"):
        read_manifest(store, "raw")
    assert read_manifest(store, "plain").num_records == 30


def test_a_raw_dataset_is_read_with_crops(uploaded: tuple[Path, str]) -> None:
    _, storage = uploaded
    reader = dist.reader("raw", source=LocalSource(storage, seed=1),
                         pipeline=PipelineOptions.from_keywords(
                             decode=True, image_size=(32, 32), batch_size=8,
                             random_resized_crop=((0.08, 1.0), (3 / 4, 4 / 3)),
                             random_flip=True))
    ids = [i for b in reader() for i in b["_id"].tolist()]
    reader.close()
    assert sorted(ids) == list(range(30))


def test_cli_reports_the_size_on_disk_and_refuses_a_zero_threshold(tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "source", count=6)
    run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                          "--dataset", "x", "--storage", str(tmp_path / "s"), "--no-progress",
                          "--max-side", "32", "--raw-below", "1024"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "published 'x': 6 records, " in run.stdout and " MB on disk" in run.stdout
    run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                          "--dataset", "x", "--storage", str(tmp_path / "s"), "--raw-below", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "expected a whole number ≥ 1, got '0'" in run.stderr
    with pytest.raises(ValueError, match="raw_below must be ≥ 1"):
        UploadOptions(raw_below=0)


def test_check_images_names_a_raw_record_whose_length_disagrees(tmp_path: Path) -> None:
    """A list naming raw pixel records: a truncated one fails --check-images, named by its list
    line and file, with what its header declared against what it holds."""
    folder = tmp_path / "source"
    folder.mkdir()
    good = raw.encode(np.full((12, 10, 3), 99, np.uint8))
    (folder / "good.raw").write_bytes(good)
    (folder / "cut.raw").write_bytes(good[:-7])
    listing = folder / "records.list"
    listing.write_text("good.raw\ta\ncut.raw\tb\ngood.raw\tc\n")
    run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                          "--dataset", "r", "--storage", str(tmp_path / "s"), "--no-progress",
                          "--check-images"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"{listing}:2: {folder / 'cut.raw'}: raw pixel record declares 10x12x3 (376 bytes "
            f"with its header) but holds 369 bytes: truncated") in run.stderr, run.stderr
    assert "1 file(s) named in" in run.stderr and "Traceback" not in run.stderr


def test_a_manifest_whose_version_and_raw_pixels_disagree_is_refused(
        uploaded: tuple[Path, str], tmp_path: Path) -> None:
    """Version 2 is exactly a dataset with raw records: a version-1 manifest naming raw pixels
    (which readers before version 2 would open and feed to a JPEG decoder), or a version 2
    without them, is a damaged manifest, named."""
    _, storage = uploaded
    body = json.loads(Path(open_storage(storage).path("raw", "manifest.json")).read_bytes())
    for version, extra in ((1, body["extra"]), (2, {})):
        damaged = json.dumps({**body, "version": version, "extra": extra}).encode()
        with pytest.raises(CorruptDatasetError, match=f"here: unreadable manifest: manifest "
                                                      f"version {version} "):
            manifest_format.Manifest.from_json(damaged, where="here")


def cli_upload(listing: Path, storage: Path, name: str, *args: str
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                           "--dataset", name, "--storage", str(storage), "--no-progress", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_stores_raw_pixels_by_default_at_a_max_side_of_at_most_320(tmp_path: Path) -> None:
    """The measured default (docs/imagenet.md): `--max-side N` with N ≤ 320 stores every image
    as raw pixels; --no-raw keeps JPEGs, as do a larger N and --jpeg-restarts; --raw-below and
    --no-raw exclude each other."""
    listing = photo_list(tmp_path / "source", count=6)
    storage = tmp_path / "s"
    cases = {"small": (["--max-side", "32"], 32 * 32),
             "small-jpeg": (["--max-side", "32", "--no-raw"], None),
             "large": (["--max-side", "321"], None),
             "restarts": (["--max-side", "32", "--jpeg-restarts"], None),
             "chosen": (["--max-side", "32", "--raw-below", "100"], 100)}
    for name, (args, raw_pixels) in cases.items():
        run = cli_upload(listing, storage, name, *args)
        assert run.returncode == 0, (name, run.stderr)
        extra = read_manifest(open_storage(str(storage)), name).extra
        assert extra.get("raw_pixels", {}).get("max_pixels") == raw_pixels, (name, extra)
    assert all(raw.is_raw(image) for image in stored_images(str(storage), "small"))
    assert not any(raw.is_raw(image) for image in stored_images(str(storage), "small-jpeg"))
    run = cli_upload(listing, storage, "both", "--max-side", "32", "--raw-below", "9",
                     "--no-raw")
    assert run.returncode == 2 and "not allowed with argument" in run.stderr


def test_submit_upload_hands_no_raw_to_its_packers() -> None:
    import argparse

    from trainfeed.cli.upload_cmd import add_upload_options, upload_arguments
    parser = argparse.ArgumentParser()
    add_upload_options(parser)
    args = parser.parse_args(["--max-side", "256", "--no-raw"])
    assert "--no-raw" in upload_arguments(args)
    assert "--no-raw" not in upload_arguments(parser.parse_args(["--max-side", "256"]))
