"""Numeric PostgreSQL arrays load as numpy (trainfeed.sql.arrays) with exactly the values, shapes
and NULLs that psycopg's own loaders give, and a table of image arrays packs from SQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from trainfeed import LocalSource, dist
from trainfeed.preprocess import PreprocessError, training_preprocessor
from trainfeed.sql import SqlError, sql

pytestmark = pytest.mark.integration

# One row per case: the literal, as a user's table would hold it.
ARRAYS = {
    "smallint[]": ["'{1,2,-3}'", "'{{1,2},{3,4},{5,6}}'", "'{}'", "'{7,NULL,9}'", "NULL"],
    "integer[]": ["'{2147483647,-2147483648}'", "'{{{1},{2}},{{3},{4}}}'"],
    "bigint[]": ["'{9007199254740993,-1}'"],
    "real[]": ["'{0.1,NaN,Infinity,-0}'", "'{{1.5,2.5}}'"],
    "double precision[]": ["'{0.1,1e300,-Infinity}'", "'{NULL}'"],
}


@pytest.fixture
def conn(postgres_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        yield connection


def _same(ours: object, theirs: object) -> bool:
    if isinstance(ours, np.ndarray):
        expected = np.array(theirs, dtype=ours.dtype)  # psycopg gives lists
        return ours.shape == expected.shape and np.array_equal(ours, expected, equal_nan=True)
    return ours == theirs


@pytest.mark.parametrize("type_", sorted(ARRAYS))
def test_binary_numpy_loading_equals_psycopgs_lists(postgres_url: str, conn: psycopg.Connection,
                                                    type_: str) -> None:
    from trainfeed.sql.arrays import register_numeric_array_loaders

    query = " UNION ALL ".join(f"SELECT {i} AS i, {v}::{type_} AS a"
                               for i, v in enumerate(ARRAYS[type_])) + " ORDER BY i"
    theirs = [row[1] for row in conn.execute(query, binary=True).fetchall()]
    with psycopg.connect(postgres_url) as ours_conn:
        register_numeric_array_loaders(ours_conn.adapters)
        ours = [row[1] for row in ours_conn.execute(query, binary=True).fetchall()]
    for value, (o, t) in enumerate(zip(ours, theirs)):
        assert _same(o, t), (ARRAYS[type_][value], o, t)
    # Arrays with NULL elements stay Python lists (so a preprocessor can name the row).
    assert all(isinstance(o, list) for o, lit in zip(ours, ARRAYS[type_]) if "NULL}" in lit
               or ",NULL," in lit)


def test_a_query_reads_arrays_into_list_columns_of_the_right_shape(postgres_url: str,
                                                                     conn: psycopg.Connection
                                                                     ) -> None:
    table = f"imgs_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE TABLE {table} (id int, flat smallint[], nested real[], tag text)")
    rng = np.random.default_rng(0)
    flat = rng.integers(-300, 300, (25, 12)).astype(np.int16)
    nested = rng.random((25, 2, 2, 3)).astype(np.float32)
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)",
                        [(i, flat[i].tolist(), nested[i].tolist(), f"t{i % 3}")
                         for i in range(25)])
    source = sql(f"SELECT * FROM {table} ORDER BY id", postgres_url, key_columns=["id"])
    result = source.read()
    assert result.schema.field("flat").type == pa.list_(pa.int16())
    assert result.schema.field("nested").type == pa.list_(pa.list_(pa.list_(pa.float32())))
    assert np.array_equal(np.array(result.column("flat").to_pylist(), np.int16), flat)
    assert np.array_equal(np.array(result.column("nested").to_pylist(), np.float32), nested)
    parts = [source.read_partition(m, 4) for m in range(4)]
    assert sorted(i for p in parts for i in p.column("id").to_pylist()) == list(range(25))
    empty = sql(f"SELECT * FROM {table} WHERE id < 0", postgres_url).read()
    assert empty.num_rows == 0 and empty.schema.field("flat").type == pa.list_(pa.int16())
    # Rows of different dimensions cannot share a column: a clear error naming it.
    conn.execute(f"INSERT INTO {table} VALUES (99, '{{{{1}}}}', '{{1}}', 'x')")
    with pytest.raises(SqlError, match=r"column '(flat|nested)'.*array dimensions"):
        sql(f"SELECT * FROM {table} ORDER BY id DESC", postgres_url).read()


def test_a_sql_table_of_images_packs_and_a_null_pixel_names_its_row(
        postgres_url: str, conn: psycopg.Connection, tmp_path) -> None:
    table = f"madlib_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE TABLE {table} (id int, rgb smallint[], species text)")
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (52, 2, 2, 3))
    species = ["bird", "cat", "dog"]
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                        [(i, images[i].tolist(), species[i % 3]) for i in range(52)])
    storage = str(tmp_path)
    summary = training_preprocessor(sql(f"SELECT * FROM {table}", postgres_url, ["id"]),
                                    "from_sql", "species", "rgb", normalizing_const=255,
                                    num_workers=3, storage=storage)
    assert [summary["num_buffers"], summary["buffer_size"]] == [3, 18]
    buffers = list(dist.reader("from_sql", source=LocalSource(storage=storage))())
    got = sorted(tuple(np.rint(x * 255).astype(int).reshape(-1)) for b in buffers
                 for x in b["rgb"])
    assert got == sorted(tuple(img.reshape(-1)) for img in images)
    assert all(b["rgb"].shape[1:] == (2, 2, 3) for b in buffers)
    conn.execute(f"UPDATE {table} SET rgb[2][1][3] = NULL WHERE id = 7")
    with pytest.raises(PreprocessError, match=r"'rgb', row 7: NaN, infinite or missing \(NULL\)"):
        training_preprocessor(sql(f"SELECT * FROM {table} ORDER BY id", postgres_url),
                              "bad_sql", "species", "rgb", storage=storage)
