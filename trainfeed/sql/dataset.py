"""SQL query results as datasets: the master leases hash buckets of a query's rows, and each
worker runs its bucket's query against the database itself (SQLFlow's design).

Registering a query writes a manifest (kind "sql") with the query, the database URL (never a
password or a token: trainfeed.redaction drops them, and workers take them from their own
environment, `PGPASSWORD` or `~/.pgpass`, as libpq does), the key columns that assign
rows to buckets, the number of buckets M (fixed, ≫ workers), the row count at registration and
feature statistics from a LIMIT-ed sample. Readers then use it like any dataset:
`dist.reader(name)` through a master, or locally with TRAIN_LOCAL.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from trainfeed.formats.manifest import (
    SQL_KIND,
    FieldSpec,
    Manifest,
    check_name_is_free,
    write_manifest,
)
from trainfeed.names import validate_dataset_name
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS
from trainfeed.redaction import redact_url
from trainfeed.sql.source import SqlSource
from trainfeed.storage import Storage, open_storage

__all__ = ["STATISTICS_SAMPLE_ROWS", "register_sql_dataset"]

# Rows sampled for the statistics stored with the dataset.
STATISTICS_SAMPLE_ROWS = 1000


def register_sql_dataset(name: str, source: SqlSource, storage: str | Storage | None = None,
                         num_partitions: int = DEFAULT_TARGET_PARTITIONS,
                         statistics_columns: Sequence[str] | None = None) -> Manifest:
    """Publishes `source` (a query on a database) as dataset `name`; returns its manifest.

    The query is counted and its columns and statistics taken now, so that a bad query, an
    unreachable database or an unknown key column fails here, with nothing published."""
    validate_dataset_name(name)
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be ≥ 1, got {num_partitions}")
    store = storage if isinstance(storage, Storage) else open_storage(storage)
    check_name_is_free(store, name)
    columns = source.columns()
    count = source.count()
    source.read_partition(0, num_partitions)  # the bucket query itself works (key columns)
    statistics = source.sample_statistics(statistics_columns, limit=STATISTICS_SAMPLE_ROWS)
    spec: dict[str, Any] = {"query": source.query, "url": redact_url(source.url, drop=True),
                            "key_columns": list(source.key_columns),
                            "num_partitions": num_partitions}
    fingerprint = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    manifest = Manifest(
        name=name, kind=SQL_KIND, fields=tuple(FieldSpec(c, "sql") for c in columns),
        label_field=None, num_records=count, num_bytes=0, shards=(), label_histogram={},
        fingerprint=fingerprint, source=source.query,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        extra={"sql": spec, "statistics": statistics})
    write_manifest(store, manifest)
    return manifest
