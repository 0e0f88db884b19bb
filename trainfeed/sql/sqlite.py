"""SQLite through the standard library: read-only connections to a database file.

SQLite has no hash function, so a deterministic one (CRC-32 of the values' ``repr``) is
registered on each connection as ``trainfeed_hash``; partition ``m`` of ``M`` is the rows whose
hash modulo ``M`` is ``m``.
"""
from __future__ import annotations

import os
import sqlite3
import zlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from trainfeed.sql.arrays import FETCH_ROWS, to_arrow
from trainfeed.sql.urls import sqlite_path

__all__ = ["SqliteSession"]

# SQLite caps a function's arguments (SQLITE_MAX_FUNCTION_ARG, 127 by default); wider keys are
# hashed in chunks whose hashes are hashed again.
_SQLITE_MAX_ARGS = 100
_SQLITE_HASH = "trainfeed_hash"


class SqliteSession:
    """One read-only connection to a SQLite file running one query's wrapped statements (a
    context manager), with the deterministic hash function registered."""

    def __init__(self, query: str, url: str):
        self._query = query
        self._url = url
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> SqliteSession:
        path = sqlite_path(self._url)
        # Read-only: a missing file is an error rather than a new empty database.
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, timeout=30)
        self._conn.create_function(_SQLITE_HASH, -1, _sqlite_hash, deterministic=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()

    def _run(self, statement: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        assert self._conn is not None
        return self._conn.execute(statement, params)

    def _wrapped(self, head: str) -> str:
        return f"{head} FROM (\n{self._query}\n) AS q"

    def columns(self) -> list[str]:
        return [d[0] for d in self._run(self._wrapped("SELECT *") + " LIMIT 0").description]

    def count(self) -> int:
        return int(self._run(self._wrapped("SELECT COUNT(*)")).fetchone()[0])

    def select(self, *, limit: int | None = None, partition: tuple[int, int] | None = None,
               keys: Sequence[str] = ()) -> pa.Table:
        statement = self._wrapped("SELECT *")
        params: tuple[int, ...] = ()
        if partition is not None:
            m, num_partitions = partition
            statement += f" WHERE {_sqlite_hash_expr(list(keys) or self.columns())} % ? = ?"
            params = (int(num_partitions), int(m))
        elif limit is not None:
            statement += " LIMIT ?"
            params = (int(limit),)
        cur = self._run(statement, params)
        names = [d[0] for d in cur.description]
        values: list[list[Any]] = [[] for _ in names]
        while rows := cur.fetchmany(FETCH_ROWS):
            for column, cells in zip(values, zip(*rows)):
                column.extend(cells)
        return to_arrow(names, values, [None] * len(names), self._url)


def _sqlite_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_hash_expr(keys: Sequence[str]) -> str:
    args = [f"q.{_sqlite_quote(k)}" for k in keys]
    while len(args) > _SQLITE_MAX_ARGS:
        args = [f"{_SQLITE_HASH}({', '.join(args[i:i + _SQLITE_MAX_ARGS])})"
                for i in range(0, len(args), _SQLITE_MAX_ARGS)]
    return f"{_SQLITE_HASH}({', '.join(args)})"


def _sqlite_hash(*values: Any) -> int:
    """A deterministic, non-negative hash of SQLite values (never Python's salted ``hash``).

    ``repr`` keeps types apart (``1`` vs ``'1'`` vs ``1.0``) and NULL (``None``) hashes too.
    """
    return zlib.crc32(repr(values).encode("utf-8", "surrogatepass"))
