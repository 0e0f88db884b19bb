"""training_preprocessor / validation_preprocessor on the MADlib documentation's example
(52 rows of 2x2 RGB images, species {bird, cat, dog}), read back buffer by buffer."""
from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.errors import DatasetNotFoundError
from trainfeed.formats.manifest import read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.preprocess import PreprocessError, training_preprocessor, validation_preprocessor
from trainfeed.storage import open_storage

SPECIES = ("bird", "cat", "dog")


def madlib_table(rows: int = 52, flat: bool = False, species: tuple[str, ...] = SPECIES,
                 seed: int = 0) -> pa.Table:
    images = np.random.default_rng(seed).integers(0, 256, (rows, 2, 2, 3))
    rgb = [img.reshape(-1).tolist() if flat else img.tolist() for img in images]
    return pa.table({"rgb": rgb, "species": [species[i % len(species)] for i in range(rows)]})


def instances(buffers: list[dict]) -> Counter:
    """Every instance of every buffer: (pixel values x 255, class index)."""
    out: Counter = Counter()
    for b in buffers:
        for x, y in zip(b["rgb"], b["species"]):
            out[(tuple(np.rint(x * 255).astype(int).reshape(-1)), int(y.argmax()))] += 1
    return out


def source_instances(table: pa.Table, classes: list) -> Counter:
    return Counter((tuple(np.asarray(x).reshape(-1)), classes.index(y))
                   for x, y in zip(table.column("rgb").to_pylist(),
                                   table.column("species").to_pylist()))


@pytest.mark.parametrize("flat", [False, True])
def test_training_preprocessor_reproduces_the_madlib_example(tmp_path: Path, flat: bool) -> None:
    table = madlib_table(flat=flat)
    summary = training_preprocessor(table, "image_data_packed", "species", "rgb",
                                    normalizing_const=255.0, num_workers=3,
                                    storage=str(tmp_path))
    assert summary["class_values"] == {"species": ["bird", "cat", "dog"]}
    assert summary["dependent_vartype"] == ["text"] and summary["num_classes"] == [3]
    assert summary["buffer_size"] == 18 and summary["num_buffers"] == 3
    assert {"source_table", "output_table", "dependent_varname", "independent_varname",
            "normalizing_const", "distribution_rules"} <= set(summary)
    manifest = read_manifest(open_storage(str(tmp_path)), "image_data_packed")
    assert manifest.kind == "packed" and manifest.extra["summary"] == summary

    buffers = list(dist.reader("image_data_packed", source=LocalSource(storage=str(tmp_path)))())
    assert sorted(b["buffer_id"] for b in buffers) == [0, 1, 2]
    by_id = {b["buffer_id"]: b for b in buffers}
    for buffer_id, size in enumerate([18, 18, 16]):
        b = by_id[buffer_id]
        want = [size, 12] if flat else [size, 2, 2, 3]
        assert b["rgb"].dtype == np.float32 and list(b["rgb"].shape) == want
        assert b["rgb_shape"].tolist() == want and b["species_shape"].tolist() == [size, 3]
        assert b["species"].shape == (size, 3) and (b["species"].sum(axis=1) == 1).all()
    assert instances(buffers) == source_instances(table, ["bird", "cat", "dog"])


def test_buffer_size_and_num_classes_padding(tmp_path: Path) -> None:
    summary = training_preprocessor(madlib_table(), "padded", "species", "rgb",
                                    buffer_size=10, num_classes=5, num_workers=3,
                                    storage=str(tmp_path))
    assert summary["class_values"] == {"species": ["bird", "cat", "dog", None, None]}
    buffers = list(dist.reader("padded", source=LocalSource(storage=str(tmp_path)))())
    assert sorted(len(b["species"]) for b in buffers) == [7, 9, 9, 9, 9, 9]
    assert all(b["species"].shape[1] == 5 and not b["species"][:, 3:].any() for b in buffers)


def test_validation_reuses_the_training_classes_and_is_not_shuffled(tmp_path: Path) -> None:
    training_preprocessor(madlib_table(), "train_packed", "species", "rgb",
                          normalizing_const=255.0, num_workers=2, storage=str(tmp_path))
    val = madlib_table(rows=8, species=("dog",), seed=1)
    summary = validation_preprocessor(val, "val_packed", "species", "rgb",
                                      training_preprocessor_table="train_packed",
                                      storage=str(tmp_path))
    assert summary["class_values"] == {"species": ["bird", "cat", "dog"]}
    assert summary["normalizing_const"] == 255.0
    buffers = sorted(dist.reader("val_packed", source=LocalSource(storage=str(tmp_path)))(),
                     key=lambda b: b["buffer_id"])
    assert all(b["species"].argmax(axis=1).tolist() == [2] * len(b["species"])
               for b in buffers)
    got = np.concatenate([b["rgb"] for b in buffers]) * 255.0
    assert np.allclose(got, np.asarray(val.column("rgb").to_pylist()))  # source order kept


