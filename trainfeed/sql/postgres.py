"""PostgreSQL through psycopg 3 (the `sql` extra, imported only when a session opens).

A session wraps the user's query as ``SELECT * FROM (<query>) AS q`` plus a partition filter
(``hashtext`` of the key values) or a ``LIMIT``, streams the rows through a server-side cursor in
binary where every column has a binary loader (numeric arrays load as numpy, see
trainfeed.sql.arrays) and converts each fetched batch to Arrow at once.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trainfeed.redaction import redact_url
from trainfeed.sql.arrays import (
    ARRAY_ELEMENT_TYPES,
    FETCH_ROWS,
    concat,
    register_numeric_array_loaders,
    to_arrow,
)

if TYPE_CHECKING:
    from psycopg import sql as pgsql

__all__ = ["CONNECT_TIMEOUT_S", "PostgresSession", "psycopg_error"]

logger = logging.getLogger(__name__)

# libpq waits forever for an unreachable server by default; a worker must rather fail its task.
# Used only when neither the URL nor PGCONNECT_TIMEOUT sets a timeout.
CONNECT_TIMEOUT_S = 30


def psycopg_error() -> type[Exception]:
    """psycopg's exception root, or a class nothing raises when psycopg is not installed."""
    try:
        import psycopg
    except ImportError:
        return _NeverRaised
    return psycopg.Error


class _NeverRaised(Exception):
    pass



class PostgresSession:
    """One psycopg connection running one query's wrapped statements (a context manager):
    read-only, with the settings that a value's text form depends on pinned."""

    def __init__(self, query: str, url: str):
        # In psycopg's query text '%' introduces a placeholder; the user's must stay literal.
        self._query = query.replace("%", "%%")
        self._url = url
        self._conn: Any = None
        self._columns: list[Any] | None = None

    def __enter__(self) -> PostgresSession:
        try:
            import psycopg
        except ImportError as exc:
            raise ImportError("PostgreSQL sources need psycopg 3: "
                              "pip install 'trainfeed[sql]'") from exc
        options: dict[str, Any] = {}
        if "connect_timeout" not in self._url and "PGCONNECT_TIMEOUT" not in os.environ:
            options["connect_timeout"] = CONNECT_TIMEOUT_S
        logger.debug("connecting to %s", redact_url(self._url))
        self._conn = psycopg.connect(self._url, **options)
        # The query only reads; a read-only transaction makes sure a CTE cannot write either.
        self._conn.read_only = True
        # Values are hashed in their text form, which depends on these settings (a worker
        # with PGTZ set differently would put timestamptz rows in other partitions): pin them.
        self._conn.execute(_PG_PINNED_SETTINGS)
        register_numeric_array_loaders(self._conn.adapters)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()  # nothing to commit: the transaction was read-only

    def _wrapped(self, head: str, tail: pgsql.Composable | None = None) -> pgsql.Composed:
        from psycopg import sql as pgsql

        parts: list[pgsql.Composable] = [pgsql.SQL(head + " FROM (\n"), pgsql.SQL(self._query),
                                         pgsql.SQL("\n) AS q")]
        if tail is not None:
            parts.append(tail)
        return pgsql.Composed(parts)

    def _description(self) -> list[Any]:
        """The result's column descriptions (the query run with ``LIMIT 0``), asked once per
        session: a partition read needs them both to check its keys and to pick the format."""
        if self._columns is None:
            with self._conn.cursor() as cur:
                cur.execute(self._wrapped("SELECT *", _pg_sql(" LIMIT 0")), ())
                self._columns = list(cur.description)
        return self._columns

    def columns(self) -> list[str]:
        return [d.name for d in self._description()]

    def column_types(self) -> dict[str, str]:
        """Each column's type OID named as ``pg_typeof`` prints it (``oid::regtype``)."""
        description = self._description()
        with self._conn.cursor() as cur:
            cur.execute("SELECT t::regtype::text FROM unnest(%s::oid[]) WITH ORDINALITY "
                        "AS u(t, i) ORDER BY i", ([d.type_code for d in description],))
            return {d.name: row[0] for d, row in zip(description, cur.fetchall())}

    def count(self) -> int:
        with self._conn.cursor() as cur:
            cur.execute(self._wrapped("SELECT COUNT(*)"), ())
            return int(cur.fetchone()[0])

    def select(self, *, limit: int | None = None, partition: tuple[int, int] | None = None,
               keys: Sequence[str] = ()) -> pa.Table:
        from psycopg import sql as pgsql

        params: tuple[int, ...] = ()
        tail: pgsql.Composable | None = None
        if partition is not None:
            m, num_partitions = partition
            tail = pgsql.SQL(" WHERE ({} + 2147483648) %% %s = %s").format(_pg_hash(keys))
            params = (int(num_partitions), int(m))
        elif limit is not None:
            tail, params = pgsql.SQL(" LIMIT %s"), (int(limit),)
        # A server-side cursor streams the rows in FETCH_ROWS batches instead of libpq
        # buffering the whole result before the first one is returned. Each batch becomes
        # Arrow at once, so the rows are never all held as Python objects.
        binary = self._binary_loadable()
        with self._conn.cursor(name="trainfeed_sql", binary=binary) as cur:
            cur.execute(self._wrapped("SELECT *", tail), params)
            description = cur.description
            names = [d.name for d in description]
            types = [_pg_arrow_type(d.type_code, d.precision, d.scale) for d in description]
            batches = []
            while rows := cur.fetchmany(FETCH_ROWS):
                batches.append(to_arrow(names, [list(c) for c in zip(*rows)], types,
                                         self._url))
        if not batches:
            return to_arrow(names, [[] for _ in names], types, self._url)
        return concat(batches, self._url)

    def _binary_loadable(self) -> bool:
        """Whether every result column has a binary loader: binary results are what lets
        numeric arrays load as numpy (see trainfeed.sql.arrays); a type without one (an enum,
        an extension's type) would load as raw bytes, so such a query stays in text."""
        from psycopg.pq import Format

        return all(self._conn.adapters.get_loader(d.type_code, Format.BINARY) is not None
                   for d in self._description())


