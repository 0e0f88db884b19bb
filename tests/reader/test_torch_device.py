"""as_torch(device=, mean=, std=): uint8 batches leave the reader, normalization happens on the
device (here the CPU device: this machine has no GPU; pinning is for CUDA and is off here)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from optional import require
from sample_data import make_image_list

from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist
from trainfeed.reader.reader import Reader
from trainfeed.upload import UploadOptions, upload

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, torchvision's docs


@pytest.fixture
def storage(tmp_path: Path) -> str:
    listing = make_image_list(tmp_path / "source", 24, size=40)
    upload(str(listing), "pets", str(tmp_path / "storage"), UploadOptions(row_group_rows=8),
           progress=False)
    return str(tmp_path / "storage")


def reader(storage: str) -> Reader:
    return dist.reader("pets", source=LocalSource(storage=storage),
                       pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(32, 32),
                                                                     resize_shorter=36),
                                                batch=BatchOptions(size=8), mode="validation"))


def test_images_are_normalized_on_the_device_as_nchw_float(storage: str) -> None:
    torch = require("torch")
    raw = {int(i): image for b in reader(storage)() for i, image in zip(b["_id"], b["image"])}
    dataset = reader(storage).as_torch(device="cpu", mean=MEAN, std=STD)
    seen = 0
    for batch in dataset:
        images = batch["image"]
        assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (3, 32, 32)
        assert batch["label"].dtype == torch.int64
        for i, image in zip(batch["_id"].tolist(), images):
            want = (raw[i].astype(np.float32) / 255 - np.array(MEAN, np.float32)) / np.array(
                STD, np.float32)
            np.testing.assert_allclose(image.permute(1, 2, 0).numpy(), want, atol=1e-4)
            seen += 1
    assert seen == 24


def test_without_mean_and_std_batches_stay_uint8(storage: str) -> None:
    torch = require("torch")
    batch = next(iter(reader(storage).as_torch(device="cpu", pin_memory=False)))
    assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape[1:]) == (32, 32, 3)


def test_bad_normalization_arguments_are_refused(storage: str) -> None:
    require("torch")
    with pytest.raises(ValueError, match="together"):
        reader(storage).as_torch(mean=MEAN)
    with pytest.raises(ValueError, match="3 values"):
        reader(storage).as_torch(mean=(0.5,), std=(0.5,))
    floats = dist.reader("pets", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8),
                                                                       normalizing_const=255.0),
                                                  batch=BatchOptions(size=8)))
    with pytest.raises(ValueError, match="no normalizing_const"):
        floats.as_torch(mean=MEAN, std=STD)
