"""Fetched rows into Arrow: PostgreSQL numeric arrays straight into numpy, batches of them into
Arrow list columns, and fetched batches into one table.

A table of training examples is mostly arrays: MADlib keeps an image as a ``smallint[]`` or
``real[]`` column. psycopg loads such a value as a Python list, one int or float object per
element: for a 3x32x32 image that is 3,072 objects and about 100 µs of CPU per row, more than
the database spends sending it, and 24 KB of pointers per row in memory. In PostgreSQL's binary
format an array without nulls is a header (dimensions) and then, per element, a 4-byte length
and the big-endian value, so one ``numpy.frombuffer`` with a two-field record type reads it
whole (about 3 µs a row).

:func:`register_numeric_array_loaders` installs such loaders on a connection for arrays of
``smallint``, ``integer``, ``bigint``, ``real`` and ``double precision``; they apply to cursors
that fetch in binary. An array holding NULLs, which has no fixed layout, is loaded as nested
Python lists with ``None`` where the NULLs are, as psycopg would, so later checks can name the
row. :func:`arrow_column` then turns one fetched batch of a column into an Arrow array: equally
shaped numpy arrays become nested list arrays over one contiguous block, anything else goes
through ``pyarrow.array``; :func:`to_arrow` and :func:`concat` build a result's table from
such batches (both databases' sessions use them).
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trainfeed.redaction import redact_url
from trainfeed.sql.errors import SqlError

__all__ = ["ARRAY_ELEMENT_TYPES", "FETCH_ROWS", "arrow_column", "concat", "parse_binary_array",
           "register_numeric_array_loaders", "to_arrow"]

# Rows fetched per round trip. 10,000 rows of a few columns is ~1 MB: large enough that the
# per-call overhead vanishes, small enough that a server-side cursor keeps client memory flat.
FETCH_ROWS = 10_000

#: Array type OIDs (pg_type.dat) -> the big-endian numpy type of their elements.
ARRAY_ELEMENT_TYPES: dict[int, np.dtype] = {
    1005: np.dtype(">i2"),  # smallint[]
    1007: np.dtype(">i4"),  # integer[]
    1016: np.dtype(">i8"),  # bigint[]
    1021: np.dtype(">f4"),  # real[]
    1022: np.dtype(">f8"),  # double precision[]
}

_HEADER = struct.Struct(">iii")  # ndim, has-null flag, element type OID
_NULL_LENGTH = -1


def parse_binary_array(data: bytes | memoryview, element: np.dtype) -> np.ndarray | list[Any]:
    """One array in PostgreSQL's binary format (``array_send``) as a numpy array of `element`'s
    type in native byte order, shaped as the array; nested lists with None if it holds NULLs.

    The result never shares memory with `data` (psycopg reuses its buffers).
    """
    ndim, has_null, _ = _HEADER.unpack_from(data, 0)
    native = element.newbyteorder("=")
    if ndim == 0:
        return np.empty(0, native)  # '{}': PostgreSQL's empty array has no dimensions
    dims = struct.unpack_from(f">{2 * ndim}i", data, _HEADER.size)[::2]  # (size, lower bound)
    offset = _HEADER.size + 8 * ndim
    if has_null:
        return _with_nulls(data, offset, dims, element)
    records = np.frombuffer(data, dtype=np.dtype([("length", ">i4"), ("value", element)]),
                            offset=offset)
    return records["value"].astype(native).reshape(dims)


def _with_nulls(data: bytes | memoryview, offset: int, dims: Sequence[int],
                element: np.dtype) -> list[Any]:
    values: list[Any] = []
    for _ in range(int(np.prod(dims))):
        (length,) = struct.unpack_from(">i", data, offset)
        offset += 4
        if length == _NULL_LENGTH:
            values.append(None)
        else:
            values.append(np.frombuffer(data, element, 1, offset)[0].item())
            offset += length
    return np.array(values, dtype=object).reshape(dims).tolist()


def register_numeric_array_loaders(adapters: Any) -> None:
    """Makes binary cursors of a psycopg connection (``connection.adapters``) load numeric
    arrays as numpy arrays."""
    from psycopg.adapt import Loader
    from psycopg.pq import Format

    for oid, element in ARRAY_ELEMENT_TYPES.items():
        loader = type(f"NumpyArrayLoader{oid}", (Loader,), {
            "format": Format.BINARY,
            "load": lambda self, data, element=element: parse_binary_array(data, element),
        })
        adapters.register_loader(oid, loader)


def arrow_column(cells: list[Any], type_: pa.DataType | None) -> pa.Array:
    """One fetched batch of a column as an Arrow array.

    Cells that are numpy arrays of one shape, the common case for an array column, are stacked
    into one block and wrapped as nested ``list`` arrays (depth = the arrays' ndim) without a
    Python object per element. Otherwise the cells go through ``pyarrow.array`` as lists.
    """
    if cells and all(isinstance(c, np.ndarray) for c in cells):
        shape = cells[0].shape
        if cells[0].ndim and all(c.shape == shape for c in cells):
            return _nested_lists(np.stack(cells))
    values = [c.tolist() if isinstance(c, np.ndarray) else c for c in cells]
    try:
        return pa.array(values, type=type_, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        if type_ is None or not pa.types.is_list(type_):
            raise
        # The declared type of an array column is 1-D; nested arrays mixed with ones holding
        # NULLs (Python lists) get their depth from the values instead.
        return pa.array(values, from_pandas=False)


def _nested_lists(block: np.ndarray) -> pa.Array:
    """An (n, d1, …, dk) block as n rows of k-deep nested lists, sharing the block's memory."""
    array: pa.Array = pa.array(block.reshape(-1))
    count = block.size
    for size in reversed(block.shape[1:]):
        count //= size
        offsets = pa.array(np.arange(0, (count + 1) * size, size, dtype=np.int64)
                           .astype(np.int32 if count * size < 2**31 else np.int64))
        array = (pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray).from_arrays(
            offsets, array)
    return array


def to_arrow(names: list[str], values: list[list[Any]], types: list[pa.DataType | None],
              url: str) -> pa.Table:
    """One fetched batch (a list of values per column) as a table; `types` are the declared
    Arrow types (None: inferred). A column that cannot convert raises SqlError naming it."""
    arrays = []
    for name, column, type_ in zip(names, values, types):
        try:
            arrays.append(arrow_column(column, type_))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise _unconvertible(name, url, exc) from None
    return pa.Table.from_arrays(arrays, names=names)


def concat(batches: list[pa.Table], url: str) -> pa.Table:
    """Fetched batches as one table (chunked, not copied). A column whose type was inferred may
    be all-null in one batch: "permissive" promotes that to the other batches' type."""
    try:
        return pa.concat_tables(batches, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        name = next((n for n in batches[0].column_names
                     if len({b.schema.field(n).type for b in batches} - {pa.null()}) > 1), "?")
        raise _unconvertible(name, url, exc) from None


def _unconvertible(name: str, url: str, exc: Exception) -> SqlError:
    return SqlError(
        f"column {name!r} of the query on {redact_url(url)} cannot be converted to Arrow ({exc}); "
        f"it probably mixes types (or array dimensions) or has a type Arrow does not know: "
        f"CAST it in the query")

