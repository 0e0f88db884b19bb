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

Supported databases (see :data:`SCHEMES`):

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
import logging
import os
import re
import sqlite3
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa

from trainfeed.errors import TrainfeedError
from trainfeed.sql_arrays import ARRAY_ELEMENT_TYPES, arrow_column, register_numeric_array_loaders

if TYPE_CHECKING:
    from psycopg import sql as pgsql

__all__ = [
    "SCHEMES",
    "InvalidQueryError",
    "SqlError",
    "SqlSource",
    "UnknownColumnError",
    "sql",
]

logger = logging.getLogger(__name__)

#: URL schemes a :class:`SqlSource` understands, and the database behind each.
SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql", "sqlite": "sqlite"}

# Rows fetched per round trip. 10,000 rows of a few columns is ~1 MB: large enough that the
# per-call overhead vanishes, small enough that a server-side cursor keeps client memory flat.
FETCH_ROWS = 10_000

# libpq waits forever for an unreachable server by default; a worker must rather fail its task.
# Used only when neither the URL nor PGCONNECT_TIMEOUT sets a timeout.
CONNECT_TIMEOUT_S = 30

# Quantile buckets in sample_statistics: deciles, the usual default of SQLFlow's BUCKETIZE.
NUM_BUCKETS = 10

# Shown in messages instead of a password.
_REDACTED = "***"

# SQLite caps a function's arguments (SQLITE_MAX_FUNCTION_ARG, 127 by default); wider keys are
# hashed in chunks whose hashes are hashed again.
_SQLITE_MAX_ARGS = 100
_SQLITE_HASH = "trainfeed_hash"


class SqlError(TrainfeedError):
    """A query or connection failed; the message names the database URL (never its password)
    and the database's own error."""


class InvalidQueryError(SqlError, ValueError):
    """The query is not exactly one statement (empty, or several separated by ``;``)."""


class UnknownColumnError(SqlError, LookupError):
    """A key or statistics column that the query's result does not have."""


# --------------------------------------------------------------------------------------------
# the source


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
        _dialect(self.url)  # an unsupported scheme fails now, not on the first read
        _single_statement(self.query, self.url)
        keys = (self.key_columns,) if isinstance(self.key_columns, str) else self.key_columns
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not key or "\x00" in key:
                raise ValueError(f"key column names must be non-empty strings, got {key!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"key_columns lists a column twice: {list(keys)}")
        object.__setattr__(self, "key_columns", keys)  # a list in, a (hashable) tuple stored

    def __repr__(self) -> str:
        return (f"SqlSource(query={self.query!r}, url={_redact(self.url)!r}, "
                f"key_columns={self.key_columns!r})")

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return _dialect(self.url)

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
            assert isinstance(session, _PostgresSession)
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
            return _concat(parts, self.url)
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
        _check_partition(m, num_partitions)
        with self._session() as session:
            names = session.columns()
            missing = [k for k in self.key_columns if k not in names]
            if missing:
                raise UnknownColumnError(
                    f"key column(s) {missing} are not columns of the query's result "
                    f"{names} (on {_redact(self.url)}); names are matched exactly, after the "
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
                f"(on {_redact(self.url)})")
        return {"version": 1, "sample_rows": table.num_rows,
                "columns": {c: _describe(table.column(c)) for c in wanted}}

    # --- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self) -> Iterator[_Session]:
        query = _single_statement(self.query, self.url)
        session: _Session
        if self.dialect == "postgresql":
            session = _PostgresSession(query, self.url)
        else:
            session = _SqliteSession(query, self.url)
        try:
            with session:
                yield session
        except SqlError:
            raise
        except (sqlite3.Error, _psycopg_error()) as exc:
            message = _scrub(str(exc).strip(), self.url)
            first_line = " ".join(query.split())
            if len(first_line) > 200:
                first_line = first_line[:200] + "…"
            err = SqlError(f"SQL query failed on {_redact(self.url)}: {message}\n"
                           f"  query: {first_line}")
            # The driver's own exception can quote the connection string; then drop it.
            raise err from (None if _scrub(str(exc), self.url) != str(exc) else exc)


def sql(query: str, url: str, key_columns: Sequence[str] = ()) -> SqlSource:
    """The result of ``query`` on the database at ``url`` as a partitioned source.

    >>> sql("SELECT id FROM t;", "postgresql://me:secret@db/x", key_columns=["id"])
    SqlSource(query='SELECT id FROM t;', url='postgresql://me:***@db/x', key_columns=('id',))
    """
    return SqlSource(query, url, tuple(key_columns))


# --------------------------------------------------------------------------------------------
# URLs


def _dialect(url: str) -> str:
    """The database behind ``url``; a ValueError for an unsupported scheme."""
    if "://" not in url:
        if not url:
            raise ValueError("empty SQL URL; expected e.g. postgresql://user@host:5432/db "
                             "or sqlite:///abs/path.db")
        return "sqlite"  # a plain path
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported SQL URL scheme {scheme!r} in {_redact(url)!r}; "
                         f"expected one of {sorted(SCHEMES)}")
    return SCHEMES[scheme]


