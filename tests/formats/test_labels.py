"""Integer labels sort by value (issue 26): label "2" of labels 0..11 is class 2, not class 4 as
it was sorted as text; the order is recorded in the manifest, and a manifest without it (every
dataset uploaded before) keeps the text order its models were trained with."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import BatchOptions, LabelOptions, LocalSource, PipelineOptions, dist
from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.labels import label_order, sorted_labels
from trainfeed.formats.manifest import MANIFEST_NAME, Manifest, dataset_storage, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

DIGITS = tuple(str(i) for i in range(12))  # "0".."11"
AS_TEXT = sorted(DIGITS)  # "0", "1", "10", "11", "2", …: what class ids followed before


@pytest.mark.parametrize("labels,order", [
    (DIGITS, "numeric"), (("-1", "0", "3"), "numeric"), (("0", "cat"), "string"),
    (("07", "7"), "string"), (("+1",), "string"), (("1.5",), "string"), ((), "string"),
    ((" 1",), "string"),
])
def test_a_dataset_is_numeric_when_every_label_is_an_integer_written_one_way(
        labels: tuple[str, ...], order: str) -> None:
    assert label_order(labels) == order


def test_numeric_order_sorts_by_value_and_string_order_as_text() -> None:
    assert sorted_labels(reversed(DIGITS), "numeric") == list(DIGITS)
    assert sorted_labels(["-3", "2", "-10"], "numeric") == ["-10", "-3", "2"]
    assert sorted_labels(DIGITS, "string") == AS_TEXT
    with pytest.raises(ValueError, match=r"label order 'numeric' needs integer labels, got "
                                         r"\['cat'\]"):
        sorted_labels(["1", "cat"], "numeric")
    with pytest.raises(ValueError, match=r"unknown label order 'natural'; expected one of "
                                         r"\['string', 'numeric'\]"):
        sorted_labels(["1"], "natural")


@pytest.fixture
def digits(tmp_path: Path) -> tuple[str, Path]:
    """Labels 0..11, record id i labelled i % 12, uploaded now."""
    source = make_image_list(tmp_path / "source", 36, labels=DIGITS, size=4)
    storage = str(tmp_path / "storage")
    upload(str(source), "digits", storage, UploadOptions(row_group_rows=8), progress=False)
    return storage, source


def class_ids(storage: str) -> tuple[tuple[str, ...], dict[int, int]]:
    """The reader's class values and record id -> class id."""
    reader = dist.reader("digits", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=8)))
    ids = {int(i): int(c) for b in reader() for i, c in zip(b["_id"], b["label"])}
    return reader.class_values, ids


def test_an_upload_of_integer_labels_records_the_numeric_order_and_label_2_is_class_2(
        digits: tuple[str, Path]) -> None:
    storage, _ = digits
    manifest = read_manifest(open_storage(storage), "digits")
    assert manifest.label_order == "numeric"
    values, ids = class_ids(storage)
    assert values == DIGITS
    assert ids[2] == 2 and ids[11] == 11 and ids[10] == 10  # as text, "2" was class 4
    assert all(c == i % 12 for i, c in ids.items()) and len(ids) == 36
    # A validation reader given the training class values maps labels to the same ids.
    validation = dist.reader("digits", source=LocalSource(storage=storage),
                             pipeline=PipelineOptions(batch=BatchOptions(size=36),
                                                      labels=LabelOptions(class_values=values,
                                                                          one_hot=True),
                                                      mode="validation"))
    batch = next(iter(validation()))
    assert (np.argmax(batch["label"], axis=1) == batch["_id"] % 12).all()


def test_an_old_manifest_without_the_order_keeps_the_text_order(
        digits: tuple[str, Path]) -> None:
    storage, _ = digits
    folder = dataset_storage(open_storage(storage), "digits")
    raw = json.loads(folder.read_bytes(MANIFEST_NAME))
    del raw["label_order"]  # as written before the field existed
    folder.write_atomic(MANIFEST_NAME, json.dumps(raw).encode())
    assert read_manifest(open_storage(storage), "digits").label_order == "string"
    values, ids = class_ids(storage)
    assert values == tuple(AS_TEXT)
    assert ids[2] == 4 and ids[10] == 2 and ids[1] == 1


def test_a_text_labelled_upload_records_the_string_order(image_list: Path,
                                                         storage_dir: str) -> None:
    upload(str(image_list), "flowers", storage_dir, progress=False)
    assert read_manifest(open_storage(storage_dir), "flowers").label_order == "string"


def test_a_manifest_with_an_unknown_or_unfitting_order_is_refused(
        digits: tuple[str, Path]) -> None:
    storage, _ = digits
    manifest = read_manifest(open_storage(storage), "digits")
    for order, match in (("natural", "unknown label order 'natural'"),
                         ("numeric", r"needs integer labels, got \['cat'\]")):
        bad = dataclasses.replace(manifest, label_order=order,
                                  label_histogram={**manifest.label_histogram, "cat": 1})
        with pytest.raises(CorruptDatasetError, match=f"manifest label_order: .*{match}"):
            Manifest.from_json(bad.to_json())


def test_packing_an_integer_labelled_dataset_sorts_its_classes_by_value(
        digits: tuple[str, Path]) -> None:
    from trainfeed.preprocess import training_preprocessor

    storage, _ = digits
    summary = training_preprocessor("digits", "digits_packed", "label", "image",
                                    normalizing_const=255.0, num_workers=1, storage=storage)
    assert summary["class_values"] == {"label": list(range(12))}
    buffers = list(dist.reader("digits_packed", source=LocalSource(storage=storage))())
    classes = np.concatenate([np.argmax(b["label"], axis=1) for b in buffers])
    assert sorted(np.bincount(classes).tolist()) == [3] * 12