def test_a_parquet_source_multiple_variables_and_two_readers_through_a_master(
        tmp_path: Path) -> None:
    table = madlib_table(rows=60).append_column(
        "size", pa.array([float(i % 5) for i in range(60)]))
    table = table.append_column("small", pa.array([i % 2 for i in range(60)], pa.int16()))
    pq.write_table(table, tmp_path / "source.parquet")
    storage = str(tmp_path / "storage")
    summary = training_preprocessor(str(tmp_path / "source.parquet"), "multi",
                                    ["species", "small"], ["rgb", "size"], buffer_size=5,
                                    num_workers=2, storage=storage)
    assert summary["dependent_vartype"] == ["text", "smallint"]
    assert summary["num_buffers"] == 12
    with MasterProcess(storage) as master:
        seen: list[int] = []
        lock = threading.Lock()

        def read() -> None:
            with dist.reader("multi", source=MasterSource(master.address, job="packed")) as r:
                for b in r():
                    assert b["rgb"].shape[1:] == (2, 2, 3) and b["size"].shape[1:] == (1,)
                    assert b["small"].shape[1] == 2
                    with lock:
                        seen.append(b["buffer_id"])
        threads = [threading.Thread(target=read) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(seen) == list(range(12))


def test_bad_input_names_the_column_or_row_and_publishes_nothing(tmp_path: Path) -> None:
    storage = str(tmp_path)
    with pytest.raises(PreprocessError, match=r"no column 'colour' \(columns: \['rgb'"):
        training_preprocessor(madlib_table(), "bad", "species", "colour", storage=storage)
    ragged = pa.table({"rgb": [[1, 2, 3]] * 3 + [[1, 2]] + [[1, 2, 3]] * 4,
                       "species": ["a"] * 8})  # row 3 is short, wherever the shuffle puts it
    with pytest.raises(PreprocessError, match=r"'rgb', row 3: shape \(2,\)|'rgb', row \d+: "
                                              r"shape \(3,\), but earlier rows have \(2,\)"):
        training_preprocessor(ragged, "bad", "species", "rgb", storage=storage)
    text = pa.table({"rgb": [["x", "y"]], "species": ["a"]})
    with pytest.raises(PreprocessError, match=r"'rgb', row 0: not a numeric array"):
        training_preprocessor(text, "bad", "species", "rgb", storage=storage)
    with pytest.raises(DatasetNotFoundError):
        read_manifest(open_storage(storage), "bad")


def test_the_cli_packs_a_csv_with_json_array_cells(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.cli.main import main

    rows = ["rgb,species"] + [f'"[{i}, {i + 1}, {i + 2}]",{SPECIES[i % 3]}' for i in range(9)]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "val.csv").write_text('rgb,species\n"[1, 2, 3]",cat\n')
    storage = str(tmp_path / "storage")
    assert main(["preprocess", "train", str(tmp_path / "train.csv"), "packed", "--dependent",
                 "species", "--independent", "rgb", "--num-workers", "3", "--storage",
                 storage]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_buffers"] == 3 and summary["class_values"]["species"] == list(SPECIES)
    assert main(["preprocess", "validate", str(tmp_path / "val.csv"), "val", "--dependent",
                 "species", "--independent", "rgb", "--training", "packed", "--storage",
                 storage]) == 0
    [buffer] = list(dist.reader("val", source=LocalSource(storage=storage))())
    assert buffer["species"].tolist() == [[0, 1, 0]] and buffer["rgb"].tolist() == [[1, 2, 3]]
    assert main(["preprocess", "train", str(tmp_path / "train.csv"), "bad", "--dependent",
                 "nope", "--independent", "rgb", "--storage", storage]) == 2
    assert "no column 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_packed_distribution_rules_apply_to_readers_that_name_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainfeed.errors import JobError

    storage = str(tmp_path / "storage")
    training_preprocessor(madlib_table(), "ruled", "species", "rgb", num_workers=2,
                          distribution_rules="node-a", storage=storage)
    with MasterProcess(storage) as master:
        monkeypatch.setenv("TRAINFEED_WORKER_NAME", "node-b")
        with pytest.raises(JobError, match="node-a"):
            list(dist.reader("ruled", source=MasterSource(master.address, job="j"))())
        monkeypatch.setenv("TRAINFEED_WORKER_NAME", "node-a")
        with dist.reader("ruled", source=MasterSource(master.address, job="j")) as reader:
            assert sorted(b["buffer_id"] for b in reader()) == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("rules", ["all_segments", "ALL_SEGMENTS", "all", None])
def test_madlibs_all_segments_admits_every_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules: str | None) -> None:
    storage = str(tmp_path / "storage")
    summary = training_preprocessor(madlib_table(), "everyone", "species", "rgb",
                                    num_workers=2, distribution_rules=rules, storage=storage)
    assert summary["distribution_rules"] == summary["__internal_gpu_config__"] == "all_segments"
    monkeypatch.setenv("TRAINFEED_WORKER_NAME", "any-worker")
    with MasterProcess(storage) as master:
        with dist.reader("everyone", source=MasterSource(master.address, job="j")) as reader:
            assert sorted(b["buffer_id"] for b in reader()) == [0, 1]


def test_packing_a_name_again_replaces_it_and_leaves_no_old_data(tmp_path: Path) -> None:
    storage = str(tmp_path)
    first = training_preprocessor(madlib_table(), "again", "species", "rgb", storage=storage)
    second = training_preprocessor(madlib_table(rows=30), "again", "species", "rgb",
                                   num_workers=2, storage=storage)
    assert (first["num_rows"], second["num_rows"]) == (52, 30)
    assert len(list((tmp_path / "again" / "data").iterdir())) == 1
    buffers = list(dist.reader("again", source=LocalSource(storage=storage))())
    assert sum(len(b["species"]) for b in buffers) == 30


def test_an_uploaded_image_dataset_is_a_source(tmp_path: Path) -> None:
    from PIL import Image
    from sample_data import make_image_list

    from trainfeed.upload import UploadOptions, upload

    storage = str(tmp_path / "storage")
    source = make_image_list(tmp_path / "images", 20, labels=("cat", "dog"), size=4)
    upload(str(source), "pets", storage, UploadOptions(row_group_rows=8), progress=False)
    summary = training_preprocessor("pets", "pets_packed", "label", "image",
                                    normalizing_const=255.0, num_workers=2, storage=storage)
    assert summary["class_values"] == {"label": ["cat", "dog"]}
    assert summary["source_table"] == "dataset pets"
    buffers = list(dist.reader("pets_packed", source=LocalSource(storage=storage))())
    assert sorted(len(b["label"]) for b in buffers) == [10, 10]
    assert all(b["image"].shape[1:] == (4, 4, 3) and b["image"].dtype == np.float32
               for b in buffers)
    # every image arrives once: compare with the decoded source images
    want = sorted(tuple(np.asarray(Image.open(p)).reshape(-1))
                  for p in sorted((tmp_path / "images" / "images").iterdir()))
    got = sorted(tuple(np.rint(x * 255).astype(np.uint8).reshape(-1))
                 for b in buffers for x in b["image"])
    assert len(got) == 20 and all(np.abs(np.subtract(g, w, dtype=int)).max() <= 2
                                  for g, w in zip(got, want))


def test_large_outputs_stream_shard_by_shard_and_a_late_bad_row_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainfeed.preprocess import packed

    # One buffer per shard: the output is written while later buffers are still being encoded.
    monkeypatch.setattr(packed, "SHARD_TARGET_BYTES", 1)
    storage = str(tmp_path)
    summary = training_preprocessor(madlib_table(), "streamed", "species", "rgb",
                                    buffer_size=10, num_workers=3, normalizing_const=255,
                                    storage=storage)
    manifest = read_manifest(open_storage(storage), "streamed")
    assert len(manifest.shards) == summary["num_buffers"] == 6
    buffers = list(dist.reader("streamed", source=LocalSource(storage=storage))())
    assert instances(buffers) == source_instances(madlib_table(), list(SPECIES))

    # Validation keeps the source order, so the bad last row is met after 5 shards are written.
    rows = [[1, 2, 3]] * 51 + [[1, float("nan"), 3]]
    bad = pa.table({"rgb": rows, "species": ["cat"] * 52})
    with pytest.raises(PreprocessError, match=r"'rgb', row 51: NaN"):
        validation_preprocessor(bad, "late", "species", "rgb",
                                training_preprocessor_table="streamed", storage=storage)
    assert not (tmp_path / "late").exists() or not any((tmp_path / "late").rglob("*.parquet"))
    with pytest.raises(DatasetNotFoundError):
        read_manifest(open_storage(storage), "late")


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("const", [255.0, 1.0, 0.1, 3.0])
def test_normalize_equals_a_float64_division_rounded_once(dtype: type, const: float) -> None:
    from trainfeed.preprocess.packed import normalize

    rng = np.random.default_rng(1)
    block = (rng.integers(0, 256, 4096) if np.dtype(dtype).kind in "iu"
             else rng.random(4096) * 300).astype(dtype)
    got = normalize(block, const)
    assert got.dtype == np.float32
    assert np.array_equal(got, (block.astype(np.float64) / const).astype(np.float32))


def test_a_pandas_dataframe_is_a_source(tmp_path: Path) -> None:
    import pandas as pd

    table = madlib_table(rows=20, flat=True)
    frame = pd.DataFrame({"rgb": [np.array(v) for v in table.column("rgb").to_pylist()],
                          "species": table.column("species").to_pylist()})
    summary = training_preprocessor(frame, "from_pandas", "species", "rgb",
                                    normalizing_const=255, num_workers=2, storage=str(tmp_path))
    assert summary["source_table"] == "DataFrame" and summary["num_rows"] == 20
    buffers = list(dist.reader("from_pandas", source=LocalSource(storage=str(tmp_path)))())
    assert instances(buffers) == source_instances(table, list(SPECIES))


def test_dense_array_reads_a_chunked_column_chunk_by_chunk() -> None:
    from trainfeed.preprocess.packed import dense_array

    first = pa.array([[[1, 2]], [[3, 4]]], pa.list_(pa.list_(pa.int16())))
    second = pa.array([[[5, 6]]], pa.list_(pa.list_(pa.int16())))
    empty = pa.array([], pa.list_(pa.list_(pa.int16())))
    block = dense_array(pa.chunked_array([first, empty, second]))
    assert block is not None and block.dtype == np.int16
    assert block.tolist() == [[[1, 2]], [[3, 4]], [[5, 6]]]
    other_shape = pa.array([[[5, 6, 7]]], pa.list_(pa.list_(pa.int16())))
    assert dense_array(pa.chunked_array([first, other_shape])) is None  # the row-wise path
    assert dense_array(pa.chunked_array([empty])) is None


def test_the_madlib_documentation_summaries(tmp_path: Path) -> None:
    # training_preprocessor_dl's user docs, 52 rows of 2x2 RGB on 3 segments: the summary, the
    # num_classes=5 example, and the 'segments_to_use' table of two dbids (buffer_size 26).
    storage = str(tmp_path)
    summary = training_preprocessor(madlib_table(), "image_data_packed", "species", "rgb", None,
                                    255, num_workers=3, storage=storage)
    assert {k: summary[k] for k in (
        "dependent_varname", "independent_varname", "dependent_vartype",
        "species_class_values", "buffer_size", "normalizing_const", "num_classes",
        "distribution_rules", "__internal_gpu_config__")} == {
        "dependent_varname": ["species"], "independent_varname": ["rgb"],
        "dependent_vartype": ["text"], "species_class_values": ["bird", "cat", "dog"],
        "buffer_size": 18, "normalizing_const": 255, "num_classes": [3],
        "distribution_rules": "all_segments", "__internal_gpu_config__": "all_segments"}
    val = validation_preprocessor(madlib_table(), "val_image_data_packed", "species", "rgb",
                                  "image_data_packed", None, storage=storage)
    assert val["buffer_size"] == 18 and val["species_class_values"] == ["bird", "cat", "dog"]
    assert val["normalizing_const"] == 255 and val["num_classes"] == [3]
    padded = training_preprocessor(madlib_table(), "image_data_packed", "species", "rgb", None,
                                   255, [5], num_workers=3, storage=storage)
    assert padded["species_class_values"] == ["bird", "cat", "dog", None, None]
    assert padded["buffer_size"] == 18 and padded["num_classes"] == [5]
    two = training_preprocessor(madlib_table(), "image_data_packed", "species", "rgb", None,
                                255, None, ["seg-2", "seg-3"], storage=storage)
    assert two["buffer_size"] == 26 and two["num_buffers"] == 2
    assert two["distribution_rules"] == two["__internal_gpu_config__"] == ["seg-2", "seg-3"]
