"""A PostgreSQL query as a dataset: three readers through a master read every row exactly once
per epoch, each running its buckets' queries itself; and a table of arrays packed by the
training preprocessor straight from SQL."""
from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import psycopg
import pytest
from threaded_readers import ids_per_epoch

from trainfeed import LocalSource, dist
from trainfeed.master.serve.process import MasterProcess
from trainfeed.preprocess import training_preprocessor
from trainfeed.sql import register_sql_dataset, sql

pytestmark = pytest.mark.integration
ROWS = 3000


def test_three_readers_split_a_postgres_query_exactly_once_per_epoch(
        postgres_url: str, tmp_path: Path) -> None:
    table = f"events_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, kind text, score float8)")
        with db.cursor().copy(f"COPY {table} (id, kind, score) FROM STDIN") as copy:
            for i in range(ROWS):
                copy.write_row((i, ("click", "view", "buy")[i % 3], i / 7))
    storage = str(tmp_path / "storage")
    manifest = register_sql_dataset(
        "events", sql(f"SELECT id, kind, score FROM {table} WHERE score >= 0", postgres_url,
                      key_columns=["id"]), storage, num_partitions=32)
    assert manifest.num_records == ROWS
    assert manifest.extra["statistics"]["columns"]["kind"]["vocabulary"] == [
        "buy", "click", "view"]
    with MasterProcess(storage) as master:
        got = ids_per_epoch("events", master.address, job="pg")
    assert sorted(got) == [0, 1]
    for epoch, counts in got.items():
        assert set(counts) == set(range(ROWS)) and max(counts.values()) == 1, epoch


def test_the_training_preprocessor_reads_arrays_from_postgres(postgres_url: str,
                                                              tmp_path: Path) -> None:
    table = f"images_{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (52, 12))
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {table} (id int, rgb float8[], species text)")
        with db.cursor().copy(f"COPY {table} (id, rgb, species) FROM STDIN") as copy:
            for i in range(52):
                copy.write_row((i, [float(v) for v in pixels[i]], ("bird", "cat", "dog")[i % 3]))
    summary = training_preprocessor(sql(f"SELECT rgb, species FROM {table}", postgres_url),
                                    "packed_pg", "species", "rgb", normalizing_const=255.0,
                                    num_workers=3, storage=str(tmp_path))
    assert summary["num_buffers"] == 3 and summary["buffer_size"] == 18
    buffers = list(dist.reader("packed_pg", source=LocalSource(storage=str(tmp_path)))())
    got = np.concatenate([b["rgb"] for b in buffers]) * 255.0
    assert sorted(map(tuple, np.rint(got).astype(int))) == sorted(map(tuple, pixels))
