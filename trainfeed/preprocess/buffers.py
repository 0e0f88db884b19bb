"""How many rows go into each packed buffer, as MADlib's `training_preprocessor_dl` decides.

A buffer is one mini-batch that a worker reads whole. The number of buffers is rounded up to a
multiple of the number of workers that will read them, and the rows are then spread as evenly as
possible, so that no worker gets a short share (MADlib's "no skew"):
52 rows for 3 workers give buffers of 18, 18, 16; asking for 10 rows per buffer gives
9, 9, 9, 9, 9, 7 (6 buffers, the next multiple of 3 above 52 / 10).

Without a buffer size, MADlib's calculator (`MiniBatchBufferSizeCalculator` in
utilities/minibatch_preprocessing.py_in) picks one buffer per worker, capped at
MAX_DEFAULT_BUFFER_VALUES values of an independent variable per buffer; with several independent
variables the smallest of their defaults wins. 1M rows of 32x32x3 for 1 worker: 75,000,000 /
3,072 rounds up to 24,415 rows, so 41 buffers, evened out to 24,391 rows each.
"""
from __future__ import annotations

from collections.abc import Sequence

# MADlib's cap on a default buffer, in values of one independent variable (75,000,000: 300 MB
# of float32), so that one buffer fits a worker's memory comfortably.
MAX_DEFAULT_BUFFER_VALUES = 75_000_000


def default_buffer_size(num_rows: int, values_per_row: Sequence[int], num_workers: int) -> int:
    """Rows per buffer when none is asked for: one buffer per worker, unless that exceeds
    MAX_DEFAULT_BUFFER_VALUES values of any independent variable (rounded up: a row larger
    than the cap still makes a buffer of one).

    Args:
        num_rows: rows to pack (≥ 1).
        values_per_row: per independent variable, the values of one row's array (the product
            of its dimensions).
        num_workers: workers that will read the output (≥ 1).
    """
    _check(num_rows, num_workers)
    by_workers = _ceil_div(num_rows, num_workers)
    return min([by_workers] + [_ceil_div(MAX_DEFAULT_BUFFER_VALUES, max(1, int(values)))
                               for values in values_per_row])


def plan_buffers(num_rows: int, num_workers: int, buffer_size: int | None = None,
                 values_per_row: Sequence[int] = (1,)) -> list[int]:
    """The size of each buffer, in order; they sum to `num_rows`.

    Args:
        num_rows: rows to pack (≥ 1).
        num_workers: workers that will read the output (MADlib's segments, ≥ 1).
        buffer_size: rows per buffer asked for; None: `default_buffer_size`.
        values_per_row: per independent variable, the values of one row (for the default's
            cap).
    """
    _check(num_rows, num_workers)
    if buffer_size is not None and buffer_size < 1:
        raise ValueError(f"buffer_size must be ≥ 1, got {buffer_size}")
    asked = buffer_size or default_buffer_size(num_rows, values_per_row, num_workers)
    # Exact integer arithmetic for MADlib's ceil(rows / asked / workers) * workers.
    num_buffers = num_workers * _ceil_div(num_rows, asked * num_workers)
    num_buffers = min(num_buffers, num_rows)  # never an empty buffer
    size = _ceil_div(num_rows, num_buffers)
    sizes = []
    left = num_rows
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(num_rows: int, num_workers: int) -> None:
    if num_rows < 1:
        raise ValueError(f"nothing to pack: {num_rows} rows")
    if num_workers < 1:
        raise ValueError(f"num_workers must be ≥ 1, got {num_workers}")

