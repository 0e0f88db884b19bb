from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainfeed.preprocess.buffers import MAX_DEFAULT_BUFFER_BYTES, plan_buffers


def test_the_madlib_documentation_examples() -> None:
    # training_preprocessor_dl on 52 rows with 3 segments, by default and with buffer_size=10.
    assert plan_buffers(52, 3) == [18, 18, 16]
    assert plan_buffers(52, 3, buffer_size=10) == [9, 9, 9, 9, 9, 7]


def test_the_default_is_capped_by_memory() -> None:
    row = 3 * 32 * 32 * 4  # a 3x32x32 float32 array
    sizes = plan_buffers(1_000_000, 2, row_bytes=row)
    assert max(sizes) * row <= MAX_DEFAULT_BUFFER_BYTES
    assert len(sizes) % 2 == 0


@given(rows=st.integers(1, 5000), workers=st.integers(1, 16),
       asked=st.one_of(st.none(), st.integers(1, 600)))
def test_buffers_cover_the_rows_in_rounds_of_the_workers(
        rows: int, workers: int, asked: int | None) -> None:
    sizes = plan_buffers(rows, workers, asked)
    assert sum(sizes) == rows and min(sizes) >= 1
    assert all(s == sizes[0] for s in sizes[:-1])  # all full but the last (MADlib's fill)
    wanted = math.ceil(rows / (asked or math.ceil(rows / workers)))
    planned = workers * math.ceil(wanted / workers)  # rounded up to whole rounds of workers
    assert len(sizes) <= planned
    assert sizes[0] == math.ceil(rows / min(planned, rows))  # as even as that many allows
    if asked is not None:
        assert max(sizes) <= asked


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="nothing to pack"):
        plan_buffers(0, 3)
    with pytest.raises(ValueError, match="num_workers"):
        plan_buffers(5, 0)
    with pytest.raises(ValueError, match="buffer_size"):
        plan_buffers(5, 1, buffer_size=0)
