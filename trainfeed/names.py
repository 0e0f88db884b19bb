"""Validation of the names users give datasets and jobs.

Names become folder names in storage and keys in the master's state, so they must not be able to
climb out of their folder (`..`, absolute paths, backslashes) or smuggle separators into URLs.
"""
from __future__ import annotations

import re

from trainfeed.errors import InvalidNameError

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# One optional namespace: "public/digits". Deeper nesting has no use and widens the attack surface.
_MAX_SEGMENTS = 2
PUBLIC_NAMESPACE = "public"
# What a dataset's folder holds besides nested datasets (trainfeed.formats.manifest's layout):
# `manifest.json`, `versions/<n>.json`, `data/<fingerprint>/` (shards, progress records,
# `sources.parquet`, `_slices/`) and `transformers/<name>.json` (trainfeed.reader.transforms);
# `.upload.lock` starts with a dot and is no name anyway. A new dataset's second segment may not
# be one of them (compared case-blind, for case-insensitive filesystems): `flowers/data` lay in
# dataset `flowers`' data folder, and `flowers`' next upload deleted its manifest as stale data.
# tests/test_names.py checks each internal name is here.
RESERVED_SEGMENTS = frozenset({"data", "manifest.json", "transformers", "versions"})


def validate_dataset_name(name: str) -> str:
    """Returns `name` if it is a valid dataset name, else raises InvalidNameError.

    A name is one or two `/`-separated segments of letters, digits, `.`, `_`, `-`, each starting
    with a letter or digit and not made only of dots: `flowers`, `public/digits`.
    """
    segments = name.split("/") if isinstance(name, str) else []
    if (not segments or len(segments) > _MAX_SEGMENTS
            or not all(_SEGMENT.fullmatch(s) and s.strip(".") for s in segments)):
        raise InvalidNameError(
            f"invalid dataset name {name!r}: use letters, digits, '.', '_' and '-', starting with "
            f"a letter or digit, optionally under one namespace such as 'public/NAME'")
    return name


def check_new_dataset_name(name: str) -> str:
    """Returns `name` if a new dataset may be written under it, else raises InvalidNameError.

    Stricter than `validate_dataset_name` (which readers use, so that a dataset published before
    the rule stays readable): a namespaced name's dataset segment may not be one of a dataset
    folder's own entries (`RESERVED_SEGMENTS`), whatever the storage holds now. That rule needs no
    lock, so it holds on object stores too; whether the namespace is itself a dataset is checked
    against storage (trainfeed.formats.manifest.check_name_is_free)."""
    validate_dataset_name(name)
    head, _, tail = name.partition("/")
    if tail and tail.lower() in RESERVED_SEGMENTS:
        raise InvalidNameError(
            f"invalid dataset name {name!r}: {tail!r} is a folder or file inside every "
            f"dataset's folder ({', '.join(sorted(RESERVED_SEGMENTS))}), so {name!r} would lie "
            f"inside dataset {head!r}, among its own files; choose another name")
    return name


def validate_job_name(name: str) -> str:
    """Returns `name` if it is a valid job name (one segment, same alphabet as datasets)."""
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name) or not name.strip("."):
        raise InvalidNameError(
            f"invalid job name {name!r}: use 1-128 letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit")
    return name
