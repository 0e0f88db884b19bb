"""Arrow types named as the PostgreSQL types MADlib's `dependent_vartype` would record."""
from __future__ import annotations

import pyarrow as pa
import pytest

from trainfeed.preprocess.sqltypes import arrow_sql_type, is_array_type


@pytest.mark.parametrize("arrow_type,name", [
    (pa.bool_(), "boolean"),
    (pa.int8(), "smallint"), (pa.int16(), "smallint"), (pa.int32(), "integer"),
    (pa.int64(), "bigint"), (pa.uint8(), "smallint"), (pa.uint16(), "integer"),
    (pa.uint32(), "bigint"), (pa.uint64(), "numeric"),
    (pa.float16(), "real"), (pa.float32(), "real"), (pa.float64(), "double precision"),
    (pa.decimal128(4, 1), "numeric"), (pa.string(), "text"), (pa.large_string(), "text"),
    (pa.null(), "text"), (pa.binary(), "bytea"), (pa.date32(), "date"),
    (pa.timestamp("us"), "timestamp without time zone"),
    (pa.timestamp("us", tz="UTC"), "timestamp with time zone"),
    (pa.list_(pa.float64()), "double precision[]"), (pa.list_(pa.int32()), "integer[]"),
    (pa.list_(pa.list_(pa.list_(pa.uint8()))), "smallint[]"),  # PostgreSQL: one [] per array
    (pa.large_list(pa.float32()), "real[]"), (pa.list_(pa.float32(), 3), "real[]"),
    (pa.list_(pa.string()), "text[]"),
    (pa.duration("s"), "duration[s]"),  # no PostgreSQL counterpart: Arrow's name
])
def test_the_mapping(arrow_type: pa.DataType, name: str) -> None:
    assert arrow_sql_type(arrow_type) == name
    assert is_array_type(name) == name.endswith("[]")
