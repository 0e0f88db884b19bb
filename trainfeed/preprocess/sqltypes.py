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

import pyarrow as pa

_INTEGERS = {8: "smallint", 16: "smallint", 32: "integer", 64: "bigint"}
_UNSIGNED = {8: "smallint", 16: "integer", 32: "bigint", 64: "numeric"}


def arrow_sql_type(arrow_type: pa.DataType) -> str:
    """The PostgreSQL type name for values of `arrow_type` (see the module's table); an Arrow
    type without one is named by Arrow ('duration[s]')."""
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type)):
        element = arrow_sql_type(arrow_type.value_type)
        return element if element.endswith("[]") else element + "[]"  # PostgreSQL: one []
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if pa.types.is_signed_integer(arrow_type):
        return _INTEGERS[arrow_type.bit_width]
    if pa.types.is_unsigned_integer(arrow_type):
        return _UNSIGNED[arrow_type.bit_width]
    if pa.types.is_float64(arrow_type):
        return "double precision"
    if pa.types.is_floating(arrow_type):
        return "real"
    if pa.types.is_decimal(arrow_type):
        return "numeric"
    if (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_null(arrow_type)):
        return "text"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytea"
    if pa.types.is_date(arrow_type):
        return "date"
    if pa.types.is_timestamp(arrow_type):
        zone = "with" if arrow_type.tz else "without"
        return f"timestamp {zone} time zone"
    return str(arrow_type)


def is_array_type(sql_type: str) -> bool:
    """Whether a column of this type holds arrays (a dependent array is taken as one-hot)."""
    return sql_type.endswith("[]")
