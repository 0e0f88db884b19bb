"""SQL query results as partitioned sources (SQLFlow's design: the database does the splitting).

A :class:`SqlSource` is a query plus the database it runs on. Instead of exporting the result
once, each reader asks the database for one *partition*: the rows whose key hash modulo ``M`` is
``m``. The partitions of one query are disjoint and cover its result, whatever ``M`` is, so the
master can lease partition numbers like any other task and every worker runs its own, smaller
query. Nothing is copied out of the database ahead of time.

The user's query is never edited, only wrapped as a subquery::

    SELECT * FROM (<query>) AS q WHERE <hash of the key columns> % M = m

Key columns are quoted identifiers, ``m`` and ``M`` are bound parameters; nothing the caller
passes is pasted into SQL text except the query itself, which must be one statement.

Supported databases (see :data:`trainfeed.sql.urls.SCHEMES`):

* PostgreSQL, ``postgresql://user@host:port/dbname`` (or ``postgres://``), through psycopg 3
  (``pip install 'trainfeed[sql]'``). Everything libpq reads from the environment
  (``PGPASSWORD``, ``PGPASSFILE``, ``PGSSLMODE``, …) applies, which is how a password should
  reach workers: a password in the URL works but travels wherever the URL does. The hash is
  ``hashtext`` over the key values, stable for a given server.
* SQLite, ``sqlite:///abs/path.db`` or a plain path, through the standard library. SQLite has no
  hash function, so a deterministic one (CRC-32 of the values' ``repr``) is registered on each
  connection.

A source holds no connection: every call connects, runs one statement in a read-only
transaction and disconnects. That makes a source a plain value (picklable, hashable, safe to use
from any thread or process) at the cost of one connection per call, which is small next to
reading a partition.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from trainfeed.redaction import redact_url, scrub
from trainfeed.sql.arrays import concat
from trainfeed.sql.errors import SqlError, UnknownColumnError
from trainfeed.sql.postgres import PostgresSession, psycopg_error
from trainfeed.sql.sqlite import SqliteSession
from trainfeed.sql.statements import single_statement
from trainfeed.sql.statistics import describe
from trainfeed.sql.urls import dialect

__all__ = ["Session", "SqlSource", "check_partition", "sql"]


class Session(Protocol):
    """One connection to the database, used for a single public call (a context manager)."""

    def __enter__(self) -> Session: ...

    def __exit__(self, *exc: object) -> None: ...

    def columns(self) -> list[str]: ...

    def count(self) -> int: ...

    def select(self, *, limit: int | None = None, partition: tuple[int, int] | None = None,
               keys: Sequence[str] = ()) -> pa.Table:
        """``SELECT * FROM (<query>) AS q``, optionally one partition (hashing ``keys``, or all
        columns when empty) or the first ``limit`` rows."""
        ...


@dataclass(frozen=True, repr=False)
class SqlSource:
    """The result of one SQL query, readable whole or as ``M`` disjoint hash partitions.

    Args:
        query: A single SELECT (or WITH/VALUES) statement; one trailing ``;`` is allowed.
        url: ``postgresql://user@host:port/dbname`` or ``sqlite:///abs/path.db`` (a plain path
            is SQLite).
        key_columns: Result columns whose values decide a row's partition. Rows with equal
            keys always land in the same partition. ``()`` hashes the whole row.

    Partitions are computed by the database on every call, so they are stable only while the
    data is: rows inserted between two reads of an epoch show up in whichever partition they
    hash to. The key columns must be deterministic too (without ``key_columns``, every
    column): a row containing ``random()`` or ``now()`` hashes differently on every call, and
    would be read twice or not at all.

    The password of ``url`` never appears in ``repr()`` or in error messages.
    """

    query: str
    url: str
    key_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.query, str):
            raise TypeError(f"query must be a str, got {type(self.query).__name__}")
        if not isinstance(self.url, str):
            raise TypeError(f"url must be a str, got {type(self.url).__name__}")
        dialect(self.url)  # an unsupported scheme fails now, not on the first read
        single_statement(self.query, dialect(self.url))
        keys = (self.key_columns,) if isinstance(self.key_columns, str) else self.key_columns
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not key or "\x00" in key:
                raise ValueError(f"key column names must be non-empty strings, got {key!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"key_columns lists a column twice: {list(keys)}")
        object.__setattr__(self, "key_columns", keys)  # a list in, a (hashable) tuple stored

    def __repr__(self) -> str:
        return (f"SqlSource(query={self.query!r}, url={redact_url(self.url)!r}, "
                f"key_columns={self.key_columns!r})")

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return dialect(self.url)

    # --- reading -----------------------------------------------------------------------------

    def columns(self) -> list[str]:
        """The result's column names, in query order (runs the query with ``LIMIT 0``)."""
        with self._session() as session:
            return session.columns()

    def count(self) -> int:
        """The number of rows in the result: ``SELECT COUNT(*) FROM (<query>) AS q``."""
        with self._session() as session:
            return session.count()

    def column_types(self) -> dict[str, str]:
        """The result's column types as PostgreSQL names them (``pg_typeof``: 'integer',
        'double precision[]' …); empty for SQLite, whose results carry no column types."""
        if self.dialect != "postgresql":
            return {}
        with self._session() as session:
            assert isinstance(session, PostgresSession)
            return session.column_types()

    def read(self, parallel: int = 1) -> pa.Table:
        """The whole result as an Arrow table, columns in query order.

        With ``parallel > 1`` and key columns, the result is read as that many hash partitions
        over as many connections at once (each its own server process), which is faster on a
        multi-core server but gives the rows partition by partition, not in the query's order.
        Otherwise rows come in the database's order, over one connection. Each fetched batch
        is converted as it arrives; use :meth:`read_partition` for results larger than memory.
        """
        if parallel > 1 and self.key_columns:
            with concurrent.futures.ThreadPoolExecutor(parallel, "trainfeed-sql") as pool:
                parts = list(pool.map(lambda m: self.read_partition(m, parallel),
                                      range(parallel)))
            return concat(parts, self.url)
        with self._session() as session:
            return session.select()

    def read_partition(self, m: int, num_partitions: int) -> pa.Table:
        """Partition ``m`` of ``num_partitions``: the rows whose key hash modulo
        ``num_partitions`` is ``m``.

        For a fixed ``num_partitions`` the partitions ``0 … num_partitions-1`` are disjoint and
        their union is exactly :meth:`read`'s rows. The assignment is deterministic: the same
        row goes to the same partition on every call and from every worker.

        Raises:
            ValueError: ``num_partitions < 1`` or ``m`` outside ``[0, num_partitions)``.
            UnknownColumnError: a key column is not a column of the result.
            SqlError: the query failed.
        """
        check_partition(m, num_partitions)
        with self._session() as session:
            names = session.columns()
            missing = [k for k in self.key_columns if k not in names]
            if missing:
                raise UnknownColumnError(
                    f"key column(s) {missing} are not columns of the query's result "
                    f"{names} (on {redact_url(self.url)}); names are matched exactly, after the "
                    f"database folds unquoted names (PostgreSQL: to lower case)")
            return session.select(partition=(m, num_partitions), keys=self.key_columns)

    def sample_statistics(self, columns: Sequence[str] | None = None,
                          limit: int = 1000) -> dict[str, Any]:
        """Feature statistics from the first ``limit`` rows (``LIMIT``, no ordering: cheap on
        any table, and what SQLFlow derives its feature columns from).

        Returns a JSON-serializable dict::

            {"version": 1, "sample_rows": 1000, "columns": {
                "name":  {"kind": "string", "count": 998, "vocabulary": ["a", "b"]},
                "price": {"kind": "numeric", "count": 1000, "min": 0.5, "max": 99.0,
                          "mean": 41.2, "bucket_boundaries": [5.0, 10.5, …]},
                "flag":  {"kind": "other", "count": 1000, "type": "bool"}}}

        ``count`` is the number of non-null values (NaN counts as null). ``vocabulary`` is the
        sorted set of distinct values. ``bucket_boundaries`` are the sample's deciles (the 9 cut
        points that split it into 10 equal-frequency buckets, as
        ``tf.feature_column.bucketized_column`` takes them), deduplicated, so a column with few
        distinct values gets fewer. Integer columns report ``min``/``max`` as ints.

        Args:
            columns: The columns to describe; None means all.
            limit: Rows sampled.

        Raises:
            UnknownColumnError: a requested column is not in the result.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        with self._session() as session:
            table = session.select(limit=limit)
        names = table.column_names
        wanted = list(names) if columns is None else list(columns)
        missing = [c for c in wanted if c not in names]
        if missing:
            raise UnknownColumnError(
                f"column(s) {missing} are not columns of the query's result {names} "
                f"(on {redact_url(self.url)})")
        return {"version": 1, "sample_rows": table.num_rows,
                "columns": {c: describe(table.column(c)) for c in wanted}}

    # --- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self) -> Iterator[Session]:
        query = single_statement(self.query, self.dialect)
        session: Session
        if self.dialect == "postgresql":
            session = PostgresSession(query, self.url)
        else:
            session = SqliteSession(query, self.url)
        try:
            with session:
                yield session
        except SqlError:
            raise
        except (sqlite3.Error, psycopg_error()) as exc:
            message = scrub(str(exc).strip(), self.url)
            first_line = " ".join(query.split())
            if len(first_line) > 200:
                first_line = first_line[:200] + "…"
            err = SqlError(f"SQL query failed on {redact_url(self.url)}: {message}\n"
                           f"  query: {first_line}")
            # The driver's own exception can quote the connection string; then drop it.
            raise err from (None if scrub(str(exc), self.url) != str(exc) else exc)


def sql(query: str, url: str, key_columns: Sequence[str] = ()) -> SqlSource:
    """The result of ``query`` on the database at ``url`` as a partitioned source.

    >>> sql("SELECT id FROM t;", "postgresql://me:secret@db/x", key_columns=["id"])
    SqlSource(query='SELECT id FROM t;', url='postgresql://me:***@db/x', key_columns=('id',))
    """
    return SqlSource(query, url, tuple(key_columns))


def check_partition(m: int, num_partitions: int) -> None:
    """A TypeError or ValueError unless ``0 ≤ m < num_partitions`` are ints."""
    for name, value in (("m", m), ("num_partitions", num_partitions)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be ≥ 1, got {num_partitions}")
    if not 0 <= m < num_partitions:
        raise ValueError(f"partition m={m} is outside [0, {num_partitions})")

