"""How many rows go into each packed buffer, as MADlib's `training_preprocessor_dl` decides.

A buffer is one mini-batch that a worker reads whole. The number of buffers is rounded up to a
multiple of the number of workers that will read them, and the rows are then spread as evenly as
possible, so that no worker gets a short share (MADlib's "no skew"):
52 rows for 3 workers give buffers of 18, 18, 16; asking for 10 rows per buffer gives
9, 9, 9, 9, 9, 7 (6 buffers, the next multiple of 3 above 52 / 10).
"""
from __future__ import annotations

import math

# MADlib caps a default buffer at this many bytes of independent data, so one buffer fits a
# worker's memory comfortably (its `DEFAULT_BUFFER_SIZE_BYTES` is of the same order).
MAX_DEFAULT_BUFFER_BYTES = 200 << 20


def default_buffer_size(num_rows: int, row_bytes: int, num_workers: int) -> int:
    """Rows per buffer when none is asked for: one buffer per worker, unless that exceeds
    MAX_DEFAULT_BUFFER_BYTES of independent data."""
    _check(num_rows, num_workers)
    by_workers = math.ceil(num_rows / num_workers)
    by_memory = max(1, MAX_DEFAULT_BUFFER_BYTES // max(1, row_bytes))
    return max(1, min(by_workers, by_memory))


def plan_buffers(num_rows: int, num_workers: int, buffer_size: int | None = None,
                 row_bytes: int = 1) -> list[int]:
    """The size of each buffer, in order; they sum to `num_rows`.

    Args:
        num_rows: rows to pack (≥ 1).
        num_workers: workers that will read the output (MADlib's segments, ≥ 1).
        buffer_size: rows per buffer asked for; None: `default_buffer_size`.
        row_bytes: bytes of one row's independent arrays (for the default's memory cap).
    """
    _check(num_rows, num_workers)
    if buffer_size is not None and buffer_size < 1:
        raise ValueError(f"buffer_size must be ≥ 1, got {buffer_size}")
    asked = buffer_size or default_buffer_size(num_rows, row_bytes, num_workers)
    num_buffers = num_workers * math.ceil(math.ceil(num_rows / asked) / num_workers)
    num_buffers = min(num_buffers, num_rows)  # never an empty buffer
    size = math.ceil(num_rows / num_buffers)
    sizes = []
    left = num_rows
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


def _check(num_rows: int, num_workers: int) -> None:
    if num_rows < 1:
        raise ValueError(f"nothing to pack: {num_rows} rows")
    if num_workers < 1:
        raise ValueError(f"num_workers must be ≥ 1, got {num_workers}")
