"""trainfeed.sql against a real PostgreSQL server (the `postgres_url` fixture): partitions are
disjoint and cover the result, errors name the server and the cause, and a password never shows.
The SQLite twin of these checks is tests/sql/test_source.py."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest

from trainfeed.errors import TrainfeedError
from trainfeed.sql import InvalidQueryError, SqlError, SqlSource, UnknownColumnError, sql

pytestmark = pytest.mark.integration

ROWS = 1000
WORDS = ["apple", "banana", "cherry", "date", "elder"]


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    """A fresh table of ROWS rows: id, name (some NULL), score, a column named q (which must
    not be taken for the row) and one named we"ird. Yields its (quoted) name."""
    name = f'"items_{uuid.uuid4().hex[:10]}"'
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE {name} (id integer PRIMARY KEY, name text, '
                     f'score double precision, q integer, "we""ird" text, at timestamptz)')
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s, "
                f"'2024-03-01 12:00+00'::timestamptz + %s * interval '1 hour')",
                [(i, None if i % 50 == 0 else WORDS[i % 5], i * 0.25 - 50, i % 3, f"w{i % 11}", i)
                 for i in range(ROWS)],
            )
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}")


def partition_ids(source: SqlSource, num_partitions: int) -> list[list[int]]:
    return [source.read_partition(m, num_partitions).column("id").to_pylist()
            for m in range(num_partitions)]


def assert_disjoint_cover(parts: list[list[int]], expected: list[int]) -> None:
    counts = Counter(i for part in parts for i in part)
    assert max(counts.values(), default=1) == 1, "a row is in two partitions"
    assert sorted(counts) == sorted(expected), "the partitions do not cover the result"


def test_count_read_and_columns(postgres_url: str, table: str) -> None:
    source = sql(f"SELECT id, name, score FROM {table} WHERE id < 600 ORDER BY id;", postgres_url)
    assert source.dialect == "postgresql"
    assert source.count() == 600
    assert source.columns() == ["id", "name", "score"]
    result = source.read()
    assert result.schema == pa.schema([("id", pa.int32()), ("name", pa.string()),
                                       ("score", pa.float64())])
    assert result.column("id").to_pylist() == list(range(600))


@pytest.mark.parametrize("num_partitions", [1, 7, 64])
@pytest.mark.parametrize("key_columns", [(), ("id",), ("name",), ("name", "score"), ('we"ird',)])
def test_partitions_are_disjoint_and_cover_the_result(
    postgres_url: str, table: str, num_partitions: int, key_columns: tuple[str, ...]
) -> None:
    source = sql(f"SELECT * FROM {table} WHERE score >= -20", postgres_url, key_columns)
    expected = source.read().column("id").to_pylist()
    assert len(expected) == 880
    parts = partition_ids(source, num_partitions)
    assert_disjoint_cover(parts, expected)
    assert partition_ids(source, num_partitions) == parts  # deterministic
    if num_partitions == 64 and key_columns in ((), ("id",)):
        assert sum(1 for p in parts if p) > 48  # and actually spread


def test_empty_partitions_keep_the_schema(postgres_url: str, table: str) -> None:
    source = sql(f"SELECT id, name, at FROM {table} WHERE id = 3", postgres_url, ["id"])
    tables = [source.read_partition(m, 4) for m in range(4)]
    assert [t.num_rows for t in tables].count(1) == 1
    assert len({t.schema for t in tables}) == 1
    assert tables[0].schema.field("at").type == pa.timestamp("us", tz="UTC")


def test_partitions_do_not_depend_on_the_client_time_zone(
    postgres_url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = sql(f"SELECT id, at FROM {table}", postgres_url, ["at"])
    before = partition_ids(source, 7)
    monkeypatch.setenv("PGTZ", "Asia/Kathmandu")  # libpq sends it as the session's TimeZone
    assert partition_ids(source, 7) == before


def test_libpq_environment_is_honoured(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = f"env_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        monkeypatch.setenv("PGDATABASE", database)
        without_db = postgres_url.rsplit("/", 1)[0]
        assert sql("SELECT current_database() AS db", without_db).read().to_pylist() == [
            {"db": database}]
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database}")


def test_percent_signs_in_the_query_stay_literal(postgres_url: str, table: str) -> None:
    source = sql(f"SELECT id, 'a%s' AS tag FROM {table} WHERE name LIKE 'b%'", postgres_url,
                 ["tag"])
    assert source.count() == 200
    assert sum(len(p) for p in partition_ids(source, 3)) == 200


def test_a_failing_query_names_the_url_and_the_error(postgres_url: str) -> None:
    source = sql("SELECT * FROM no_such_table", postgres_url)
    for call in (source.count, source.read, source.columns, lambda: source.read_partition(0, 2)):
        with pytest.raises(SqlError, match='relation "no_such_table" does not exist') as info:
            call()
        assert postgres_url in str(info.value)
        assert isinstance(info.value, TrainfeedError)


def test_a_missing_key_column_is_named(postgres_url: str, table: str) -> None:
    source = sql(f"SELECT id, name FROM {table}", postgres_url, ["ID"])
    with pytest.raises(UnknownColumnError, match=r"\['ID'\].*lower case"):
        source.read_partition(0, 3)


def test_the_query_cannot_write(postgres_url: str, table: str) -> None:
    source = sql(f"WITH gone AS (DELETE FROM {table} RETURNING id) SELECT * FROM gone",
                 postgres_url)
    with pytest.raises(SqlError):
        source.read()
    assert sql(f"SELECT * FROM {table}", postgres_url).count() == ROWS


def test_two_statements_are_refused(postgres_url: str, table: str) -> None:
    with pytest.raises(InvalidQueryError):
        sql(f"SELECT 1; DROP TABLE {table}", postgres_url)
    # Separators inside literals, identifiers, comments and dollar quotes are not statements.
    ok = sql("SELECT ';' AS \"a;\", $x$ ; $x$ AS b, E'\\'; ' AS c /* ; */ ; -- ;", postgres_url)
    assert ok.read().to_pylist() == [{"a;": ";", "b": " ; ", "c": "'; "}]


def test_a_password_never_appears_in_messages(postgres_url: str) -> None:
    secret = "pw-Zq81-secret"
    # Trust authentication accepts any password, so the connection itself succeeds.
    with_password = postgres_url.replace("postgres@", f"postgres:{secret}@", 1)
    source = sql("SELECT * FROM no_such_table", with_password)
    assert secret not in repr(source)
    with pytest.raises(SqlError) as failed_query:
        source.count()
    # Nothing listening there: a connection error.
    unreachable = with_password.rsplit(":", 1)[0] + ":1/postgres"
    with pytest.raises(SqlError) as failed_connection:
        sql("SELECT 1", unreachable).count()
    # A malformed URL makes libpq quote the offending part, here next to the password.
    malformed = postgres_url.replace("postgres@", f"postgres:{secret}%zz@", 1)
    with pytest.raises(SqlError) as failed_parse:
        sql("SELECT 1", malformed).count()
    in_params = f"{postgres_url}?password={secret}&connect_timeout=5"
    with pytest.raises(SqlError) as failed_param:
        sql("SELECT * FROM no_such_table", in_params).count()
    for info in (failed_query, failed_connection, failed_parse, failed_param):
        text = str(info.value)
        assert secret not in text and "***" in text, text
        cause = info.value.__cause__
        assert cause is None or secret not in str(cause), text
    assert "no_such_table" in str(failed_query.value)
