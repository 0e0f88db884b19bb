"""SQL query results as partitioned sources and as datasets (``pip install 'trainfeed[sql]'`` for
PostgreSQL; SQLite needs nothing extra).

The package's face; one module per concern underneath: `source` (SqlSource, `sql()`),
`statements` (exactly one statement), `urls` (schemes, SQLite paths; redaction is
trainfeed.redaction), `postgres` and `sqlite` (one session each), `arrays` (rows to Arrow,
numeric arrays to numpy), `statistics`, `dataset` (`register_sql_dataset`), `errors`.

Example:
    >>> from trainfeed.sql import sql
    >>> sql("SELECT id FROM t;", "postgresql://me:secret@db/x", key_columns=["id"])
    SqlSource(query='SELECT id FROM t;', url='postgresql://me:***@db/x', key_columns=('id',))
"""
from trainfeed.sql.dataset import register_sql_dataset
from trainfeed.sql.errors import InvalidQueryError, SqlError, UnknownColumnError
from trainfeed.sql.source import SqlSource, sql
from trainfeed.sql.urls import SCHEMES

__all__ = [
    "SCHEMES",
    "InvalidQueryError",
    "SqlError",
    "SqlSource",
    "UnknownColumnError",
    "register_sql_dataset",
    "sql",
]
