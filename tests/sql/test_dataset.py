"""SQL query results served through the master as hash buckets (embedded SQLite here; the
PostgreSQL variant is in tests/integration/test_sql_postgres_dataset.py)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from threaded_readers import ids_per_epoch

from trainfeed import LocalSource, dist
from trainfeed.errors import DatasetNotFoundError, TrainfeedError
from trainfeed.formats.manifest import read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.reader.reader import Reader
from trainfeed.sql import register_sql_dataset, sql
from trainfeed.storage import open_storage

ROWS = 500


def make_db(path: Path) -> str:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, name TEXT, value REAL)")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?)",
                       [(i, f"item-{i % 7}", i * 0.5 - 10) for i in range(ROWS)])
    return f"sqlite:///{path}"


def read_ids(reader: Reader) -> list[int]:
    return [row[0] for row in reader()]


def test_a_query_read_locally_gives_every_row_once(tmp_path: Path) -> None:
    url = make_db(tmp_path / "shop.db")
    storage = str(tmp_path / "storage")
    source = sql("SELECT id, name, value FROM orders WHERE value >= 0", url, key_columns=["id"])
    manifest = register_sql_dataset("orders", source, storage, num_partitions=16)
    expected = [i for i in range(ROWS) if i * 0.5 - 10 >= 0]
    assert manifest.kind == "sql" and manifest.num_records == len(expected)
    assert manifest.field_names == ("id", "name", "value")
    assert manifest.extra["statistics"]  # sampled feature statistics travel with the dataset
    reader = dist.reader("orders", source=LocalSource(storage=storage))
    first, second = read_ids(reader), read_ids(reader)
    assert sorted(first) == sorted(second) == expected
    assert first != second  # buckets are shuffled per epoch like any partitions


def test_readers_through_a_master_split_every_epoch_exactly_once(tmp_path: Path) -> None:
    url = make_db(tmp_path / "shop.db")
    storage = str(tmp_path / "storage")
    register_sql_dataset("orders", sql("SELECT * FROM orders", url), storage,
                         num_partitions=24)
    with MasterProcess(storage) as master:
        got = ids_per_epoch("orders", master.address, job="sql")
    assert sorted(got) == [0, 1]
    for epoch, counts in got.items():
        assert set(counts) == set(range(ROWS)) and max(counts.values()) == 1, epoch


def test_a_bad_query_fails_at_registration_and_publishes_nothing(tmp_path: Path) -> None:
    url = make_db(tmp_path / "shop.db")
    storage = str(tmp_path / "storage")
    with pytest.raises(TrainfeedError, match="no_such_table"):
        register_sql_dataset("bad", sql("SELECT * FROM no_such_table", url), storage)
    with pytest.raises(TrainfeedError, match="nope"):
        register_sql_dataset("bad", sql("SELECT * FROM orders", url, key_columns=["nope"]),
                             storage)
    with pytest.raises(DatasetNotFoundError):
        read_manifest(open_storage(storage), "bad")


def test_the_cli_registers_a_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.cli.main import main

    url = make_db(tmp_path / "shop.db")
    storage = str(tmp_path / "storage")
    assert main(["sql", "cheap", "--query", "SELECT id, name FROM orders WHERE value < 0",
                 "--db", url, "--key", "id", "--partitions", "8", "--storage", storage]) == 0
    assert "published 'cheap': 20 rows in 8 buckets, columns id, name" in capsys.readouterr().out
    cheap = dist.reader("cheap", source=LocalSource(storage=storage))
    assert sorted(read_ids(cheap)) == list(range(20))
    assert main(["sql", "broken", "--query", "SELECT nope FROM orders", "--db", url,
                 "--storage", storage]) == 2
    assert "nope" in capsys.readouterr().err
