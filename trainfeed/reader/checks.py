"""Type and range checks of reader options, each error naming the option, the value and the rule.

The option groups (trainfeed.reader.options) call these in `__post_init__`, so that a wrong value
fails where the reader is created: `batch_size="32"` is a TypeError there, not a
"'<' not supported" from deep inside the first pass, and `batch_size=32.0` no longer waits for
the first pass to fail (issue 26). A wrong type is a TypeError, a value out of range or not among
the choices a ValueError, as Python's own built-ins do.

Example:
    >>> check_int("batch_size", "32", minimum=1)
    Traceback (most recent call last):
    ...
    TypeError: batch_size must be an int ≥ 1, got '32' (str)
"""
from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np


def _shown(value: Any) -> str:
    return f"{str(repr(value))[:80]} ({type(value).__name__})"


def check_bool(option: str, value: Any) -> None:
    """True or False (numpy's bool too); not 0/1 or a string, which would read as a typo."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{option} must be True or False, got {_shown(value)}")


def check_int(option: str, value: Any, minimum: int, none: str = "") -> Any:
    """An int ≥ `minimum` (numpy's too; not a bool or a float, not even 32.0), returned as a
    Python int; `none`, when given, says what None means and allows it (returned as is)."""
    if value is None and none:
        return None
    rule = f"an int ≥ {minimum}" + (f" or None ({none})" if none else "")
    if isinstance(value, bool):
        raise TypeError(f"{option} must be {rule}, got {_shown(value)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{option} must be {rule}, got {_shown(value)}") from None
    if number < minimum:
        raise ValueError(f"{option} must be {rule}, got {number}")
    return number


def check_number(option: str, value: Any, rule: str, low: float = -math.inf,
                 low_open: bool = False) -> None:
    """A finite real number (int or float, not a bool) ≥ `low` (> `low` if `low_open`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{option} must be {rule}, got {_shown(value)}")
    if not math.isfinite(value) or value < low or (low_open and value == low):
        raise ValueError(f"{option} must be {rule}, got {value!r}")


def check_choice(option: str, value: Any, choices: Collection[Any]) -> None:
    """One of `choices` (compared by type too: 1.0 is not 1, True is not 1)."""
    if not any(type(value) is type(c) and value == c for c in choices):
        raise ValueError(f"{option} is {_shown(value)}, expected one of {list(choices)}")


def check_text(option: str, value: Any, none: str = "") -> None:
    """A string; `none`, when given, says what None means and allows it."""
    if value is None and none:
        return
    if not isinstance(value, str):
        rule = "a string" + (f" or None ({none})" if none else "")
        raise TypeError(f"{option} must be {rule}, got {_shown(value)}")


def check_target(option: str, value: Any) -> None:
    """A class distribution (trainfeed.reader.resample.Target): "uniform", a dict class ->
    weight ≥ 0, or a finite power of the source distribution. Whether its classes are the
    dataset's is checked against the manifest, once the reader has it."""
    if value is None:
        return
    rule = '"uniform", a dict class -> weight ≥ 0, or a power (a number) of the source distribution'
    if isinstance(value, str):
        check_choice(option, value, ["uniform"])
    elif isinstance(value, Mapping):
        if not value:
            raise ValueError(f"{option} is an empty dict: give each class to emit a weight")
        for label, weight in value.items():
            check_number(f"{option}[{label!r}]", weight, "a weight ≥ 0", low=0)
    else:
        check_number(option, value, rule)
