"""What a SQL source raises: one root (SqlError), whose messages name the database URL with its
secrets redacted (trainfeed.redaction) and the database's own error. The classes live in
trainfeed.errors with every other exception of trainfeed; this module re-exports them."""
from __future__ import annotations

from trainfeed.errors import InvalidQueryError, SqlError, UnknownColumnError

__all__ = ["InvalidQueryError", "SqlError", "UnknownColumnError"]
