"""Encoding one buffer's columns as MADlib's `training_preprocessor_dl` does.

Independent variables: numeric arrays of one shape per row, stacked and divided by
`normalizing_const` into float32. Dependent variables: scalars (text, integer, boolean) are
one-hot encoded against sorted class values, NULL being a class of its own (sorted first), padded
to `num_classes` with null classes; numeric arrays are taken as already one-hot. Every error
names the column and the row.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from trainfeed.errors import PreprocessError

# MADlib stores one-hot dependent variables as small integers.
ONE_HOT_DTYPE = np.int16


def class_values(values: Iterable[Any], column: str,
                 num_classes: int | None = None) -> list[Any]:
    """Sorted distinct values of a scalar dependent column, padded with None up to
    `num_classes` (MADlib lists padded classes as NULL in its summary).

    A missing value (NULL) is a class of its own, as in MADlib (its DISTINCT keeps NULL, and
    NULL sorts first): ['a', None, 'b'] gives [None, 'a', 'b']. So a None at position 0 is the
    NULL class, a None anywhere else is padding (see `real_classes`).

    Raises:
        PreprocessError: `num_classes` is smaller than the number of distinct values (NULL
            included), MADlib's "Invalid num_classes value specified".
    """
    distinct = sorted({_scalar(v, column) for v in values}, key=_order)
    if num_classes is not None:
        if num_classes < len(distinct):
            raise PreprocessError(
                f"column {column!r}: invalid num_classes value specified ({num_classes}); it "
                f"must be equal to or greater than the distinct class values found in the "
                f"table ({len(distinct)}, NULL included)")
        distinct += [None] * (num_classes - len(distinct))
    return distinct


def real_classes(classes: Sequence[Any]) -> list[Any]:
    """The class values without the padding: a leading None (the NULL class) is kept, every
    later None dropped (MADlib's `strip_trailing_nulls_from_class_values`)."""
    return [c for i, c in enumerate(classes) if c is not None or i == 0]


def one_hot(values: Sequence[Any], classes: Sequence[Any], column: str,
            row_ids: Sequence[int] | None = None) -> np.ndarray:
    """(n, len(classes)) one-hot rows; a value outside `classes` is an error naming its row.

    A None value goes to the NULL class (a None at position 0); padding columns stay 0."""
    index = {_key(c): i for i, c in enumerate(real_classes(classes))}
    out = np.zeros((len(values), len(classes)), dtype=ONE_HOT_DTYPE)
    for row, value in enumerate(values):
        key = _key(_scalar(value, column))
        if key not in index:
            raise PreprocessError(f"{_where(column, row, row_ids)}: class {value!r} "
                                  f"is not among the class values {list(classes)[:10]}")
        out[row, index[key]] = 1
    return out


def unknown_classes(values: Iterable[Any], classes: Sequence[Any], column: str) -> list[Any]:
    """The distinct values that are not among `classes` (padding is no class), sorted."""
    known = {_key(c) for c in real_classes(classes)}
    return sorted({v for v in (_scalar(v, column) for v in values) if _key(v) not in known},
                  key=_order)


def stack_arrays(values: Sequence[Any] | np.ndarray, column: str, normalizing_const: float = 1.0,
                 row_ids: Sequence[int] | None = None, dtype: type = np.float32) -> np.ndarray:
    """The rows' arrays stacked into one (n, ...) array, divided by `normalizing_const`.

    Nested lists (e.g. a 2x2 RGB image as [[[r, g, b], …], …]) keep their shape; flat ones stay
    flat. Ragged rows, non-numeric or missing values are errors naming the row: its index in
    the source (`row_ids[i]` for value i; i itself without row_ids)."""
    if not normalizing_const > 0:
        raise PreprocessError(f"normalizing_const must be > 0, got {normalizing_const}")
    arrays = []
    shape = None
    for row, value in enumerate(values):
        if value is None:
            raise PreprocessError(f"{_where(column, row, row_ids)}: missing array")
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise PreprocessError(f"{_where(column, row, row_ids)}: not a numeric "
                                  f"array ({e})") from None
        if array.ndim == 0:
            array = array.reshape(1)
        if shape is None:
            shape = array.shape
        elif array.shape != shape:
            raise PreprocessError(f"{_where(column, row, row_ids)}: shape "
                                  f"{array.shape}, but earlier rows have {shape}")
        if not np.isfinite(array).all():
            raise PreprocessError(f"{_where(column, row, row_ids)}: NaN, infinite or "
                                  f"missing (NULL) values")
        arrays.append(array)
    if not arrays:
        raise PreprocessError(f"column {column!r}: no rows")
    stacked = np.stack(arrays) / normalizing_const
    if np.dtype(dtype).kind in "iu":
        stacked = np.rint(stacked)  # PostgreSQL's float-to-smallint cast rounds, never truncates
    return stacked.astype(dtype)


def _where(column: str, row: int, row_ids: Sequence[int] | None) -> str:
    return f"column {column!r}, row {row_ids[row] if row_ids is not None else row}"


def _scalar(value: Any, column: str) -> Any:
    """A class value as a plain JSON value: numpy scalars unwrapped, a PostgreSQL numeric
    (Decimal) as an int or a float; other kinds are refused (the summary is JSON)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, Decimal):
        value = int(value) if value == value.to_integral_value() else float(value)
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise PreprocessError(f"column {column!r}: a NaN class value; use NULL (None) for "
                                  f"a missing class")
        return value
    raise PreprocessError(f"column {column!r}: class value {value!r} is a "
                          f"{type(value).__name__}; class values must be text, numbers or "
                          f"booleans (CAST the column)")


def _key(value: Any) -> tuple[int, Any]:
    """A class value's identity: booleans apart from numbers (True is not 1), ints and floats
    alike (4 is 4.0), as PostgreSQL compares them."""
    if value is None:
        return (0, None)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, int | float):
        return (2, value)
    return (3, value)


def _order(value: Any) -> tuple[int, Any]:
    """NULL first (MADlib sorts the levels in Python 2, where None is below everything), then
    by value; sortable even if a column mixes kinds."""
    kind, key = _key(value)
    return (kind, key if key is not None else 0)
