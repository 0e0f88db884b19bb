"""The packed buffer format: a row of tensor bytes and JSON shapes decodes to MADlib's columns."""
from __future__ import annotations

import json

import numpy as np

from trainfeed.formats.packed import SHAPE_SUFFIX, decode_buffer


def test_a_row_decodes_to_arrays_shapes_and_the_buffer_id() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    y = np.eye(2, dtype=np.int16)
    row = {"rgb": x.tobytes(), "rgb" + SHAPE_SUFFIX: json.dumps(list(x.shape)),
           "species": y.tobytes(), "species_shape": "[2, 2]"}
    out = decode_buffer(row, {"rgb": "float32", "species": "int16"}, 5)
    assert set(out) == {"rgb", "rgb_shape", "species", "species_shape", "buffer_id"}
    np.testing.assert_array_equal(out["rgb"], x)
    np.testing.assert_array_equal(out["species"], y)
    assert out["rgb"].dtype == np.float32 and out["species"].dtype == np.int16
    assert out["rgb_shape"].tolist() == [2, 3, 4] and out["rgb_shape"].dtype == np.int64
    assert out["buffer_id"] == 5