_PG_PINNED_SETTINGS = (
    "SELECT set_config('TimeZone', 'UTC', false), set_config('DateStyle', 'ISO, MDY', false), "
    "set_config('IntervalStyle', 'postgres', false), "
    "set_config('extra_float_digits', '1', false), set_config('bytea_output', 'hex', false)"
)


def _pg_sql(text: str) -> pgsql.SQL:
    from psycopg import sql as pgsql

    return pgsql.SQL(text)


def _pg_hash(keys: Sequence[str]) -> pgsql.Composable:
    """``hashtext`` (int4, may be negative) of the key values, or of the whole row without keys.

    ``quote_nullable`` turns each value into a quoted literal, or ``NULL`` for a null: rows with
    a null key still get a partition, and ``('a,b', 'c')`` cannot collide with ``('a', 'b,c')``.
    The whole row is ``(q.*)::text``, not ``q::text``: a result column named ``q`` would win
    over the row. The caller adds 2**31 to make the hash non-negative before ``% M``.
    """
    from psycopg import sql as pgsql

    if not keys:
        return pgsql.SQL("hashtext((q.*)::text)::bigint")
    values = pgsql.SQL(", ").join(
        pgsql.SQL("quote_nullable({})").format(pgsql.Identifier("q", k)) for k in keys)
    return pgsql.SQL("hashtext(concat_ws(',', {})::text)::bigint").format(values)


# PostgreSQL type OIDs (pg_type.dat) -> Arrow types. Explicit types keep an empty partition's
# schema equal to a full one's; unlisted types are inferred from the values.
_PG_TYPES: dict[int, pa.DataType] = {
    16: pa.bool_(), 17: pa.binary(), 18: pa.string(), 19: pa.string(), 20: pa.int64(),
    21: pa.int16(), 23: pa.int32(), 25: pa.string(), 700: pa.float32(), 701: pa.float64(),
    1042: pa.string(), 1043: pa.string(), 1082: pa.date32(), 1114: pa.timestamp("us"),
    1184: pa.timestamp("us", tz="UTC"),
}
_PG_NUMERIC = 1700


def _pg_arrow_type(oid: int, precision: int | None, scale: int | None) -> pa.DataType | None:
    if oid == _PG_NUMERIC and precision is not None and 0 < precision <= 38:
        return pa.decimal128(precision, scale or 0)
    if oid in ARRAY_ELEMENT_TYPES:  # 1-D, the usual case; a batch of nested ones says so itself
        return pa.list_(pa.from_numpy_dtype(ARRAY_ELEMENT_TYPES[oid].newbyteorder("=")))
    return _PG_TYPES.get(oid)
