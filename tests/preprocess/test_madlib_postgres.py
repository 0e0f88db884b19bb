"""MADlib's install check for the deep-learning preprocessors against a real PostgreSQL (the
`postgres_url` fixture): its table, created with its own DDL, and `dependent_vartype` as
PostgreSQL names the column types (pg_typeof), as MADlib records them."""
from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from trainfeed import LocalSource, dist
from trainfeed.preprocess import training_preprocessor, validation_preprocessor
from trainfeed.sql import sql

pytestmark = pytest.mark.integration

# deep_learning/test/input_data_preprocessor.sql_in, data_preprocessor_input (second version)
MADLIB_ROWS = """
(ARRAY[1,2,3,4,5,6], 4, TRUE, 'a', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,2,3,4,5,6], 3, TRUE, 'c', 4.2, ARRAY[0.0, 1.0], ARRAY[1,0]),
(ARRAY[11,22,33,4,5,6], 8, TRUE, 'a', 4.0, ARRAY[0.0, 1.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,5,6], 2, FALSE, 'a', 4.2, ARRAY[0.0, 1.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,6], 5, TRUE, 'b', 4.0, ARRAY[0.0, 1.0], ARRAY[0,1]),
(ARRAY[11,22,33,44,65,56], 6, TRUE, 'a', 5.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], 2, TRUE, 'a', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], 10, TRUE, 'a', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], 3, TRUE, 'b', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], 7, FALSE, 'a', 5.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], 6, TRUE, 'a', 4.0, ARRAY[0.0, 1.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], -6, TRUE, 'a', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,144,65,56], 9, TRUE, 'c', 4.0, ARRAY[0.0, 1.0], ARRAY[1,0]),
(ARRAY[11,22,233,44,65,56], 0, TRUE, 'a', 5.0, ARRAY[1.0, 0.0], ARRAY[0,1]),
(ARRAY[11,22,33,44,65,56], 12, TRUE, 'a', 4.0, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], -3, FALSE, 'a', 4.2, ARRAY[1.0, 0.0], ARRAY[1,0]),
(ARRAY[11,22,33,44,65,56], -1, TRUE, 'b', 4.0, ARRAY[0.0, 1.0], ARRAY[0,1])
"""


@pytest.fixture
def madlib_table(postgres_url: str) -> str:
    """data_preprocessor_input with MADlib's DDL, plus columns of other types."""
    table = f"data_preprocessor_input_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (id serial, x double precision[], y INTEGER, "
                   f"y1 BOOLEAN, y2 TEXT, y3 DOUBLE PRECISION, y4 DOUBLE PRECISION[], "
                   f"y5 INTEGER[])")
        db.execute(f"INSERT INTO {table} (x, y, y1, y2, y3, y4, y5) VALUES {MADLIB_ROWS}")
        db.execute(f"ALTER TABLE {table} ADD COLUMN ys smallint, ADD COLUMN yb bigint, "
                   f"ADD COLUMN yv varchar(8), ADD COLUMN yr real, ADD COLUMN yn numeric(4,1),"
                   f" ADD COLUMN ynull text")
        db.execute(f"UPDATE {table} SET ys = y, yb = y, yv = y2, yr = y3, yn = y3, "
                   f"ynull = CASE WHEN id % 4 = 0 THEN NULL ELSE y2 END")
    return table


@pytest.mark.parametrize("column,vartype,classes", [
    ("y", "integer", [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]),
    ("y1", "boolean", [False, True]),
    ("y2", "text", ["a", "b", "c"]),
    ("y3", "double precision", [4.0, 4.2, 5.0]),
    ("y4", "double precision[]", None),
    ("y5", "integer[]", None),
    ("ys", "smallint", [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]),
    ("yb", "bigint", [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]),
    ("yv", "character varying", ["a", "b", "c"]),
    ("yr", "real", [4.0, 4.199999809265137, 5.0]),
    ("yn", "numeric", [4, 4.2, 5]),
    ("ynull", "text", [None, "a", "b", "c"]),
])
def test_dependent_vartype_is_the_postgres_type(postgres_url: str, madlib_table: str,
                                                tmp_path: Path, column: str, vartype: str,
                                                classes: list | None) -> None:
    source = sql(f"SELECT * FROM {madlib_table}", postgres_url)
    assert source.column_types()[column] == vartype  # pg_typeof's name, from the type OID
    storage = str(tmp_path)
    summary = training_preprocessor(source, "batch", column, "x", 4, 5, storage=storage)
    assert summary["dependent_vartype"] == [vartype]
    assert summary[f"{column}_class_values"] == classes
    # NULL for arrays taken as one-hot, as in MADlib
    assert summary["num_classes"] == [None if classes is None else len(classes)]
    assert summary["buffer_size"] == 4 and summary["num_buffers"] == 5
    assert summary["distribution_rules"] == summary["__internal_gpu_config__"] == "all_segments"
    buffers = list(dist.reader("batch", source=LocalSource(storage=storage))())
    assert sum(len(b[column]) for b in buffers) == 17
    assert all((b[column].sum(axis=1) == 1).all() for b in buffers)


def test_validation_by_position_from_postgres(postgres_url: str, madlib_table: str,
                                              tmp_path: Path) -> None:
    storage = str(tmp_path)
    training_preprocessor(sql(f"SELECT * FROM {madlib_table}", postgres_url), "batch", "y", "x",
                          4, 5, [16], storage=storage)
    validation = f"validation_input_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {validation}(id serial, x_new double precision[], "
                   f"y_new INTEGER)")
        db.execute(f"INSERT INTO {validation}(x_new, y_new) VALUES (ARRAY[1,2,3,4,5,6], 4)")
    summary = validation_preprocessor(sql(f"SELECT * FROM {validation}", postgres_url), "val",
                                      "y_new", "x_new", "batch", storage=storage)
    assert summary["dependent_vartype"] == ["integer"]
    assert summary["y_new_class_values"] == [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12,
                                             None, None]
    assert summary["buffer_size"] == 1 and summary["num_classes"] == [16]
    [b] = list(dist.reader("val", source=LocalSource(storage=storage))())
    assert b["y_new"].tolist() == [[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert abs(float(b["x_new"][0][0]) - 0.2) < 1e-7
