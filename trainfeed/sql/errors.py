"""What a SQL source raises: one root (SqlError), whose messages name the database URL with its
secrets redacted (trainfeed.redaction) and the database's own error."""
from __future__ import annotations

from trainfeed.errors import TrainfeedError

__all__ = ["InvalidQueryError", "SqlError", "UnknownColumnError"]


class SqlError(TrainfeedError):
    """A query or connection failed; the message names the database URL (never its password)
    and the database's own error."""


class InvalidQueryError(SqlError, ValueError):
    """The query is not exactly one statement (empty, or several separated by ``;``)."""


class UnknownColumnError(SqlError, LookupError):
    """A key or statistics column that the query's result does not have."""
