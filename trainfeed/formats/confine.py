"""The rule for a path a manifest names: relative, inside the dataset's folder, plain.

A manifest names files of its dataset (shards, payload indexes, sources files) by paths relative
to the dataset's folder, and the reader and the master open them because the manifest said so.
A manifest is a file anyone with write access to the storage can edit, so its paths are checked
at load, before anything is opened: a path that could point elsewhere (`..`, an absolute path,
a URL, a Windows path) is refused whole, never normalised into something that looks safe. The
paths trainfeed writes (`data/<fingerprint>/shard-00000.parquet`) always pass.

Where the file a checked path names is a symbolic link, the storage resolves it and confines
it (trainfeed.storage.Storage.local_file): this rule is about the text, that one about the file.
"""
from __future__ import annotations

import re

__all__ = ["MAX_PATH_CHARS", "path_problem"]

# Paths trainfeed writes are ~50 characters; 1,024 is far above any of them and keeps an error
# that quotes one short.
MAX_PATH_CHARS = 1024
# A URL scheme (`s3:`, `file:`, `http:`) or a Windows drive (`C:`): a colon at all is refused,
# since no path trainfeed writes has one and fsspec reads `a:b` as a protocol.
_COLON = ":"
# Control characters (NUL included): no written path has one, and they would reach logs raw.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def path_problem(path: object) -> str | None:
    """What is wrong with `path` as a path inside a dataset's folder, or None if nothing is.

    >>> path_problem("data/0123abcd/shard-00000.parquet") is None
    True
    >>> path_problem("../../etc/passwd")
    "it has a '..' component (it would leave the dataset's folder)"
    """
    if not isinstance(path, str):
        return f"it is a {type(path).__name__}, not a string"
    if not path:
        return "it is empty"
    if len(path) > MAX_PATH_CHARS:
        return f"it has {len(path)} characters (at most {MAX_PATH_CHARS})"
    if _CONTROL.search(path):
        return "it holds a control character (NUL, newline, ESC, ...)"
    if "\\" in path:
        return "it holds a backslash (paths in a manifest use '/')"
    if _COLON in path:
        return "it holds a ':' (a URL scheme or a drive: paths in a manifest are relative)"
    if path.startswith("/"):
        return "it is absolute (paths in a manifest are relative to the dataset's folder)"
    parts = path.split("/")
    if ".." in parts:
        return "it has a '..' component (it would leave the dataset's folder)"
    if "." in parts or "" in parts:
        return "it has an empty or '.' component"
    return None
