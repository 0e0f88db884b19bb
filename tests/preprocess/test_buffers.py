from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainfeed.preprocess.buffers import (
    MAX_DEFAULT_BUFFER_VALUES,
    default_buffer_size,
    plan_buffers,
)


def test_the_madlib_documentation_examples() -> None:
    # training_preprocessor_dl on 52 rows with 3 segments, by default and with buffer_size=10.
    assert plan_buffers(52, 3) == [18, 18, 16]
    assert plan_buffers(52, 3, buffer_size=10) == [9, 9, 9, 9, 9, 7]


def test_the_madlib_install_check_figures() -> None:
    # deep_learning/test/input_data_preprocessor.sql_in on PostgreSQL (one segment), 17 rows:
    # buffer_size 5 -> num_buffers(17, 5) = 4 buffers, the first three of buffer_size(17, 5) = 5;
    # buffer_size 4 -> 5 buffers of 4 (x is 4 * 6 * 4 bytes long) and the last of 1.
    assert plan_buffers(17, 1, buffer_size=5, values_per_row=[6]) == [5, 5, 5, 2]
    assert plan_buffers(17, 1, buffer_size=4, values_per_row=[6]) == [4, 4, 4, 4, 1]
    # the NULL-class table of one row: one buffer of one row (x is 24 bytes: 6 float32)
    assert plan_buffers(1, 1, buffer_size=4, values_per_row=[6]) == [1]


def test_the_default_follows_madlibs_calculator_and_its_cap() -> None:
    # 1M rows of 32x32x3 on 1 segment: min(75e6 / 3072, 1e6 / 1) rounds up to 24,415 rows, so
    # 41 buffers, evened out to 24,391 rows (the last one 24,360).
    assert default_buffer_size(1_000_000, [3072], 1) == 24_415
    sizes = plan_buffers(1_000_000, 1, values_per_row=[3072])
    assert len(sizes) == 41 and sizes[:-1] == [24_391] * 40 and sizes[-1] == 24_360
    # Several independent variables: the smallest default wins (here the 3072-value one).
    assert plan_buffers(1_000_000, 1, values_per_row=[10, 3072]) == sizes
    # Below the cap, one buffer per worker.
    assert plan_buffers(1000, 4, values_per_row=[3072]) == [250] * 4
    # On 2 workers the buffer count is rounded up to a multiple of 2: 42 buffers.
    assert len(plan_buffers(1_000_000, 2, values_per_row=[3072])) == 42


def test_a_row_larger_than_the_cap_is_a_buffer_of_its_own() -> None:
    assert default_buffer_size(10, [MAX_DEFAULT_BUFFER_VALUES + 1], 1) == 1
    assert plan_buffers(3, 1, values_per_row=[2 * MAX_DEFAULT_BUFFER_VALUES]) == [1, 1, 1]


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


@given(rows=st.integers(1, 10**7), workers=st.integers(1, 64),
       values=st.lists(st.integers(1, 10**6), min_size=1, max_size=3))
def test_the_default_is_madlibs_formula(rows: int, workers: int, values: list[int]) -> None:
    # MiniBatchBufferSizeCalculator: ceil(min(75e6 / values, rows / segments)), per variable.
    want = min(math.ceil(min(75_000_000 / v, rows / workers)) for v in values)
    assert default_buffer_size(rows, values, workers) == want


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="nothing to pack"):
        plan_buffers(0, 3)
    with pytest.raises(ValueError, match="num_workers"):
        plan_buffers(5, 0)
    with pytest.raises(ValueError, match="buffer_size"):
        plan_buffers(5, 1, buffer_size=0)