def _redact(url: str) -> str:
    """``url`` with any password (in the user info or a ``password=`` parameter) replaced."""
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    netloc, tail = _split_netloc(rest)
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:{_REDACTED}@{hosts}"
    tail = re.sub(r"(?i)([?&]password=)[^&#]*", rf"\g<1>{_REDACTED}", tail)
    return f"{scheme}://{netloc}{tail}"


def _split_netloc(rest: str) -> tuple[str, str]:
    """Split what follows ``scheme://`` into (netloc, path-and-query)."""
    match = re.search(r"[/?#]", rest)
    if match is None:
        return rest, ""
    return rest[: match.start()], rest[match.start():]


def _passwords(url: str) -> list[str]:
    """Every form in which ``url``'s passwords could show up in a driver message."""
    found: list[str] = []
    if "://" in url:
        netloc = _split_netloc(url.split("://", 1)[1])[0]
        userinfo, at, _ = netloc.rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
    found += re.findall(r"(?i)[?&]password=([^&#]*)", url)
    found = [p for p in found if p]
    return sorted({*found, *(unquote(p) for p in found)}, key=len, reverse=True)


def _scrub(message: str, url: str) -> str:
    for password in _passwords(url):
        message = message.replace(password, _REDACTED)
    return message


def _sqlite_path(url: str) -> str:
    if "://" not in url:
        return url
    # sqlite:///abs/path.db -> /abs/path.db; sqlite:////abs/path.db (SQLAlchemy's spelling of
    # an absolute path, and what f"sqlite:///{absolute_path}" gives) -> /abs/path.db as well.
    path = re.sub(r"^/+", "/", url.split("://", 1)[1])
    if not path or path == "/":
        raise ValueError(f"SQLite URL without a file: {url!r}; expected sqlite:///abs/path.db")
    return unquote(path)


# --------------------------------------------------------------------------------------------
# the one statement


def _single_statement(query: str, url: str) -> str:
    """``query`` without trailing ``;``, blanks and comments; an InvalidQueryError unless it is
    exactly one statement.

    A small lexer skips string literals, quoted identifiers, comments and (PostgreSQL)
    dollar-quoted strings, so a ``;`` inside them is not taken for a separator. The database
    re-checks anyway: the statement runs as a subquery, where a second statement is a syntax
    error.
    """
    postgres = _dialect(url) == "postgresql"
    end: int | None = None  # where the first top-level ';' is
    has_code = False
    i, n = 0, len(query)
    while i < n:
        c = query[i]
        start = i
        if c.isspace():
            i += 1
            continue
        if query.startswith("--", i):
            newline = query.find("\n", i)
            i = n if newline < 0 else newline + 1
            continue
        if query.startswith("/*", i):
            i = _skip_block_comment(query, i, nested=postgres)
            continue
        if c == ";":
            if end is None:
                end = i
            i += 1
            continue
        # Anything else is statement text: after a top-level ';' it is a second statement.
        if end is not None:
            raise InvalidQueryError(
                f"expected a single SQL statement, got more than one (a ';' at offset {end} is "
                f"followed by {query[start:start + 40]!r}); run one query per source")
        has_code = True
        if c in "'\"`" or (c == "[" and not postgres):
            close = "]" if c == "[" else c
            backslash = (postgres and c == "'" and i > 0 and query[i - 1] in "eE"
                         and not (i > 1 and (query[i - 2].isalnum() or query[i - 2] == "_")))
            i = _skip_quoted(query, i + 1, close, backslash=backslash)
        elif postgres and c == "$" and not (i > 0 and (query[i - 1].isalnum()
                                                       or query[i - 1] in "_$")):
            tag = re.match(r"\$(?:[A-Za-z_\x80-\U0010ffff][\w\x80-\U0010ffff]*)?\$", query[i:])
            if tag is None:
                i += 1  # a parameter like $1
            else:
                close_at = query.find(tag.group(), i + len(tag.group()))
                i = n if close_at < 0 else close_at + len(tag.group())
        else:
            i += 1
    if not has_code:
        raise InvalidQueryError(f"empty SQL query {query!r}; expected one SELECT statement")
    return (query if end is None else query[:end]).strip()


def _skip_quoted(query: str, i: int, close: str, *, backslash: bool) -> int:
    """Index after the literal or identifier whose body starts at ``i``; doubled closing
    quotes (and, in PostgreSQL E'' strings, backslashes) escape."""
    n = len(query)
    while i < n:
        c = query[i]
        if backslash and c == "\\":
            i += 2
            continue
        if c == close:
            if close != "]" and i + 1 < n and query[i + 1] == close:
                i += 2
                continue
            return i + 1
        i += 1
    return n  # unterminated: the database reports it


