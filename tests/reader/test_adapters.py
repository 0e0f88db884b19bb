"""Framework adapters (tf.data for Keras, torch IterableDataset) over a real uploaded dataset read
locally with the decode/batch pipeline."""
from __future__ import annotations

import gc
import logging
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optional import require

from trainfeed import BatchOptions, DecodeOptions, LabelOptions, LocalSource, PipelineOptions, dist
from trainfeed.reader.adapters import as_tf_dataset, as_torch, keras_structure
from trainfeed.reader.reader import Reader
from trainfeed.upload import UploadOptions, upload

N = 100  # records of the image_list fixture; record i has ("cat", "dog", "bird")[i % 3]
BATCH = 16
STEPS = math.ceil(N / BATCH)
MakeReader = Callable[..., Reader]
# Keras says so at the first epoch's end of any dataset of unknown length (see as_tf_dataset).
pytestmark = pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")


@pytest.fixture
def make_reader(image_list: Path, storage_dir: str) -> Iterator[MakeReader]:
    """Readers over the uploaded image_list: decoded 32x32 float images and one-hot labels, 16
    a batch (or `raw=True`: JPEG bytes and class ids). The same seed: the same order. Closed
    at teardown."""
    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=8),
           progress=False)
    made: list[Reader] = []

    def make(raw: bool = False) -> Reader:
        decoded = PipelineOptions(
            decode=DecodeOptions(True, image_size=(32, 32), normalizing_const=255.0),
            labels=LabelOptions(one_hot=True), batch=BatchOptions(size=BATCH))
        made.append(dist.reader("flowers", source=LocalSource(storage=storage_dir),
                                pipeline=PipelineOptions(batch=BatchOptions(size=BATCH))
                                if raw else decoded))
        return made[-1]

    yield make
    for reader in made:
        reader.close()


def described(spec: Any) -> tuple[tuple[int | None, ...], np.dtype]:
    """A tf.TensorSpec in output_spec() terms."""
    return tuple(spec.shape.as_list()), np.dtype(spec.dtype.as_numpy_dtype)


# --- which fields go where (no framework needed) ----------------------------------------------

FIELDS = {"image": None, "label": None, "_id": None}


def test_by_default_label_is_the_target_and_the_other_public_fields_the_inputs() -> None:
    assert keras_structure(FIELDS) == ("image", "label")
    assert keras_structure({**FIELDS, "mask": None}) == (("image", "mask"), "label")
    assert keras_structure({"image": None, "_id": None}) == ("image", None)
    assert keras_structure({**FIELDS, "mask": None}, targets="mask") == ("image", "mask")
    # Naming the label as an input leaves no default target; () asks for none explicitly.
    assert keras_structure(FIELDS, inputs=["image", "label"]) == (("image", "label"), None)
    assert keras_structure(FIELDS, targets=()) == ("image", None)
    assert keras_structure(FIELDS, inputs={"pixels": "image", "id": "_id"},
                           targets={"class": "label"}) == (
        {"pixels": "image", "id": "_id"}, {"class": "label"})


def test_a_selection_of_an_unknown_field_says_which_fields_there_are() -> None:
    with pytest.raises(ValueError, match=r"inputs names field 'pixels', but the reader's "
                                         r"fields are \['_id', 'image', 'label'\]"):
        keras_structure(FIELDS, inputs="pixels")
    with pytest.raises(ValueError, match="targets names field 'class'"):
        keras_structure(FIELDS, targets={"out": "class"})
    with pytest.raises(TypeError, match="inputs must be a field name"):
        keras_structure(FIELDS, inputs=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no fields left for the model's inputs"):
        keras_structure({"label": None, "_id": None})


# --- TensorFlow -------------------------------------------------------------------------------


def test_the_tf_element_spec_is_the_readers_output_spec(make_reader: MakeReader) -> None:
    require("tensorflow")
    reader = make_reader()
    spec = reader.output_spec()
    assert spec["image"] == ((None, 32, 32, 3), np.dtype(np.float32))
    image, label = as_tf_dataset(reader).element_spec
    assert (described(image), described(label)) == (spec["image"], spec["label"])
    (everything,) = as_tf_dataset(reader, inputs={f: f for f in spec}, targets=()).element_spec
    assert {f: described(s) for f, s in everything.items()} == spec


def test_a_tf_pass_delivers_exactly_what_a_reader_pass_does(make_reader: MakeReader) -> None:
    require("tensorflow")
    through_tf, direct = make_reader(), make_reader()
    dataset = as_tf_dataset(through_tf, inputs={"image": "image", "_id": "_id"})
    got = [(x["_id"].numpy(), x["image"].numpy(), y.numpy()) for x, y in dataset]
    want = [(b["_id"], b["image"], b["label"]) for b in direct()]
    assert len(got) == len(want) == STEPS
    for (ids, images, labels), (want_ids, want_images, want_labels) in zip(got, want):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)
    assert sorted(np.concatenate([ids for ids, _, _ in got]).tolist()) == list(range(N))
    # Iterating again is the reader's next pass (epoch), again every record once.
    again = np.concatenate([x["_id"].numpy() for x, _ in dataset])
    assert through_tf.epoch == 1 and sorted(again.tolist()) == list(range(N))


