"""SQL database URLs: which database a URL names, where a SQLite file is, and how a URL is shown.

A URL is shown (repr, messages, logs) and stored (a dataset's manifest) only through
trainfeed.redaction.redact_url, the one redaction of trainfeed: passwords and tokens never leave
the process that was given them.
"""
from __future__ import annotations

import re
from urllib.parse import unquote

from trainfeed.redaction import redact_url

__all__ = ["SCHEMES", "dialect", "redact_url", "sqlite_path"]

#: URL schemes a SqlSource understands, and the database behind each.
SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql", "sqlite": "sqlite"}


def dialect(url: str) -> str:
    """The database behind ``url``; a ValueError for an unsupported scheme."""
    if "://" not in url:
        if not url:
            raise ValueError("empty SQL URL; expected e.g. postgresql://user@host:5432/db "
                             "or sqlite:///abs/path.db")
        return "sqlite"  # a plain path
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported SQL URL scheme {scheme!r} in {redact_url(url)!r}; "
                         f"expected one of {sorted(SCHEMES)}")
    return SCHEMES[scheme]


def sqlite_path(url: str) -> str:
    """The file a SQLite URL (or plain path) names."""
    if "://" not in url:
        return url
    # sqlite:///abs/path.db -> /abs/path.db; sqlite:////abs/path.db (SQLAlchemy's spelling of
    # an absolute path, and what f"sqlite:///{absolute_path}" gives) -> /abs/path.db as well.
    path = re.sub(r"^/+", "/", url.split("://", 1)[1])
    if not path or path == "/":
        raise ValueError(f"SQLite URL without a file: {redact_url(url)!r}; expected sqlite:///abs/path.db")
    return unquote(path)
