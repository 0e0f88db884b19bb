"""MADlib's install check for the deep-learning preprocessors
(src/ports/postgres/modules/deep_learning/test/input_data_preprocessor.sql_in), translated:
the same tables, calls and expected figures, from Arrow, Parquet and SQLite sources; a real
PostgreSQL's type names are in test_madlib_postgres.py."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainfeed import LocalSource, dist
from trainfeed.errors import DatasetNotFoundError
from trainfeed.formats.manifest import read_manifest
from trainfeed.preprocess import PreprocessError, training_preprocessor, validation_preprocessor
from trainfeed.sql import sql
from trainfeed.storage import open_storage

# data_preprocessor_input (the second one: x double precision[], y INTEGER, y1 BOOLEAN,
# y2 TEXT, y3 DOUBLE PRECISION, y4 DOUBLE PRECISION[], y5 INTEGER[]), 17 rows.
X = [[1, 2, 3, 4, 5, 6], [11, 2, 3, 4, 5, 6], [11, 22, 33, 4, 5, 6], [11, 22, 33, 44, 5, 6],
     [11, 22, 33, 44, 65, 6]] + [[11, 22, 33, 44, 65, 56]] * 7 + [
    [11, 22, 33, 144, 65, 56], [11, 22, 233, 44, 65, 56]] + [[11, 22, 33, 44, 65, 56]] * 3
Y = [4, 3, 8, 2, 5, 6, 2, 10, 3, 7, 6, -6, 9, 0, 12, -3, -1]
Y1 = [True, True, True, False, True, True, True, True, True, False, True, True, True, True,
      True, False, True]
Y2 = list("acaabaaabaaacaaab")
Y3 = [4.0, 4.2, 4.0, 4.2, 4.0, 5.0, 4.0, 4.0, 4.0, 5.0, 4.0, 4.0, 4.0, 5.0, 4.0, 4.2, 4.0]
Y4 = [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]] + [[1.0, 0.0]] * 5 + [
    [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
Y5 = [[1, 0]] * 4 + [[0, 1]] + [[1, 0]] * 8 + [[0, 1], [1, 0], [1, 0], [0, 1]]
Y_CLASSES_16 = [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, None, None]

# data_preprocessor_input_null: text labels, four of them NULL
NULL_LABELS = ["a", "a", None, "a", "a", "a", "a", None, "a", "a", None, "a", "b", "b", "b",
               "b", None]


def madlib_input() -> pa.Table:
    """data_preprocessor_input with MADlib's column types as Arrow types."""
    return pa.table({
        "id": pa.array(range(1, 18), pa.int32()),
        "x": pa.array([[float(v) for v in r] for r in X], pa.list_(pa.float64())),
        "y": pa.array(Y, pa.int32()), "y1": pa.array(Y1), "y2": pa.array(Y2),
        "y3": pa.array(Y3, pa.float64()), "y4": pa.array(Y4, pa.list_(pa.float64())),
        "y5": pa.array(Y5, pa.list_(pa.int32()))})


def validation_input(dependent: str = "y_new") -> pa.Table:
    """validation_input: one row, x_new = [1..6], y_new (or y) = 4, y1 TRUE, y4 [1, 0]."""
    return pa.table({"id": pa.array([1], pa.int32()),
                     "x_new": pa.array([[1.0, 2, 3, 4, 5, 6]]),
                     dependent: pa.array([4], pa.int32()), "y1": pa.array([True]),
                     "y2": ["a"], "y3": [4.0], "y4": pa.array([[1.0, 0.0]]),
                     "y5": pa.array([[1, 0]], pa.list_(pa.int32()))})


def as_parquet(tmp_path: Path) -> Callable[[pa.Table, str], Any]:
    def make(table: pa.Table, name: str) -> str:
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        return str(path)
    return make


