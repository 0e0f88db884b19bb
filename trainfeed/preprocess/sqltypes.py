"""SQL type names for a source's columns, as MADlib's summary writes `dependent_vartype`.

MADlib records `pg_typeof(column)` of the source table: 'integer', 'smallint',
'double precision', 'text', 'boolean', 'double precision[]', 'integer[]' … A PostgreSQL source
gives those names itself (trainfeed.sql, `SqlSource.column_types`). Every other source (Arrow,
Parquet, CSV, pandas, a dict, SQLite, whose results carry no column types) has Arrow types,
named here as the PostgreSQL type that holds the same values:

    bool -> boolean          int8, int16, uint8 -> smallint      int32, uint16 -> integer
    int64, uint32 -> bigint  uint64, decimal -> numeric          float16, float32 -> real
    float64 -> double precision    string, large_string -> text  binary -> bytea
    date32/64 -> date   timestamp -> timestamp without time zone (with a zone: with time zone)
    list, large_list, fixed_size_list of T (nested too) -> T[]   null (all values NULL) -> text
"""
from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

_INTEGERS = {8: "smallint", 16: "smallint", 32: "integer", 64: "bigint"}
_UNSIGNED = {8: "smallint", 16: "integer", 32: "bigint", 64: "numeric"}

# Arrow's test for each list type whose values become a PostgreSQL array.
_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)

# The Arrow types whose PostgreSQL name depends on nothing but the type's kind, tried in order
# (the first test that holds names it): float64 comes before floating, which it also is.
_NAMES: tuple[tuple[Callable[[pa.DataType], bool], str], ...] = (
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_float64, "double precision"),
    (pa.types.is_floating, "real"),
    (pa.types.is_decimal, "numeric"),
    (pa.types.is_string, "text"), (pa.types.is_large_string, "text"),
    (pa.types.is_null, "text"),  # a column whose values are all NULL
    (pa.types.is_binary, "bytea"), (pa.types.is_large_binary, "bytea"),
    (pa.types.is_date, "date"),
)


def arrow_sql_type(arrow_type: pa.DataType) -> str:
    """The PostgreSQL type name for values of `arrow_type` (see the module's table); an Arrow
    type without one is named by Arrow ('duration[s]')."""
    if any(is_list(arrow_type) for is_list in _LISTS):
        return _array_type(arrow_type)
    if pa.types.is_signed_integer(arrow_type):
        return _INTEGERS[arrow_type.bit_width]
    if pa.types.is_unsigned_integer(arrow_type):
        return _UNSIGNED[arrow_type.bit_width]
    if pa.types.is_timestamp(arrow_type):
        zone = "with" if arrow_type.tz else "without"
        return f"timestamp {zone} time zone"
    for holds, name in _NAMES:
        if holds(arrow_type):
            return name
    return str(arrow_type)


def _array_type(list_type: pa.DataType) -> str:
    """The array type of a list's elements: one `[]` however deep the lists nest, since a
    PostgreSQL array type has any number of dimensions ('integer[]' holds a 3-D array)."""
    element = arrow_sql_type(list_type.value_type)
    return element if element.endswith("[]") else element + "[]"


def is_array_type(sql_type: str) -> bool:
    """Whether a column of this type holds arrays (a dependent array is taken as one-hot)."""
    return sql_type.endswith("[]")
