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
        blank_end = _skip_blank(query, i, postgres)
        if blank_end is not None:
            i = blank_end
            continue
        if query[i] == ";":
            if end is None:
                end = i
            i += 1
            continue
        # Anything else is statement text: after a top-level ';' it is a second statement.
        if end is not None:
            raise InvalidQueryError(
                f"expected a single SQL statement, got more than one (a ';' at offset {end} is "
                f"followed by {query[i:i + 40]!r}); run one query per source")
        has_code = True
        i = _skip_code(query, i, postgres)
    if not has_code:
        raise InvalidQueryError(f"empty SQL query {query!r}; expected one SELECT statement")
    return (query if end is None else query[:end]).strip()


def _skip_blank(query: str, i: int, postgres: bool) -> int | None:
    """Index after the blank character or the comment at ``i``; None if neither starts there."""
    if query[i].isspace():
        return i + 1
    if query.startswith("--", i):
        newline = query.find("\n", i)
        return len(query) if newline < 0 else newline + 1
    if query.startswith("/*", i):
        return _skip_block_comment(query, i, nested=postgres)
    return None


def _skip_code(query: str, i: int, postgres: bool) -> int:
    """Index after the statement text at ``i``: a whole string literal, quoted identifier or
    (PostgreSQL) dollar-quoted string, else one character."""
    c = query[i]
    if c in "'\"`" or (c == "[" and not postgres):
        close = "]" if c == "[" else c
        backslash = postgres and c == "'" and _follows_word(query, i, "eE")
        return _skip_quoted(query, i + 1, close, backslash=backslash)
    if postgres and c == "$" and not _after_word(query, i, "_$"):
        return _skip_dollar_quoted(query, i)
    return i + 1


def _after_word(query: str, i: int, also: str) -> bool:
    """Whether the character before ``i`` is alphanumeric or one of ``also``."""
    return i > 0 and (query[i - 1].isalnum() or query[i - 1] in also)


def _follows_word(query: str, i: int, prefix: str) -> bool:
    """Whether ``query[i]`` follows a one-letter word among ``prefix`` (the E of E'...')."""
    return i > 0 and query[i - 1] in prefix and not _after_word(query, i - 1, "_")


def _skip_dollar_quoted(query: str, i: int) -> int:
    """Index after the $tag$...$tag$ string at ``i`` (the end of the query if it is
    unterminated), or after the ``$`` of a parameter like $1."""
    tag = re.match(r"\$(?:[A-Za-z_\x80-\U0010ffff][\w\x80-\U0010ffff]*)?\$", query[i:])
    if tag is None:
        return i + 1  # a parameter like $1
    close_at = query.find(tag.group(), i + len(tag.group()))
    return len(query) if close_at < 0 else close_at + len(tag.group())


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