def as_sqlite(tmp_path: Path) -> Callable[[pa.Table, str], Any]:
    """The table in SQLite (arrays as JSON text, booleans as 0/1), read back by a query."""
    path = tmp_path / "madlib.db"

    def make(table: pa.Table, name: str) -> Any:
        columns = table.column_names
        rows = [[json.dumps(v) if isinstance(v, list) else v for v in row.values()]
                for row in table.to_pylist()]
        with sqlite3.connect(path) as db:
            db.execute(f"DROP TABLE IF EXISTS {name}")
            db.execute(f"CREATE TABLE {name} ({', '.join(columns)})")
            db.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(columns))})", rows)
        return sql(f"SELECT * FROM {name} ORDER BY id", f"sqlite:///{path}")
    return make


SOURCES = ["arrow", "parquet", "sqlite"]


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[pa.Table, str], Any]:
    kind = request.param
    if kind == "parquet":
        return as_parquet(tmp_path)
    if kind == "sqlite":
        return as_sqlite(tmp_path)
    return lambda table, name: table


def buffers(name: str, storage: str) -> list[dict[str, Any]]:
    return sorted(dist.reader(name, source=LocalSource(storage=storage))(),
                  key=lambda b: b["buffer_id"])


def test_buffer_counts_and_sizes_of_the_install_check(tmp_path: Path,
                                                      source: Callable) -> None:
    storage = str(tmp_path / "storage")
    table = source(madlib_input(), "data_preprocessor_input")
    summary = training_preprocessor(table, "batch", "id", "x", 5, storage=storage)
    # num_buffers(17, 5) = 4 on PostgreSQL (one segment), buffer_size(17, 5) = 5
    got = buffers("batch", storage)
    assert summary["buffer_size"] == 5 and summary["num_buffers"] == len(got) == 4
    assert [b["x_shape"].tolist() for b in got] == [[5, 6], [5, 6], [5, 6], [2, 6]]
    assert got[0]["x"].nbytes == 5 * 6 * 4
    assert summary["__internal_gpu_config__"] == "all_segments"
    assert summary["distribution_rules"] == "all_segments"
    val = validation_preprocessor(table, "val", "id", "x", "batch", 5, storage=storage)
    got = buffers("val", storage)
    assert val["num_buffers"] == len(got) == 4 and sum(len(b["x"]) for b in got) == 17
    assert val["__internal_gpu_config__"] == "all_segments"


