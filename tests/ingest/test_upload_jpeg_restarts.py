"""`trainfeed upload --jpeg-restarts`: JPEGs are stored with restart markers (pixels unchanged),
other files byte for byte, and a training reader's crops are the same as from a plain upload."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from sample_data import make_image_list

from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist
from trainfeed.cli.main import main
from trainfeed.decode import roi
from trainfeed.errors import ConfigurationError
from trainfeed.upload import UploadOptions, upload

region = roi._jpeg_region
CROPS = PipelineOptions(decode=DecodeOptions(True, image_size=(32, 32), random_flip=True,
                                             random_resized_crop=((0.08, 1.0), (3 / 4, 4 / 3))),
                        batch=BatchOptions(size=8))


@pytest.fixture
def listing(tmp_path: Path) -> Path:
    """20 JPEGs of 96x96 and one PNG."""
    path = make_image_list(tmp_path / "source", 20, size=96)
    Image.fromarray(np.full((40, 30, 3), 200, np.uint8)).save(path.parent / "images/x.png")
    with path.open("a") as f:
        f.write("images/x.png\tcat\n")
    return path


def payloads(storage: str, dataset: str) -> list[bytes]:
    reader = dist.reader(dataset, source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(mode="validation"))
    return [image for image, _label in reader()]


def test_jpegs_get_restarts_other_files_keep_their_bytes(listing: Path, tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(listing), "plain", storage, progress=False)
    upload(str(listing), "indexed", storage, UploadOptions(jpeg_restarts=True), progress=False)
    plain, indexed = payloads(storage, "plain"), payloads(storage, "indexed")
    assert len(plain) == len(indexed) == 21
    for before, after in zip(plain[:20], indexed[:20]):
        assert region.restart_interval(before) == 0 and region.restart_interval(after) > 0
        np.testing.assert_array_equal(simplejpeg.decode_jpeg(after),
                                      simplejpeg.decode_jpeg(before))
    assert indexed[20] == plain[20] == (listing.parent / "images/x.png").read_bytes()
    with Image.open(io.BytesIO(indexed[20])) as png:
        assert png.format == "PNG"


def test_training_crops_are_those_of_a_plain_upload(listing: Path, tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(listing), "plain", storage, progress=False)
    upload(str(listing), "indexed", storage, UploadOptions(jpeg_restarts=True), progress=False)
    got = {}
    for dataset in ("plain", "indexed"):
        reader = dist.reader(dataset, source=LocalSource(storage=storage, seed=5),
                             pipeline=CROPS)
        batches = list(reader())
        got[dataset] = (np.concatenate([b["_id"] for b in batches]),
                        np.concatenate([b["image"] for b in batches]))
    np.testing.assert_array_equal(got["plain"][0], got["indexed"][0])
    np.testing.assert_array_equal(got["plain"][1], got["indexed"][1])


def test_the_option_changes_the_upload_s_identity(listing: Path, tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(listing), "flowers", storage, progress=False)
    again = upload(str(listing), "flowers", storage, UploadOptions(jpeg_restarts=True,
                                                                    overwrite=True),
                   progress=False)
    assert not again.already_published
    assert all(region.restart_interval(p) > 0 for p in payloads(storage, "flowers")[:20])


def test_without_the_region_decoder_the_upload_refuses_before_writing(
        listing: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension missing (an install without libjpeg-turbo's headers) is simulated by
    hiding the module: nothing else can make it absent here."""
    monkeypatch.setattr(roi, "_jpeg_region", None)
    storage = tmp_path / "storage"
    with pytest.raises(ConfigurationError, match="--jpeg-restarts needs"):
        upload(str(listing), "flowers", str(storage), UploadOptions(jpeg_restarts=True),
               progress=False)
    assert not (storage / "flowers" / "manifest.json").exists()


def test_the_cli_flag(listing: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = str(tmp_path / "storage")
    assert main(["upload", str(listing), "--dataset", "flowers", "--storage", storage,
                 "--jpeg-restarts", "--no-progress"]) == 0
    assert "published 'flowers': 21 records" in capsys.readouterr().out
    assert all(region.restart_interval(p) > 0 for p in payloads(storage, "flowers")[:20])
