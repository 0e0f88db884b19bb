"""The preprocessors' arguments, checked as MADlib's `InputDataPreprocessorDL._validate_args`
does, before any data is read.

Each error starts with the function's name, as MADlib's do ("training_preprocessor_dl: The
normalizing constant has to be a positive integer or NULL."), and says what was given.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainfeed.planning.distribution import DistributionRules
from trainfeed.preprocess.encoding import PreprocessError


def split_names(value: str | Sequence[str], role: str, module: str) -> list[str]:
    """Column names from a list, or from MADlib's comma-separated form (its
    `split_quoted_delimited_str`): 'a, b' is two columns, '"a,b"' one column named a,b (the
    double quotes taken off, "" inside them is one ")."""
    if isinstance(value, str):
        names = [_unquote(t.strip()) for t in _split_outside_quotes(value)]
        if value.strip() and not all(names):  # 'a,,b' or a trailing comma
            raise PreprocessError(f"{module}: {role}_varname {value!r} has an empty column "
                                  f"name")
        names = [n for n in names if n]
    else:
        names = [str(n) for n in value]
    if not names:
        raise PreprocessError(f"{module}: no {role} variable given ({role}_varname is empty)")
    if len(set(names)) != len(names):
        raise PreprocessError(f"{module}: {role}_varname names a column twice: {names}")
    return names


def _split_outside_quotes(text: str) -> list[str]:
    tokens: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            tokens.append("".join(current))
            current = []
        else:
            current.append(char)
    tokens.append("".join(current))
    return tokens


def _unquote(token: str) -> str:
    if len(token) >= 2 and token.startswith('"') and token.endswith('"'):
        return token[1:-1].replace('""', '"')
    return token


@dataclass(frozen=True)
class Arguments:
    """The checked, defaulted arguments both preprocessors share."""

    buffer_size: int | None
    normalizing_const: float
    rules: DistributionRules
    num_workers: int


def check_arguments(module: str, buffer_size: Any, normalizing_const: Any,
                    distribution_rules: str | Sequence[str] | None, num_workers: Any,
                    default_workers: int = 1) -> Arguments:
    """Checks and defaults the shared arguments.

    `normalizing_const` None is 1.0 (MADlib's default); `num_workers` None is the number of
    workers the rules name, else `default_workers` (MADlib packs for as many segments as its
    rules select).

    Raises:
        PreprocessError: a buffer size below 1, a normalizing constant not > 0, unknown rules,
            fewer than one worker.
    """
    if buffer_size is not None and (isinstance(buffer_size, bool)
                                    or not isinstance(buffer_size, int) or buffer_size < 1):
        raise PreprocessError(f"{module}: the buffer size has to be a positive integer or "
                              f"None, got {buffer_size!r}")
    const = 1.0 if normalizing_const is None else normalizing_const
    try:
        const = float(const)
    except (TypeError, ValueError):
        raise PreprocessError(f"{module}: the normalizing constant has to be a positive number "
                              f"or None, got {normalizing_const!r}") from None
    if not (const > 0 and math.isfinite(const)):
        raise PreprocessError(f"{module}: the normalizing constant has to be a positive number "
                              f"or None, got {normalizing_const!r}")
    try:
        rules = DistributionRules.parse(distribution_rules)
    except ValueError as e:
        raise PreprocessError(f"{module}: {e}") from None
    if num_workers is None:
        num_workers = len(rules.names) if rules.kind == "list" else default_workers
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise PreprocessError(f"{module}: num_workers has to be a positive integer, got "
                              f"{num_workers!r}")
    return Arguments(buffer_size, const, rules, num_workers)


def class_widths(module: str, num_classes: int | Sequence[int | None] | None,
                 dependents: Sequence[str]) -> list[int | None]:
    """`num_classes` per dependent variable: one value for all, or one each (MADlib: an
    array, one entry per dependent variable)."""
    widths: list[Any] = (list(num_classes) if isinstance(num_classes, list | tuple)
                         else [num_classes] * len(dependents))
    if len(widths) != len(dependents):
        raise PreprocessError(f"{module}: num_classes has {len(widths)} entries for "
                              f"{len(dependents)} dependent variables {list(dependents)}")
    for width in widths:
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)
                                  or width < 1):
            raise PreprocessError(f"{module}: num_classes has to hold positive integers (or "
                                  f"None), got {num_classes!r}")
    return widths
