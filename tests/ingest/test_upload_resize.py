"""`upload --max-side N [--quality Q]` (issue 30 §5): images whose longer side exceeds N are
re-encoded at ingest to N (aspect kept), lossy and opt-in, recorded in the manifest; smaller
ones keep their bytes; it composes with --jpeg-restarts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import simplejpeg
from upload_samples import photo_list

from trainfeed.decode import roi
from trainfeed.errors import DatasetExistsError
from trainfeed.formats.manifest import ID_COLUMN, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload


def stored_images(storage: str, dataset: str) -> list[bytes]:
    """Every stored image, in record id order."""
    store = open_storage(storage)
    by_id: dict[int, bytes] = {}
    for shard in read_manifest(store, dataset).shards:
        table = pq.read_table(store.path(dataset, shard.path))
        by_id.update(zip(table[ID_COLUMN].to_pylist(), table["image"].to_pylist()))
    return [by_id[i] for i in sorted(by_id)]


@pytest.mark.parametrize("restarts", [False, True])
def test_larger_images_are_shrunk_to_the_max_side_and_the_manifest_says_so(
        tmp_path: Path, restarts: bool) -> None:
    listing = photo_list(tmp_path / "source", count=30)
    storage = str(tmp_path / "storage")
    upload(str(listing), "small", storage,
           UploadOptions(max_side=64, quality=85, jpeg_restarts=restarts), progress=False)
    manifest = read_manifest(open_storage(storage), "small")
    assert manifest.extra["resized"] == {"max_side": 64, "quality": 85, "format": "jpeg",
                                         "subsampling": "4:2:0"}
    originals = [(listing.parent / line.split("\t")[0]).read_bytes()
                 for line in listing.read_text().splitlines()]
    shrunk = 0
    for original, stored in zip(originals, stored_images(storage, "small")):
        height, width = simplejpeg.decode_jpeg_header(original)[:2]
        out_height, out_width = simplejpeg.decode_jpeg_header(stored)[:2]
        if max(height, width) <= 64:
            assert (out_height, out_width) == (height, width)
            if not restarts:
                assert stored == original  # kept as it was
        else:
            shrunk += 1
            assert max(out_height, out_width) == 64
            assert abs(out_width / out_height - width / height) < 0.05 * width / height
            # Lossy but close: the mean of a shrunk photo is the original's within a few levels.
            assert abs(float(simplejpeg.decode_jpeg(stored).mean())
                       - float(simplejpeg.decode_jpeg(original).mean())) < 4
        if restarts:
            assert roi._jpeg_region.restart_interval(stored) > 0
    assert 5 < shrunk < 30


def test_a_resized_upload_is_another_dataset(tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "source", count=10)
    storage = str(tmp_path / "storage")
    upload(str(listing), "photos", storage, progress=False)
    with pytest.raises(DatasetExistsError):
        upload(str(listing), "photos", storage, UploadOptions(max_side=64), progress=False)
    assert "resized" not in read_manifest(open_storage(storage), "photos").extra


def test_cli_refuses_a_max_side_or_quality_out_of_range(tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "source", count=2)
    for args, said in ((["--max-side", "4"], "expected a whole number ≥ 8, got '4'"),
                       (["--max-side", "64", "--quality", "101"],
                        "expected a JPEG quality in 1..100, got '101'")):
        run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                              "--dataset", "x", "--storage", str(tmp_path / "s"), *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and said in run.stderr, run.stderr


def test_options_refuse_a_tiny_max_side() -> None:
    with pytest.raises(ValueError, match="max_side must be ≥ 8 pixels"):
        UploadOptions(max_side=2)
    assert np.isfinite(UploadOptions(max_side=256).quality)
