"""Arrow arrays built straight from buffers, not with `pa.array`: pyarrow's first `pa.array`
call imports pandas (0.2 CPU-s), which an upload would pay for nothing, and over a shard's
column of str one join and one cumulative sum cost less than converting each object."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def string_array(values: Sequence[str | None]) -> pa.Array:
    """`pa.array(values, pa.string())` from one UTF-8 buffer, its offsets and (only when some
    value is None) a validity bitmap. All None gives a null array: a text list's records have
    no file."""
    if values and all(v is None for v in values):
        return pa.nulls(len(values), pa.string())
    encoded = [v.encode() if v is not None else b"" for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in encoded], out=offsets[1:])
    valid = None
    if any(v is None for v in values):
        valid = pa.py_buffer(np.packbits([v is not None for v in values], bitorder="little"))
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def int64_array(values: Sequence[int]) -> pa.Array:
    """`pa.array(values, pa.int64())` from one buffer."""
    data = np.asarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
