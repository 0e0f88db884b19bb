"""The memory cap of the default buffer size, at and past its edges: a row larger than the cap,
rows of 0 bytes, a cap that is not a multiple of the row size."""
from __future__ import annotations

from trainfeed.preprocess.buffers import (
    MAX_DEFAULT_BUFFER_BYTES,
    default_buffer_size,
    plan_buffers,
)

CAP = MAX_DEFAULT_BUFFER_BYTES


def test_a_row_larger_than_the_cap_gets_a_buffer_of_its_own() -> None:
    assert default_buffer_size(10, CAP * 2, num_workers=3) == 1
    assert plan_buffers(10, 3, row_bytes=CAP * 2) == [1] * 10
    assert default_buffer_size(10, CAP, num_workers=1) == 1  # exactly the cap: still one
    assert default_buffer_size(10, CAP // 2, num_workers=1) == 2


def test_the_cap_rounds_down_to_whole_rows() -> None:
    size = default_buffer_size(10, CAP // 2 + 1, num_workers=1)
    assert size == 1 and isinstance(size, int)  # 1.99… rows fit: one row, not a fraction


def test_without_the_cap_one_buffer_per_worker() -> None:
    assert default_buffer_size(52, 1, num_workers=3) == 18  # ceil(52 / 3)
    assert default_buffer_size(1, 1, num_workers=1) == 1


def test_tiny_rows_are_capped_by_count_alone() -> None:
    # 1-byte (and 0-byte: no independent data) rows: CAP rows per buffer at most.
    assert default_buffer_size(3 * CAP, 1, num_workers=1) == CAP
    assert default_buffer_size(3 * CAP, 0, num_workers=1) == CAP
    assert plan_buffers(2 * CAP, 1) == [CAP, CAP]  # the default row_bytes is 1
