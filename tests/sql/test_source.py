"""trainfeed.sql on embedded SQLite: partitions are disjoint and cover the result, identifiers
are quoted, errors name the database and the cause. The PostgreSQL twin of these checks is
tests/integration/test_sql_postgres.py."""

from __future__ import annotations

import pickle
import sqlite3
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainfeed.errors import TrainfeedError
from trainfeed.sql import InvalidQueryError, SqlError, SqlSource, UnknownColumnError, sql

ROWS = 1000
WORDS = ["apple", "banana", "cherry", "date", "elder"]


def make_db(path: Path) -> str:
    """A table `items` of ROWS rows (id, name, score), some names NULL; returns its URL."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, score REAL)")
        db.executemany(
            "INSERT INTO items VALUES (?, ?, ?)",
            [(i, None if i % 50 == 0 else WORDS[i % 5], i * 0.25 - 50) for i in range(ROWS)],
        )
    db.close()
    return f"sqlite:///{path}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return make_db(tmp_path / "items.db")


def partition_ids(source: SqlSource, num_partitions: int, column: str = "id") -> list[list[int]]:
    return [source.read_partition(m, num_partitions).column(column).to_pylist()
            for m in range(num_partitions)]


def assert_disjoint_cover(parts: list[list[int]], expected: list[int]) -> None:
    counts = Counter(i for part in parts for i in part)
    assert max(counts.values(), default=1) == 1, "a row is in two partitions"
    assert sorted(counts) == sorted(expected), "the partitions do not cover the result"


# --- reading ----------------------------------------------------------------------------------


def test_count_read_and_columns(url: str) -> None:
    source = sql("SELECT id, name, score FROM items WHERE id < 600", url)
    assert source.count() == 600
    assert source.columns() == ["id", "name", "score"]
    table = source.read()
    assert table.column_names == ["id", "name", "score"]
    assert table.num_rows == 600
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    assert table.column("id").to_pylist() == list(range(600))
    assert table.column("name").to_pylist()[:3] == [None, "banana", "cherry"]


def test_a_plain_path_is_sqlite_and_a_trailing_semicolon_is_dropped(tmp_path: Path) -> None:
    make_db(tmp_path / "items.db")
    source = sql("SELECT id FROM items;  -- all of them\n", str(tmp_path / "items.db"))
    assert source.dialect == "sqlite"
    assert source.count() == ROWS


@pytest.mark.parametrize("num_partitions", [1, 7, 64])
@pytest.mark.parametrize("key_columns", [(), ("id",), ("name",), ("name", "score")])
def test_partitions_are_disjoint_and_cover_the_result(
    url: str, num_partitions: int, key_columns: tuple[str, ...]
) -> None:
    source = sql("SELECT * FROM items WHERE score >= -20", url, key_columns)
    expected = source.read().column("id").to_pylist()
    parts = partition_ids(source, num_partitions)
    assert_disjoint_cover(parts, expected)
    assert partition_ids(source, num_partitions) == parts  # deterministic


def test_key_columns_decide_the_partition(url: str) -> None:
    by_name = sql("SELECT id, name FROM items", url, ["name"])
    by_row = sql("SELECT id, name FROM items", url)
    names = [set(by_name.read_partition(m, 7).column("name").to_pylist()) for m in range(7)]
    # Equal keys share a partition: 5 words plus NULL fill at most 6 partitions, one each.
    assert sum(len(n) for n in names) == len(WORDS) + 1
    assert sum(1 for n in names if n) <= len(WORDS) + 1
    # Hashing whole rows spreads the same rows over every partition.
    sizes = [by_row.read_partition(m, 7).num_rows for m in range(7)]
    assert sum(sizes) == ROWS and min(sizes) > ROWS / 7 / 2


def test_an_empty_partition_has_the_columns(url: str) -> None:
    source = sql("SELECT id, name FROM items WHERE id = 3", url, ["id"])
    tables = [source.read_partition(m, 4) for m in range(4)]
    assert [t.num_rows for t in tables].count(1) == 1
    assert all(t.column_names == ["id", "name"] for t in tables)


def test_a_quote_in_an_identifier_is_quoted(tmp_path: Path) -> None:
    path = tmp_path / "weird.db"
    with sqlite3.connect(path) as db:
        db.execute('CREATE TABLE t ("we""ird" INTEGER, "x; DROP TABLE t; --" TEXT)')
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, str(i)) for i in range(200)])
    db.close()
    source = sql("SELECT * FROM t", f"sqlite:///{path}", ['we"ird'])
    assert source.columns() == ['we"ird', "x; DROP TABLE t; --"]
    assert_disjoint_cover(partition_ids(source, 5, 'we"ird'), list(range(200)))
    other = sql("SELECT * FROM t", f"sqlite:///{path}", ["x; DROP TABLE t; --"])
    assert_disjoint_cover(partition_ids(other, 5, 'we"ird'), list(range(200)))
    assert source.count() == 200  # still there


def test_percent_and_question_marks_in_string_literals_stay_literal(url: str) -> None:
    source = sql("SELECT id, 'a%s?;' AS tag FROM items WHERE name LIKE 'b%'", url, ["tag"])
    parts = [source.read_partition(m, 3) for m in range(3)]
    assert sum(p.num_rows for p in parts) == source.count() == 200
    assert {v for p in parts for v in p.column("tag").to_pylist()} == {"a%s?;"}


def _column(values: st.SearchStrategy[object]) -> st.SearchStrategy[list[object]]:
    return st.lists(st.one_of(st.none(), values), max_size=60)


@pytest.mark.slow
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # One type per column (Arrow needs that), NULLs anywhere, duplicates likely.
    a=st.one_of(_column(st.integers(-(2**63), 2**63 - 1)), _column(st.text(max_size=5)),
                _column(st.floats(allow_nan=False)), _column(st.binary(max_size=4))),
    b=_column(st.integers(-3, 3)),
    num_partitions=st.integers(1, 9),
    keys=st.sampled_from([(), ("a",), ("b",), ("a", "b")]),
)
def test_any_values_are_partitioned_exactly_once(
    tmp_path_factory: pytest.TempPathFactory,
    a: list[object],
    b: list[object],
    num_partitions: int,
    keys: tuple[str, ...],
) -> None:
    path = tmp_path_factory.mktemp("hyp") / "t.db"
    rows = [(i, x, b[i % len(b)] if b else None) for i, x in enumerate(a)]
    with sqlite3.connect(path) as db:  # untyped columns: SQLite keeps each value as given
        db.execute("CREATE TABLE t (rowno INTEGER, a, b)")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    db.close()
    source = sql("SELECT * FROM t", str(path), keys)
    parts = partition_ids(source, num_partitions, "rowno")
    assert_disjoint_cover(parts, list(range(len(rows))))


# --- statistics -------------------------------------------------------------------------------


def test_sample_statistics(url: str) -> None:
    source = sql("SELECT id, name, score, id % 2 = 0 AS even FROM items ORDER BY id", url)
    stats = source.sample_statistics(limit=100)
    assert stats["version"] == 1 and stats["sample_rows"] == 100
    columns = stats["columns"]
    assert list(columns) == ["id", "name", "score", "even"]
    assert columns["name"] == {"kind": "string", "count": 98, "vocabulary": sorted(WORDS)}
    score = columns["score"]
    assert score["kind"] == "numeric" and score["count"] == 100
    assert score["min"] == -50.0 and score["max"] == -25.25
    assert score["mean"] == pytest.approx(-37.625)
    boundaries = score["bucket_boundaries"]
    assert len(boundaries) == 9 and boundaries == sorted(boundaries)
    assert score["min"] < boundaries[0] and boundaries[-1] < score["max"]
    assert columns["id"]["min"] == 0 and columns["id"]["max"] == 99
    assert isinstance(columns["id"]["min"], int)
    only = source.sample_statistics(["name"], limit=10)
    assert list(only["columns"]) == ["name"] and only["sample_rows"] == 10
    with pytest.raises(UnknownColumnError, match="'nope'"):
        source.sample_statistics(["nope"])


# --- errors -----------------------------------------------------------------------------------


def test_a_failing_query_names_the_url_and_the_error(url: str) -> None:
    source = sql("SELECT * FROM no_such_table", url)
    for call in (source.count, source.read, source.columns, lambda: source.read_partition(0, 2)):
        with pytest.raises(SqlError, match="no such table: no_such_table") as info:
            call()
        assert url in str(info.value)
        assert isinstance(info.value, TrainfeedError)


def test_a_missing_database_file_is_an_error_not_a_new_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    with pytest.raises(SqlError, match="absent.db"):
        sql("SELECT 1", url).count()
    assert not (tmp_path / "absent.db").exists()


def test_the_query_cannot_write(url: str) -> None:
    with pytest.raises(SqlError):  # a syntax error as a subquery; read-only regardless
        sql("DELETE FROM items RETURNING id", url).read()
    assert sql("SELECT * FROM items", url).count() == ROWS


def test_a_missing_key_column_is_named(url: str) -> None:
    source = sql("SELECT id, name FROM items", url, ["id", "score"])
    with pytest.raises(UnknownColumnError, match=r"\['score'\].*\['id', 'name'\]"):
        source.read_partition(0, 3)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1; SELECT 2",
        "SELECT 1;\nDROP TABLE items;",
        "SELECT 1 /* ; */ ; -- x\n SELECT 2",
        "",
        "  ;  -- nothing\n",
    ],
)
def test_anything_but_one_statement_is_an_error(url: str, query: str) -> None:
    with pytest.raises(InvalidQueryError):
        sql(query, url)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT ';' AS a",
        "SELECT 'it''s; fine' AS a;",
        'SELECT 1 AS "semi;colon" -- trailing ; comment',
        "SELECT 1 AS a /* ; */;;",
    ],
)
def test_semicolons_inside_literals_and_comments_are_not_separators(url: str, query: str) -> None:
    assert sql(query, url).count() == 1


def test_bad_partition_arguments(url: str) -> None:
    source = sql("SELECT * FROM items", url)
    with pytest.raises(ValueError, match="num_partitions"):
        source.read_partition(0, 0)
    with pytest.raises(ValueError, match=r"m=3 is outside \[0, 3\)"):
        source.read_partition(3, 3)


def test_an_unsupported_scheme_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"'mysql'.*\['postgres', 'postgresql', 'sqlite'\]"):
        sql("SELECT 1", "mysql://root:hunter2@db/x")
    with pytest.raises(ValueError) as info:
        sql("SELECT 1", "mysql://root:hunter2@db/x")
    assert "hunter2" not in str(info.value)


def test_a_password_never_shows_in_repr() -> None:
    source = sql("SELECT 1", "postgresql://me:hunter2@db:5432/x?password=hunter3&sslmode=off")
    assert "hunter" not in repr(source) and "hunter" not in str(source)
    assert "postgresql://me:***@db:5432/x?password=***&sslmode=off" in repr(source)


def test_a_source_is_a_plain_value(url: str) -> None:
    source = sql("SELECT id FROM items", url, ["id"])
    copy = pickle.loads(pickle.dumps(source))
    assert copy == source and hash(copy) == hash(source)
    assert copy.key_columns == ("id",)
    assert copy.count() == ROWS