def test_raw_bytes_fields_become_tf_strings(make_reader: MakeReader) -> None:
    tf = require("tensorflow")
    reader = make_reader(raw=True)
    dataset = as_tf_dataset(reader, inputs="image", targets="label")
    assert dataset.element_spec == (tf.TensorSpec((None,), tf.string),
                                    tf.TensorSpec((None,), tf.int64))
    images = [blob for x, _ in dataset for blob in x.numpy().tolist()]
    assert len(images) == N and all(blob.startswith(b"\xff\xd8") for blob in images)  # JPEG


def test_each_keras_epoch_is_one_fresh_whole_pass(make_reader: MakeReader,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    require("tensorflow")
    keras = require("keras")
    reader = make_reader()
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "categorical_crossentropy")
    steps: list[int] = []
    count = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: steps.append(0),
        on_train_batch_end=lambda batch, logs: steps.__setitem__(-1, steps[-1] + 1))
    with caplog.at_level(logging.WARNING, logger="trainfeed.reader.adapters"):
        history = model.fit(as_tf_dataset(reader), epochs=3, verbose=0, shuffle=False,
                            callbacks=[count])
    assert steps == [STEPS] * 3 and reader.epoch == 2
    assert all(math.isfinite(loss) for loss in history.history["loss"])
    assert "abandoned" not in caplog.text


@pytest.mark.slow
def test_named_inputs_and_outputs_feed_a_multi_input_multi_output_model(
        make_reader: MakeReader) -> None:
    require("tensorflow")
    keras = require("keras")
    reader = make_reader()
    spec = reader.output_spec()
    dataset = as_tf_dataset(reader, inputs={"pixels": "image", "record": "_id"},
                            targets={"kind": "label", "kind_again": "label"})
    x, y = dataset.element_spec
    assert {k: described(s) for k, s in x.items()} == {"pixels": spec["image"],
                                                       "record": spec["_id"]}
    assert {k: described(s) for k, s in y.items()} == {"kind": spec["label"],
                                                       "kind_again": spec["label"]}
    pixels = keras.Input((32, 32, 3), name="pixels")
    record = keras.Input((), dtype="int64", name="record")
    features = keras.layers.Concatenate()([
        keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(pixels)),
        keras.layers.Embedding(N, 2)(record)])
    outputs = {name: keras.layers.Dense(3, activation="softmax", name=name)(features)
               for name in ("kind", "kind_again")}
    model = keras.Model({"pixels": pixels, "record": record}, outputs)
    model.compile("adam", loss={name: "categorical_crossentropy" for name in outputs})
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert math.isfinite(history.history["loss"][-1])
    # A tuple of fields is a tuple of tensors.
    (image, ids), label = as_tf_dataset(reader, inputs=("image", "_id")).element_spec
    assert [described(s) for s in (image, ids, label)] == [
        spec["image"], spec["_id"], spec["label"]]


