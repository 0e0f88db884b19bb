"""Integer labels sort by value (issue 26): label "2" of labels 0..11 is class 2, not class 4 as
it was sorted as text; the order is recorded in the manifest, and a manifest without it (every
dataset uploaded before) keeps the text order its models were trained with. Class ids are stable
across versions (issue 38): an append keeps every label's id and gives a new one the next."""
from __future__ import annotations

import dataclasses
import json
import logging
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


# Class ids are stable across versions (issue 38): `upload --append` of a label that sorts first
# moved every existing id (`boat` 0 -> 1), and a model trained on version 1 read wrong labels.
SMALL = UploadOptions(row_group_rows=4, processes=1)
APPEND = UploadOptions(row_group_rows=4, processes=1, append=True)


def put(tmp_path: Path, part: str, labels: tuple[str, ...], name: str = "ds",
        options: UploadOptions = APPEND) -> None:
    """Uploads (or appends) a list of 4-pixel images, each label of `labels` twice."""
    source = make_image_list(tmp_path / part, 2 * len(labels), labels=labels, size=4,
                             name=f"{part}.list")
    upload(str(source), name, str(tmp_path / "storage"), options, progress=False)


def label_ids(storage: str, name: str) -> tuple[tuple[str, ...], dict[str, set[int]]]:
    """A real reader's class values and, per label, the ids it delivered for it."""
    reader = dist.reader(name, source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=4)))
    words_of = {}
    for batch in dist.reader(name, source=LocalSource(storage=storage)).column_batches(64):
        words_of.update(zip(batch["_id"].tolist(), batch["label"]))
    seen: dict[str, set[int]] = {}
    for batch in reader():
        for i, c in zip(batch["_id"].tolist(), batch["label"].tolist()):
            seen.setdefault(words_of[i], set()).add(int(c))
    return reader.class_values, seen


def test_an_append_keeps_every_label_id_and_a_new_label_that_sorts_first_gets_the_next(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    put(tmp_path, "one", ("boat", "cat", "dog"), options=SMALL)
    assert label_ids(storage, "ds") == (("boat", "cat", "dog"),
                                        {"boat": {0}, "cat": {1}, "dog": {2}})
    with caplog.at_level(logging.WARNING, logger="trainfeed.ingest.publish"):
        put(tmp_path, "two", ("auk", "cat"))
    assert ("adds 1 new label(s) (auk) as class ids 3..3, after the existing ones, whose ids "
            "do not change: a model trained on version 1 has 3 classes") in caplog.text
    manifest = read_manifest(open_storage(storage), "ds")
    assert manifest.classes == ("boat", "cat", "dog", "auk")
    assert label_ids(storage, "ds") == (("boat", "cat", "dog", "auk"),
                                        {"boat": {0}, "cat": {1}, "dog": {2}, "auk": {3}})
    # Version 1 keeps its own ids, and a third version keeps version 2's.
    assert label_ids(storage, "ds@1")[0] == ("boat", "cat", "dog")
    put(tmp_path, "three", ("ant", "zebu"))
    assert label_ids(storage, "ds")[0] == ("boat", "cat", "dog", "auk", "ant", "zebu")
    # The manifest records the ids and reads them back.
    again = Manifest.from_json(read_manifest(open_storage(storage), "ds").to_json())
    assert again.class_values == ("boat", "cat", "dog", "auk", "ant", "zebu")


def test_an_append_whose_new_labels_sort_last_writes_the_manifest_as_before(
        tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    put(tmp_path, "one", ("boat", "cat"), options=SMALL)
    put(tmp_path, "two", ("dog",))
    folder = dataset_storage(open_storage(storage), "ds")
    raw = json.loads(folder.read_bytes(MANIFEST_NAME))
    assert "class_values" not in raw  # the label order's own: no new key for older releases
    assert read_manifest(open_storage(storage), "ds").classes == ("boat", "cat", "dog")
    # A fresh upload (no append) sorts its labels, as before.
    put(tmp_path, "new", ("zebu", "auk"), name="fresh", options=SMALL)
    assert read_manifest(open_storage(storage), "fresh").classes == ("auk", "zebu")


def test_a_numeric_dataset_appended_to_keeps_its_ids_too(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    put(tmp_path, "one", ("0", "5"), options=SMALL)
    put(tmp_path, "two", ("3",))
    assert label_ids(storage, "ds") == (("0", "5", "3"), {"0": {0}, "5": {1}, "3": {2}})


@pytest.mark.parametrize("values,match", [
    (["boat", "cat"], "are not the labels of its histogram"),
    (["boat", "cat", "dog", "cat"], "are not the labels of its histogram"),
    ("boat", "class_values must be a list of labels"),
    ([1, 2, 3], "class_values must be a list of labels"),
])
def test_a_manifest_whose_class_values_are_not_its_labels_is_refused(
        tmp_path: Path, values: object, match: str) -> None:
    put(tmp_path, "one", ("boat", "cat", "dog"), options=SMALL)
    raw = json.loads(read_manifest(open_storage(str(tmp_path / "storage")), "ds").to_json())
    raw["class_values"] = values
    with pytest.raises(CorruptDatasetError, match=match):
        Manifest.from_json(json.dumps(raw).encode())
