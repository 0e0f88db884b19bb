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


def validate_job_name(name: str) -> str:
    """Returns `name` if it is a valid job name (one segment, same alphabet as datasets)."""
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name) or not name.strip("."):
        raise InvalidNameError(
            f"invalid job name {name!r}: use 1-128 letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit")
    return name
