"""Encoding one buffer's columns as MADlib's `training_preprocessor_dl` does.

Independent variables: numeric arrays of one shape per row, stacked and divided by
`normalizing_const` into float32. Dependent variables: scalars (text, integer, boolean) are
one-hot encoded against sorted class values, padded to `num_classes` with null classes; numeric
arrays are taken as already one-hot. Every error names the column and the row.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trainfeed.errors import TrainfeedError

# MADlib stores one-hot dependent variables as small integers.
ONE_HOT_DTYPE = np.int16


class PreprocessError(TrainfeedError, ValueError):
    """A source column that cannot be packed (missing, non-numeric, ragged, unknown class)."""


def class_values(values: Iterable[Any], column: str,
                 num_classes: int | None = None) -> list[Any]:
    """Sorted distinct values of a scalar dependent column, padded with None up to
    `num_classes` (MADlib lists padded classes as NULL in its summary)."""
    distinct = sorted({_scalar(v, column) for v in values}, key=_order)
    if num_classes is not None:
        if num_classes < len(distinct):
            raise PreprocessError(f"column {column!r} has {len(distinct)} classes, more than "
                                  f"num_classes={num_classes}")
        distinct += [None] * (num_classes - len(distinct))
    return distinct


def one_hot(values: Sequence[Any], classes: Sequence[Any], column: str,
            row_ids: Sequence[int] | None = None) -> np.ndarray:
    """(n, len(classes)) one-hot rows; a value outside `classes` is an error naming its row."""
    index = {c: i for i, c in enumerate(classes) if c is not None}
    out = np.zeros((len(values), len(classes)), dtype=ONE_HOT_DTYPE)
    for row, value in enumerate(values):
        key = _scalar(value, column)
        if key not in index:
            raise PreprocessError(f"{_where(column, row, row_ids)}: class {value!r} "
                                  f"is not among the class values {list(classes)[:10]}")
        out[row, index[key]] = 1
    return out


def stack_arrays(values: Sequence[Any] | np.ndarray, column: str, normalizing_const: float = 1.0,
                 row_ids: Sequence[int] | None = None, dtype: type = np.float32) -> np.ndarray:
    """The rows' arrays stacked into one (n, ...) array, divided by `normalizing_const`.

    Nested lists (e.g. a 2x2 RGB image as [[[r, g, b], …], …]) keep their shape; flat ones stay
    flat. Ragged rows, non-numeric or missing values are errors naming the row: its index in
    the source (`row_ids[i]` for value i; i itself without row_ids)."""
    if normalizing_const == 0:
        raise PreprocessError("normalizing_const must not be 0")
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
    return (np.stack(arrays) / normalizing_const).astype(dtype)


def dependent_vartype(values: Sequence[Any]) -> str:
    """MADlib's type name for a dependent column: "text", "integer", "boolean", "double
    precision" or, for arrays taken as one-hot, "array"."""
    sample = next((v for v in values if v is not None), None)
    if isinstance(sample, list | tuple | np.ndarray):
        return "array"
    if isinstance(sample, bool | np.bool_):
        return "boolean"
    if isinstance(sample, int | np.integer):
        return "integer"
    if isinstance(sample, float | np.floating):
        return "double precision"
    return "text"


def _where(column: str, row: int, row_ids: Sequence[int] | None) -> str:
    return f"column {column!r}, row {row_ids[row] if row_ids is not None else row}"


def _scalar(value: Any, column: str) -> Any:
    if value is None:
        raise PreprocessError(f"column {column!r}: a missing (null) class value")
    return value.item() if isinstance(value, np.generic) else value


def _order(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)  # sortable even if a column mixes int and str
