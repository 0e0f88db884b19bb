"""The buffer-built Arrow arrays equal what `pa.array` makes of the same values."""
from __future__ import annotations

import pyarrow as pa
import pytest

from trainfeed.formats.arrays import int64_array, string_array

CASES = [
    [],
    ["a", "bé", "", "日本語"],
    [None, None],
    ["x", None, "", None, "yz"] * 3,
]


@pytest.mark.parametrize("values", CASES, ids=["empty", "unicode", "all-none", "mixed"])
def test_string_array_equals_pa_array(values: list[str | None]) -> None:
    built = string_array(values)
    assert built.type == pa.string()
    assert built.to_pylist() == values
    assert built.equals(pa.array(values, pa.string()))
    built.validate(full=True)


def test_int64_array_equals_pa_array() -> None:
    values = [0, -1, 2**40, 7]
    built = int64_array(values)
    assert built.equals(pa.array(values, pa.int64()))
    built.validate(full=True)