def _skip_block_comment(query: str, i: int, *, nested: bool) -> int:
    depth, i, n = 1, i + 2, len(query)
    while i < n and depth:
        if nested and query.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif query.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _check_partition(m: int, num_partitions: int) -> None:
    for name, value in (("m", m), ("num_partitions", num_partitions)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be ≥ 1, got {num_partitions}")
    if not 0 <= m < num_partitions:
        raise ValueError(f"partition m={m} is outside [0, {num_partitions})")


# --------------------------------------------------------------------------------------------
# sessions: one connection, the wrapped statements, rows to Arrow


class _Session(Protocol):
    """One connection to the database, used for a single public call (a context manager)."""

    def __enter__(self) -> _Session: ...

    def __exit__(self, *exc: object) -> None: ...

    def columns(self) -> list[str]: ...

    def count(self) -> int: ...

    def select(self, *, limit: int | None = None, partition: tuple[int, int] | None = None,
               keys: Sequence[str] = ()) -> pa.Table:
        """``SELECT * FROM (<query>) AS q``, optionally one partition (hashing ``keys``, or all
        columns when empty) or the first ``limit`` rows."""
        ...


def _psycopg_error() -> type[Exception]:
    """psycopg's exception root, or a class nothing raises when psycopg is not installed."""
    try:
        import psycopg
    except ImportError:
        return _NeverRaised
    return psycopg.Error


class _NeverRaised(Exception):
    pass


class _PostgresSession:
    def __init__(self, query: str, url: str):
        # In psycopg's query text '%' introduces a placeholder; the user's must stay literal.
        self._query = query.replace("%", "%%")
        self._url = url
        self._conn: Any = None
        self._columns: list[Any] | None = None

    def __enter__(self) -> _PostgresSession:
        try:
            import psycopg
        except ImportError as exc:
            raise ImportError("PostgreSQL sources need psycopg 3: "
                              "pip install 'trainfeed[sql]'") from exc
        options: dict[str, Any] = {}
        if "connect_timeout" not in self._url and "PGCONNECT_TIMEOUT" not in os.environ:
            options["connect_timeout"] = CONNECT_TIMEOUT_S
        logger.debug("connecting to %s", _redact(self._url))
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
                batches.append(_to_arrow(names, [list(c) for c in zip(*rows)], types,
                                         self._url))
        if not batches:
            return _to_arrow(names, [[] for _ in names], types, self._url)
        return _concat(batches, self._url)

    def _binary_loadable(self) -> bool:
        """Whether every result column has a binary loader: binary results are what lets
        numeric arrays load as numpy (see trainfeed.sql_arrays); a type without one (an enum,
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


class _SqliteSession:
    def __init__(self, query: str, url: str):
        self._query = query
        self._url = url
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> _SqliteSession:
        path = _sqlite_path(self._url)
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
        return _to_arrow(names, values, [None] * len(names), self._url)


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


def _to_arrow(names: list[str], values: list[list[Any]], types: list[pa.DataType | None],
              url: str) -> pa.Table:
    arrays = []
    for name, column, type_ in zip(names, values, types):
        try:
            arrays.append(arrow_column(column, type_))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise _unconvertible(name, url, exc) from None
    return pa.Table.from_arrays(arrays, names=names)


def _concat(batches: list[pa.Table], url: str) -> pa.Table:
    """Fetched batches as one table (chunked, not copied). A column whose type was inferred may
    be all-null in one batch: "permissive" promotes that to the other batches' type."""
    try:
        return pa.concat_tables(batches, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        name = next((n for n in batches[0].column_names
                     if len({b.schema.field(n).type for b in batches} - {pa.null()}) > 1), "?")
        raise _unconvertible(name, url, exc) from None


def _unconvertible(name: str, url: str, exc: Exception) -> SqlError:
    return SqlError(
        f"column {name!r} of the query on {_redact(url)} cannot be converted to Arrow ({exc}); "
        f"it probably mixes types (or array dimensions) or has a type Arrow does not know: "
        f"CAST it in the query")


# --------------------------------------------------------------------------------------------
# statistics


def _describe(column: pa.ChunkedArray) -> dict[str, Any]:
    type_ = column.type
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        values = [v for v in column.to_pylist() if v is not None]
        return {"kind": "string", "count": len(values), "vocabulary": sorted(set(values))}
    if pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        numbers = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        numbers = numbers[~np.isnan(numbers)]  # nulls became NaN
        if numbers.size == 0:
            return {"kind": "numeric", "count": 0, "min": None, "max": None, "mean": None,
                    "bucket_boundaries": []}
        low, high = numbers.min(), numbers.max()
        whole = pa.types.is_integer(type_)
        quantiles = np.quantile(numbers, np.arange(1, NUM_BUCKETS) / NUM_BUCKETS)
        return {"kind": "numeric", "count": int(numbers.size),
                "min": int(low) if whole else float(low),
                "max": int(high) if whole else float(high),
                "mean": float(numbers.mean()),
                "bucket_boundaries": [float(b) for b in np.unique(quantiles)]}
    return {"kind": "other", "count": len(column) - column.null_count, "type": str(type_)}