@pytest.mark.slow
def test_a_pass_cut_short_is_logged_with_what_to_do(make_reader: MakeReader,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    require("tensorflow")
    reader = make_reader()
    with caplog.at_level(logging.WARNING, logger="trainfeed.reader.adapters"):
        assert len(list(as_tf_dataset(reader).take(2))) == 2
        gc.collect()
    assert re.search(r"a pass of reader 'flowers' was abandoned after \d+ batches.*"
                     r"once per epoch", caplog.text)


# --- PyTorch ----------------------------------------------------------------------------------


def test_torch_yields_batches_of_tensors_as_the_output_spec_says(make_reader: MakeReader) -> None:
    torch = require("torch")
    reader = make_reader()
    spec = reader.output_spec()
    dataset = as_torch(reader)
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=None))
    assert len(batches) == STEPS
    for batch in batches:
        assert set(batch) == set(spec)
        for field, (shape, dtype) in spec.items():
            tensor = batch[field]
            assert isinstance(tensor, torch.Tensor)
            assert tensor.dtype == torch.from_numpy(np.empty(0, dtype)).dtype
            assert tuple(tensor.shape[1:]) == shape[1:] and 0 < len(tensor) <= BATCH
    ids = torch.cat([b["_id"] for b in batches]).tolist()
    assert sorted(ids) == list(range(N))
    # Each iteration is a new pass.
    assert sum(len(b["_id"]) for b in dataset) == N and reader.epoch == 1


def test_torch_refuses_dataloader_worker_processes(make_reader: MakeReader,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    torch = require("torch")
    dataset = as_torch(make_reader())
    # Inside a worker process, get_worker_info() describes the worker. (A real worker is not
    # forked here: a fork after TensorFlow's threads started, in the same session, can stall.)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match=r"DataLoader worker process: use .*num_workers=0"):
        next(iter(dataset))


def test_torch_leaves_text_columns_as_arrays(make_reader: MakeReader) -> None:
    torch = require("torch")
    reader = make_reader(raw=True)
    batch = next(iter(as_torch(reader)))
    assert isinstance(batch["label"], torch.Tensor)
    assert isinstance(batch["image"], np.ndarray) and batch["image"].dtype == object


# --- without the frameworks -------------------------------------------------------------------


@pytest.mark.parametrize("module, extra, adapter", [("tensorflow", "tf", as_tf_dataset),
                                                    ("torch", "torch", as_torch)])
def test_a_missing_framework_says_which_extra_installs_it(
        make_reader: MakeReader, monkeypatch: pytest.MonkeyPatch, module: str, extra: str,
        adapter: Callable[[Reader], Any]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(ImportError, match=re.escape(
            f"{adapter.__name__}() needs {module}, which cannot be imported")) as raised:
        adapter(make_reader())
    assert f"pip install 'trainfeed[{extra}]'" in str(raised.value)


def test_importing_trainfeed_imports_no_require() -> None:
    probe = ("import sys, trainfeed, trainfeed.reader.adapters; "
             "print(sorted({'tensorflow', 'torch', 'keras'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_sample_weights_ride_along_for_keras(image_list: Path, storage_dir: str) -> None:
    tf = require("tensorflow")
    upload(str(image_list), "weighted", storage_dir, UploadOptions(row_group_rows=8),
           progress=False)
    weights = {"cat": 2.0, "dog": 1.0, "bird": 1.0}
    with dist.reader("weighted", source=LocalSource(storage=storage_dir),
                     pipeline=PipelineOptions(batch=BatchOptions(size=BATCH),
                                              decode=DecodeOptions(True, normalizing_const=255.0),
                                              labels=LabelOptions(True, class_weights=weights))
                     ) as reader:
        dataset = reader.as_tf_dataset(sample_weights="_weight")
        x_spec, y_spec, w_spec = dataset.element_spec
        assert described(w_spec) == ((None,), np.dtype(np.float32))
        x, y, w = next(iter(dataset))
        cats = y.numpy().argmax(axis=1) == 1  # class ids: bird 0, cat 1, dog 2
        assert np.allclose(w.numpy()[cats], w.numpy()[cats][0])
        assert w.numpy()[cats][0] > w.numpy()[~cats][0]
        model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Flatten(),
                                     tf.keras.layers.Dense(3, activation="softmax")])
        model.compile("sgd", "categorical_crossentropy")
        history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
        assert np.isfinite(history.history["loss"][0])