def test_integer_labels_with_num_classes_and_validation_by_position(
        tmp_path: Path, source: Callable, request: pytest.FixtureRequest) -> None:
    storage = str(tmp_path / "storage")
    summary = training_preprocessor(source(madlib_input(), "data_preprocessor_input"), "batch",
                                    "y", "x", 4, 5, [16], storage=storage)
    integer = "bigint" if "sqlite" in request.node.name else "integer"  # SQLite: 64-bit ints
    assert summary["dependent_varname"] == ["y"] and summary["independent_varname"] == ["x"]
    assert summary["dependent_vartype"] == [integer]
    assert summary["y_class_values"] == summary["class_values"]["y"] == Y_CLASSES_16
    assert summary["buffer_size"] == 4 and summary["normalizing_const"] == 5
    assert summary["num_classes"] == [16] and summary["distribution_rules"] == "all_segments"
    got = buffers("batch", storage)
    everything = np.concatenate([b["x"].reshape(-1) for b in got])
    assert abs(everything.min() - 0.2) < 1e-5 and abs(everything.max() - 46.6) < 1e-5
    assert got[0]["y_shape"].tolist()[1] == 16 and got[0]["x"].nbytes == 4 * 6 * 4

    # validation_input's dependent column is y_new, its independent one x_new: matched to the
    # training's y and x by position, not by name.
    val = validation_preprocessor(source(validation_input(), "validation_input"), "val",
                                  "y_new", "x_new", "batch", storage=storage)
    [b] = buffers("val", storage)
    assert abs(b["x_new"][0][0] - 1 / 5.0) < 1e-7
    assert b["y_new"].tolist() == [[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert val["dependent_varname"] == ["y_new"] and val["independent_varname"] == ["x_new"]
    assert val["dependent_vartype"] == [integer]
    assert val["y_new_class_values"] == Y_CLASSES_16
    assert val["buffer_size"] == 1 and val["normalizing_const"] == 5
    assert val["num_classes"] == [16]


@pytest.mark.parametrize("column,vartype,classes", [
    ("y1", "boolean", [False, True]),
    ("y2", "text", ["a", "b", "c"]),
    ("y3", "double precision", [4.0, 4.2, 5.0]),
])
def test_boolean_text_and_double_labels(tmp_path: Path, column: str, vartype: str,
                                        classes: list) -> None:
    storage = str(tmp_path)
    summary = training_preprocessor(madlib_input(), "batch", column, "x", 4, 5, storage=storage)
    assert summary["dependent_vartype"] == [vartype]
    assert summary[f"{column}_class_values"] == classes
    assert summary["num_classes"] == [len(classes)]
    got = buffers("batch", storage)
    assert got[0][f"{column}_shape"].tolist() == [4, len(classes)]
    assert got[0]["x"].nbytes == 4 * 6 * 4 and (got[0][column].sum(axis=1) == 1).all()
    # the validation output of another table records the same classes
    val = validation_preprocessor(validation_input("y"), "val", column, "x_new", "batch",
                                  storage=storage)
    assert val[f"{column}_class_values"] == classes and val["num_classes"] == [len(classes)]


def test_validation_refuses_classes_the_training_output_lacks(tmp_path: Path) -> None:
    storage = str(tmp_path)
    training_preprocessor(madlib_input(), "batch", "y2", "x", 4, 5, storage=storage)
    # an integer column against text classes (MADlib's trap_error on y_new): not a subset
    with pytest.raises(PreprocessError, match=r"the class values in column 'y_new' \(\[4\]\) "
                                              r"should be a subset of the class values of "
                                              r"'y2' in 'batch' \(\['a', 'b', 'c'\]\)"):
        validation_preprocessor(validation_input(), "val", "y_new", "x_new", "batch",
                                storage=storage)
    with pytest.raises(DatasetNotFoundError):
        read_manifest(open_storage(storage), "val")
    # arrays against class values
    with pytest.raises(PreprocessError, match=r"column 'y4' holds arrays \(double precision"
                                              r"\[\]\), but dependent variable 0 of 'batch' "
                                              r"has class values"):
        validation_preprocessor(validation_input(), "val", "y4", "x_new", "batch",
                                storage=storage)
    # two dependent variables against one: they are matched by position
    with pytest.raises(PreprocessError, match=r"2 dependent variable\(s\) \['y_new', 'y1'\], "
                                              r"but 'batch' was packed with 1"):
        validation_preprocessor(validation_input(), "val", "y_new, y1", "x_new", "batch",
                                storage=storage)


@pytest.mark.parametrize("column,vartype", [("y4", "double precision[]"),
                                            ("y5", "integer[]")])
def test_array_labels_are_taken_as_one_hot(tmp_path: Path, column: str, vartype: str) -> None:
    storage = str(tmp_path)
    summary = training_preprocessor(madlib_input(), "batch", column, "x", 4, 5, storage=storage)
    assert summary["dependent_vartype"] == [vartype]
    assert summary[f"{column}_class_values"] is None
    # MADlib: `class_values IS NULL AND num_classes IS NULL` (before: the arrays' width, 2)
    assert summary["num_classes"] == [None]
    got = buffers("batch", storage)
    assert got[0][f"{column}_shape"].tolist() == [4, 2]
    labels = np.concatenate([b[column] for b in got])
    assert labels.sum() == np.sum(Y4 if column == "y4" else Y5)
    val = validation_preprocessor(validation_input(), "val", column, "x_new", "batch",
                                  storage=storage)
    [b] = buffers("val", storage)
    assert b[column].tolist() == [[1, 0]] and b[f"{column}_shape"].tolist() == [1, 2]
    assert val["num_classes"] == [None] and val[f"{column}_class_values"] is None
    # num_classes, if given, must be the arrays' width; it is still NULL in the summary
    same = training_preprocessor(madlib_input(), "width", column, "x", num_classes=2,
                                 storage=storage)
    assert same["num_classes"] == [None]
    # class labels cannot validate against arrays
    with pytest.raises(PreprocessError, match=r"num_classes is 3 for column 'y4', but its "
                                              r"one-hot arrays \(double precision\[\]\) have 2"):
        training_preprocessor(madlib_input(), "bad", "y4", "x", num_classes=3, storage=storage)
    with pytest.raises(PreprocessError, match="was one-hot arrays: pass a column of arrays"):
        validation_preprocessor(validation_input(), "val2", "y1", "x_new", "batch",
                                storage=storage)


def null_table(labels: list) -> pa.Table:
    rows = X[:len(labels)]
    return pa.table({"id": pa.array(range(1, len(labels) + 1), pa.int32()),
                     "x": pa.array([[float(v) for v in r] for r in rows]),
                     "label": pa.array(labels, pa.string())})


def test_null_is_a_class_in_training_and_validation(tmp_path: Path, source: Callable) -> None:
    storage = str(tmp_path / "storage")
    summary = training_preprocessor(source(null_table(NULL_LABELS), "data_preprocessor_input_null"),
                                    "batch", "label", "x", 4, 5, [5], storage=storage)
    # '{NULL,a,b,NULL,NULL}': the NULL class first, then two padding NULLs (num_classes 5)
    assert summary["label_class_values"] == [None, "a", "b", None, None]
    assert summary["num_classes"] == [5] and summary["dependent_vartype"] == ["text"]
    got = buffers("batch", storage)
    assert got[0]["label_shape"].tolist() == [4, 5] and got[0]["x"].nbytes == 4 * 6 * 4
    labels = np.concatenate([b["label"] for b in got])
    assert labels.sum(axis=0).tolist() == [4, 9, 4, 0, 0]  # 4 NULLs, 9 a's, 4 b's

    # data_preprocessor_input_validation_null, buffer_size 1
    val_table = pa.table({"id": pa.array([1, 2, 3, 4], pa.int32()),
                          "x": pa.array([[1.0, 2, 3, 4, 5, 6], [11.0, 2, 3, 4, 5, 6],
                                         [11.0, 2, 3, 4, 5, 6], [111.0, 22, 33, 4, 5, 6]]),
                          "label": pa.array(["a", "b", "b", None])})
    val = validation_preprocessor(source(val_table, "data_preprocessor_input_validation_null"),
                                  "val", "label", "x", "batch", 1, storage=storage)
    assert val["label_class_values"] == [None, "a", "b", None, None]
    by_first = {round(float(b["x"][0][0]) * 5): b["label"].tolist() for b in
                buffers("val", storage)}
    assert by_first[1] == [[0, 1, 0, 0, 0]]  # 'a'
    assert by_first[111] == [[1, 0, 0, 0, 0]]  # NULL

    # a class the training output lacks ('bbbb') is refused
    with pytest.raises(PreprocessError, match=r"\['bbbb'\]\) should be a subset"):
        validation_preprocessor(null_table(["bbbb"]), "val2", "label", "x", "batch", 1,
                                storage=storage)


def test_a_single_null_row_with_num_classes_3(tmp_path: Path) -> None:
    storage = str(tmp_path)
    table = pa.table({"x": pa.array([[11.0, 22, 33, 4, 5, 6]]),
                      "label": pa.array([None], pa.string())})
    summary = training_preprocessor(table, "batch", "label", "x", 4, 5, [3], storage=storage)
    assert summary["label_class_values"] == [None, None, None]
    [b] = buffers("batch", storage)
    assert b["label_shape"].tolist() == [1, 3] and b["x"].nbytes == 24
    assert b["label"].tolist() == [[1, 0, 0]]
    val = validation_preprocessor(table, "val", "label", "x", "batch", 4, storage=storage)
    [b] = buffers("val", storage)
    assert val["label_class_values"] == [None, None, None] and b["label"].tolist() == [[1, 0, 0]]


@pytest.mark.parametrize("labels,dtype,want", [
    ([3, None, 1, 3], pa.int32(), [None, 1, 3]),
    ([True, None, False], pa.bool_(), [None, False, True]),
    ([2.5, None, 0.5], pa.float64(), [None, 0.5, 2.5]),
])
def test_null_classes_of_every_type_with_and_without_num_classes(
        tmp_path: Path, labels: list, dtype: pa.DataType, want: list) -> None:
    table = pa.table({"x": pa.array([[float(i)] for i in range(len(labels))]),
                      "y": pa.array(labels, dtype)})
    storage = str(tmp_path)
    summary = training_preprocessor(table, "plain", "y", "x", storage=storage)
    assert summary["y_class_values"] == want and summary["num_classes"] == [3]
    padded = training_preprocessor(table, "padded", "y", "x", num_classes=4, storage=storage)
    assert padded["y_class_values"] == want + [None] and padded["num_classes"] == [4]
    [b] = buffers("padded", storage)
    got = {int(x[0]): y.tolist() for x, y in zip(b["x"], b["y"])}
    for i, label in enumerate(labels):
        assert got[i] == [int(c == want.index(label)) for c in range(4)]
    with pytest.raises(PreprocessError, match=r"invalid num_classes value specified \(2\)"):
        training_preprocessor(table, "bad", "y", "x", num_classes=2, storage=storage)


def test_arguments_are_checked_as_madlib_does(tmp_path: Path) -> None:
    storage = str(tmp_path)
    table = madlib_input()
    with pytest.raises(PreprocessError, match=r"training_preprocessor: the normalizing "
                                              r"constant has to be a positive number"):
        training_preprocessor(table, "bad", "y", "x", normalizing_const=-5, storage=storage)
    with pytest.raises(PreprocessError, match="normalizing constant"):
        training_preprocessor(table, "bad", "y", "x", normalizing_const=0, storage=storage)
    with pytest.raises(PreprocessError, match=r"the buffer size has to be a positive integer"):
        training_preprocessor(table, "bad", "y", "x", buffer_size=0, storage=storage)
    with pytest.raises(PreprocessError, match=r"num_classes has 2 entries for 1 dependent"):
        training_preprocessor(table, "bad", "y", "x", num_classes=[16, 2], storage=storage)
    with pytest.raises(PreprocessError, match=r"dependent_varname 'y,,y1' has an empty"):
        training_preprocessor(table, "bad", "y,,y1", "x", storage=storage)
    with pytest.raises(PreprocessError, match=r"no column 'nope'"):
        training_preprocessor(table, "bad", "y, nope", "x", storage=storage)
    with pytest.raises(DatasetNotFoundError):
        read_manifest(open_storage(storage), "bad")
    # None is MADlib's default normalizing constant, 1.0
    assert training_preprocessor(table, "ok", "y", "x", normalizing_const=None,
                                 storage=storage)["normalizing_const"] == 1.0


def test_comma_separated_columns_as_madlib_splits_them(tmp_path: Path) -> None:
    storage = str(tmp_path)
    table = madlib_input().append_column("x2", pa.array([[1.0, 2.0]] * 17))
    table = table.append_column("a,b", pa.array(Y2))
    summary = training_preprocessor(table, "multi", "y1, y2", " x,x2 ", 4, 5, storage=storage)
    assert summary["dependent_varname"] == ["y1", "y2"]
    assert summary["independent_varname"] == ["x", "x2"]
    assert summary["dependent_vartype"] == ["boolean", "text"]
    assert summary["num_classes"] == [2, 3]
    b = buffers("multi", storage)[0]
    assert b["y1"].shape[1] == 2 and b["y2"].shape[1] == 3 and b["x2"].shape[1:] == (2,)
    quoted = training_preprocessor(table, "quoted", '"a,b"', "x", storage=storage)
    assert quoted["dependent_varname"] == ["a,b"] and quoted["a,b_class_values"] == ["a", "b",
                                                                                     "c"]


def test_madlib_rule_names_are_stored_as_madlib_stores_them(tmp_path: Path) -> None:
    storage = str(tmp_path)
    gpu = training_preprocessor(madlib_input(), "gpu", "y", "x",
                                distribution_rules="gpu_segments", storage=storage)
    assert gpu["distribution_rules"] == gpu["__internal_gpu_config__"] == "gpu_segments"
    named = training_preprocessor(madlib_input(), "named", "y", "x",
                                  distribution_rules="node-b,node-a", storage=storage)
    assert named["distribution_rules"] == ["node-a", "node-b"]
    assert named["__internal_gpu_config__"] == ["node-a", "node-b"]
    assert named["num_workers"] == 2  # MADlib packs for the segments its rules select
    assert named["num_buffers"] == 2
    # validation has its own rules, all_segments by default (MADlib's)
    val = validation_preprocessor(madlib_input(), "val", "y", "x", "named", storage=storage)
    assert val["distribution_rules"] == "all_segments" and val["num_workers"] == 2
    own = validation_preprocessor(madlib_input(), "val", "y", "x", "named",
                                  distribution_rules=["node-c"], storage=storage)
    assert own["distribution_rules"] == ["node-c"] and own["num_workers"] == 1
    with pytest.raises(PreprocessError, match="invalid distribution rules"):
        training_preprocessor(madlib_input(), "bad", "y", "x", distribution_rules="a b",
                              storage=storage)


def test_the_cli_takes_madlibs_lists_rules_and_num_classes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.cli.main import main

    lines = ["x,y1,y2"] + [f'"{json.dumps(X[i])}",{str(Y1[i]).lower()},{Y2[i]}'
                           for i in range(17)]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    storage = str(tmp_path / "storage")
    assert main(["preprocess", "train", str(tmp_path / "train.csv"), "batch", "--dependent",
                 "y1,y2", "--independent", "x", "--num-classes", "3", "4",
                 "--normalizing-const", "5", "--distribution-rules", "all_segments",
                 "--storage", storage]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dependent_vartype"] == ["boolean", "text"]
    assert summary["y1_class_values"] == [False, True, None]
    assert summary["y2_class_values"] == ["a", "b", "c", None]
    assert summary["num_classes"] == [3, 4] and summary["distribution_rules"] == "all_segments"
    assert main(["preprocess", "validate", str(tmp_path / "train.csv"), "val", "--dependent",
                 "y1", "y2", "--independent", "x", "--training", "batch",
                 "--distribution-rules", "gpu_segments", "--num-workers", "2",
                 "--storage", storage]) == 0
    val = json.loads(capsys.readouterr().out)
    assert val["distribution_rules"] == "gpu_segments" and val["num_buffers"] == 2
    assert main(["preprocess", "train", str(tmp_path / "train.csv"), "bad", "--dependent",
                 "y1", "--independent", "x", "--normalizing-const", "-1",
                 "--storage", storage]) == 2
    assert "normalizing constant has to be a positive number" in capsys.readouterr().err


def test_sqlite_results_carry_no_column_types(tmp_path: Path) -> None:
    source = as_sqlite(tmp_path)(madlib_input(), "t")
    assert source.column_types() == {}  # their values' Arrow types are named instead
    summary = training_preprocessor(source, "batch", "y1, y2", "x", storage=str(tmp_path))
    assert summary["dependent_vartype"] == ["bigint", "text"]  # booleans are 0/1 in SQLite
    assert summary["y1_class_values"] == [0, 1]
