"""Transformers fitted on training records and saved with the dataset; augmentations in
training mode only."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LocalSource,
    PipelineOptions,
    TransformOptions,
    dist,
)
from trainfeed.reader.transforms import (
    Standardize,
    fit_transformer,
    load_transformer,
    save_transformer,
)
from trainfeed.upload import UploadOptions, upload

N = 64


@pytest.fixture
def storage(tmp_path: Path) -> str:
    source = make_image_list(tmp_path / "source", N)
    out = str(tmp_path / "storage")
    upload(str(source), "flowers", out, UploadOptions(row_group_rows=8), progress=False)
    return out


def images(storage: str, **options: object) -> np.ndarray:
    with dist.reader("flowers", source=LocalSource(storage=storage),
                     pipeline=PipelineOptions.from_keywords(
                         decode=True, normalizing_const=255.0, batch_size=16,
                         mode="validation", **options)) as reader:
        batches = list(reader())
    order = np.argsort(np.concatenate([b["_id"] for b in batches]))
    return np.concatenate([b["image"] for b in batches])[order]


def test_standardize_is_fitted_saved_with_the_dataset_applied_and_undone(storage: str) -> None:
    with dist.reader("flowers", source=LocalSource(storage=storage),
                     pipeline=PipelineOptions(decode=DecodeOptions(True,
                                                                   normalizing_const=255.0),
                                              batch=BatchOptions(size=16))) as train:
        fitted = fit_transformer(train, Standardize(("image",)))
        folder = train.dataset_folder
    raw = images(storage)
    assert np.allclose(fitted.mean["image"], raw.reshape(-1, 3).mean(axis=0), atol=1e-5)
    assert np.allclose(fitted.std["image"], raw.reshape(-1, 3).std(axis=0), atol=1e-5)

    save_transformer(folder, "std", fitted)
    assert load_transformer(folder, "std") == fitted
    standardized = images(storage, transform="std")  # loaded by name, as any worker would
    per_channel = standardized.reshape(-1, 3)
    assert np.allclose(per_channel.mean(axis=0), 0, atol=1e-4)
    assert np.allclose(per_channel.std(axis=0), 1, atol=1e-3)
    assert np.allclose(fitted.inverse("image", standardized), raw, atol=1e-5)


def test_an_unfitted_or_missing_transformer_is_refused(storage: str) -> None:
    with pytest.raises(ValueError, match="not fitted"):
        images(storage, transform=Standardize(("image",)))
    with pytest.raises(FileNotFoundError, match="no transformer 'nope'"):
        images(storage, transform="nope")


def test_augmentations_apply_in_training_only_and_are_seeded(storage: str) -> None:
    flip = [("trainfeed.augment:random_flip", {"probability": 1.0})]

    def epoch(mode: str, augment: list, seed: int = 0) -> dict[int, np.ndarray]:
        with dist.reader("flowers", source=LocalSource(storage=storage, seed=seed),
                         pipeline=PipelineOptions(decode=DecodeOptions(True,
                                                                       normalizing_const=255.0),
                                                  batch=BatchOptions(size=16),
                                                  transform=TransformOptions(augment=augment),
                                                  mode=mode)) as reader:
            return {int(i): x for b in reader() for i, x in zip(b["_id"], b["image"])}

    plain = epoch("train", [])
    flipped = epoch("train", flip)
    assert all(np.array_equal(flipped[i], plain[i][:, ::-1]) for i in plain)
    validation = epoch("validation", flip)
    assert all(np.array_equal(validation[i], plain[i]) for i in plain)
    jitter = [("trainfeed.augment:random_brightness", {"max_delta": 0.2})]
    first, again, other = epoch("train", jitter), epoch("train", jitter), epoch("train", jitter, 1)
    assert all(np.array_equal(first[i], again[i]) for i in first)
    assert not all(np.array_equal(first[i], other[i]) for i in first)
    with pytest.raises(ValueError, match="not an importable function"):
        epoch("train", ["trainfeed.augment:no_such_thing"])
