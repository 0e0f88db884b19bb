"""Exactly one SQL statement: a small lexer that finds the top-level `;` of a query.

A query is run wrapped as a subquery, so it must be a single statement. Splitting on `;` is
wrong wherever a `;` sits in a string literal, a quoted identifier, a comment or (PostgreSQL) a
dollar-quoted body; this lexer skips those, per dialect (PostgreSQL nests block comments and
has E'' strings with backslash escapes and $tag$ quoting; SQLite has `[identifiers]`).
"""
from __future__ import annotations

import re

from trainfeed.sql.errors import InvalidQueryError

__all__ = ["single_statement"]


def single_statement(query: str, dialect: str) -> str:
    """``query`` without trailing ``;``, blanks and comments; an InvalidQueryError unless it is
    exactly one statement.

    A small lexer skips string literals, quoted identifiers, comments and (PostgreSQL)
    dollar-quoted strings, so a ``;`` inside them is not taken for a separator. The database
    re-checks anyway: the statement runs as a subquery, where a second statement is a syntax
    error.
    """
    postgres = dialect == "postgresql"
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
