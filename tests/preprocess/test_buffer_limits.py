"""The cap of the default buffer size, at and past its edges: a row larger than the cap, rows of
0 values, a cap that is not a multiple of the row size. The cap counts values of an independent
variable (MADlib's 75,000,000) and, as in MADlib's calculator, the rows per buffer round up."""
from __future__ import annotations

from trainfeed.preprocess.buffers import (
    MAX_DEFAULT_BUFFER_VALUES,
    default_buffer_size,
    plan_buffers,
)

CAP = MAX_DEFAULT_BUFFER_VALUES


def test_a_row_larger_than_the_cap_gets_a_buffer_of_its_own() -> None:
    assert default_buffer_size(10, [CAP * 2], num_workers=3) == 1
    assert plan_buffers(10, 3, values_per_row=[CAP * 2]) == [1] * 10
    assert default_buffer_size(10, [CAP], num_workers=1) == 1  # exactly the cap: still one
    assert default_buffer_size(10, [CAP // 2], num_workers=1) == 2


def test_the_cap_rounds_up_to_whole_rows_as_madlib_does() -> None:
    size = default_buffer_size(10, [CAP // 2 + 1], num_workers=1)
    assert size == 2 and isinstance(size, int)  # 1.99… rows: MADlib's ceil gives 2


def test_without_the_cap_one_buffer_per_worker() -> None:
    assert default_buffer_size(52, [1], num_workers=3) == 18  # ceil(52 / 3)
    assert default_buffer_size(1, [1], num_workers=1) == 1


def test_tiny_rows_are_capped_by_count_alone() -> None:
    # 1-value (and 0-value: no independent data) rows: CAP rows per buffer at most.
    assert default_buffer_size(3 * CAP, [1], num_workers=1) == CAP
    assert default_buffer_size(3 * CAP, [0], num_workers=1) == CAP
    assert plan_buffers(2 * CAP, 1) == [CAP, CAP]  # the default values_per_row is (1,)


def test_the_smallest_default_across_independent_variables_wins() -> None:
    assert default_buffer_size(10**6, [3072, 12288], num_workers=1) == \
        default_buffer_size(10**6, [12288], num_workers=1) == -(-CAP // 12288)
