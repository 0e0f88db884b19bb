"""The MADlib documentation's example (training_preprocessor_dl): 52 rows of 2x2 RGB images,
species {bird, cat, dog}, as nested and as flat arrays."""
from __future__ import annotations

import numpy as np
import pytest

from trainfeed.preprocess.buffers import plan_buffers
from trainfeed.preprocess.encoding import (
    PreprocessError,
    class_values,
    dependent_vartype,
    one_hot,
    stack_arrays,
)

SPECIES = ("bird", "cat", "dog")


def madlib_rows(flat: bool) -> tuple[list, list[str]]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (52, 2, 2, 3))
    return ([img.reshape(-1).tolist() if flat else img.tolist() for img in images],
            [SPECIES[i % 3] for i in range(52)])


@pytest.mark.parametrize("flat", [False, True])
def test_packing_the_madlib_example(flat: bool) -> None:
    rgb, species = madlib_rows(flat)
    classes = class_values(species, "species")
    assert classes == ["bird", "cat", "dog"] and dependent_vartype(species) == "text"
    start = 0
    for size in plan_buffers(52, 3):  # 18, 18, 16
        x = stack_arrays(rgb[start:start + size], "rgb", normalizing_const=255.0)
        y = one_hot(species[start:start + size], classes, "species")
        assert x.dtype == np.float32 and x.shape == ((size, 12) if flat else (size, 2, 2, 3))
        assert y.shape == (size, 3) and (y.sum(axis=1) == 1).all()
        assert np.allclose(x * 255.0, np.asarray(rgb[start:start + size]))
        assert [classes[i] for i in y.argmax(axis=1)] == species[start:start + size]
        start += size


def test_num_classes_pads_the_one_hot_width_with_null_classes() -> None:
    _, species = madlib_rows(flat=True)
    classes = class_values(species, "species", num_classes=5)
    assert classes == ["bird", "cat", "dog", None, None]
    y = one_hot(species[:4], classes, "species")
    assert y.shape == (4, 5) and not y[:, 3:].any()
    with pytest.raises(PreprocessError, match="3 classes, more than num_classes=2"):
        class_values(species, "species", num_classes=2)


def test_validation_rows_use_the_training_class_values() -> None:
    training = class_values(["bird", "cat", "dog"], "species")
    y = one_hot(["dog", "dog"], training, "species")  # a validation set without birds or cats
    assert y.tolist() == [[0, 0, 1], [0, 0, 1]]
    with pytest.raises(PreprocessError, match=r"row 7: class 'fish' is not among"):
        one_hot(["fish"], training, "species", row_ids=[7])


def test_bad_arrays_name_the_column_and_row() -> None:
    with pytest.raises(PreprocessError, match=r"'rgb', row 1: shape \(2,\), but earlier"):
        stack_arrays([[1, 2, 3], [1, 2]], "rgb")
    with pytest.raises(PreprocessError, match=r"'rgb', row 0: not a numeric array"):
        stack_arrays([["a", "b"]], "rgb")
    with pytest.raises(PreprocessError, match=r"'rgb', row 5: missing array"):
        stack_arrays([None], "rgb", row_ids=[5])
    with pytest.raises(PreprocessError, match="NaN"):
        stack_arrays([[1.0, float("nan")]], "rgb")
    assert dependent_vartype([[0, 1], [1, 0]]) == "array"
    assert dependent_vartype([3, 4]) == "integer"
