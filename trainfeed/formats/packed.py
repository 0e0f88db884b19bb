"""The packed buffer format: how a MADlib-style buffer lies in a row of a packed dataset.

A packed dataset (manifest kind "packed", written by trainfeed.preprocess) holds one buffer per
row: for each tensor, its raw bytes in column `<name>` and its shape as JSON in column
`<name>_shape`, with the element type of each tensor in the manifest (`extra["tensors"]`);
the row's record id is the buffer id. Decoding lives here, beside the other storage formats,
because the reader needs it and the preprocessor (which writes buffers) sits above the reader:
the reader must not import it.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SHAPE_SUFFIX", "decode_buffer"]

# The column holding a tensor's shape: the tensor's name plus this.
SHAPE_SUFFIX = "_shape"


def decode_buffer(row: Mapping[str, Any], tensors: Mapping[str, str],
                  buffer_id: int) -> dict[str, Any]:
    """One packed row as MADlib's output columns: arrays reshaped, shapes, buffer_id.

    Args:
        row: The row's columns (`<name>` bytes and `<name>_shape` JSON per tensor).
        tensors: Tensor name -> numpy dtype string, from the manifest.
        buffer_id: The row's record id.

    The arrays are read-only views of the row's bytes (no copy).
    """
    out: dict[str, Any] = {}
    for name, dtype in tensors.items():
        shape = json.loads(row[name + SHAPE_SUFFIX])
        out[name] = np.frombuffer(row[name], dtype=dtype).reshape(shape)
        out[name + SHAPE_SUFFIX] = np.array(shape, dtype=np.int64)
    out["buffer_id"] = buffer_id
    return out
