"""The MADlib documentation's example (training_preprocessor_dl): 52 rows of 2x2 RGB images,
species {bird, cat, dog}, as nested and as flat arrays."""
from __future__ import annotations

import numpy as np
import pytest

from trainfeed.preprocess.buffers import plan_buffers
from trainfeed.preprocess.encoding import (
    PreprocessError,
    class_values,
    one_hot,
    real_classes,
    stack_arrays,
    unknown_classes,
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
    assert classes == ["bird", "cat", "dog"]
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
    with pytest.raises(PreprocessError, match=r"invalid num_classes value specified \(2\); it "
                                              r"must be equal to or greater than the distinct "
                                              r"class values found in the table \(3"):
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
    with pytest.raises(PreprocessError, match="must be > 0"):
        stack_arrays([[1.0]], "rgb", normalizing_const=-1.0)


# MADlib's install check (deep_learning/test/input_data_preprocessor.sql_in), table
# data_preprocessor_input: the labels of its 17 rows.
MADLIB_Y = [4, 3, 8, 2, 5, 6, 2, 10, 3, 7, 6, -6, 9, 0, 12, -3, -1]
MADLIB_Y1 = [True] * 3 + [False] + [True] * 5 + [False] + [True] * 5 + [False, True]
MADLIB_Y2 = list("acaabaaabaaacaaab")
MADLIB_Y3 = [4.0, 4.2, 4.0, 4.2, 4.0, 5.0, 4.0, 4.0, 4.0, 5.0, 4.0, 4.0, 4.0, 5.0, 4.0, 4.2, 4.0]
# data_preprocessor_input_null: text labels with four NULLs
MADLIB_NULL_LABELS = ["a", "a", None, "a", "a", "a", "a", None, "a", "a", None, "a",
                      "b", "b", "b", "b", None]


def test_madlibs_class_values_for_integer_boolean_text_and_double_labels() -> None:
    # y with num_classes 16: '{-6,-3,-1,0,2,3,4,5,6,7,8,9,10,12,NULL,NULL}'
    assert class_values(MADLIB_Y, "y", 16) == [-6, -3, -1, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12,
                                               None, None]
    assert class_values(MADLIB_Y1, "y1") == [False, True]  # '{f,t}', 2 classes
    assert class_values(MADLIB_Y2, "y2") == ["a", "b", "c"]
    assert class_values(MADLIB_Y3, "y3") == [4.0, 4.2, 5.0]
    # validation_input's one row (y_new = 4) against y's classes: '{0,0,0,0,0,0,1,0,…}'
    y = one_hot([4], class_values(MADLIB_Y, "y", 16), "y_new")
    assert y.tolist() == [[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("labels,want", [
    (MADLIB_NULL_LABELS, [None, "a", "b"]),
    ([3, None, 1], [None, 1, 3]),
    ([True, None], [None, True]),
    ([2.5, None, 0.5], [None, 0.5, 2.5]),
    ([None], [None]),
])
def test_null_is_a_class_sorted_first(labels: list, want: list) -> None:
    classes = class_values(labels, "label")
    assert classes == want and real_classes(classes) == want
    y = one_hot(labels, classes, "label")
    assert y.shape == (len(labels), len(want)) and (y.sum(axis=1) == 1).all()
    assert [classes[i] for i in y.argmax(axis=1)] == labels


def test_null_class_with_num_classes_padding_as_madlib() -> None:
    # num_classes 5 over {NULL, a, b}: '{NULL,a,b,NULL,NULL}'; NULL is one-hot column 0.
    classes = class_values(MADLIB_NULL_LABELS, "label", num_classes=5)
    assert classes == [None, "a", "b", None, None]
    assert real_classes(classes) == [None, "a", "b"]  # strip_trailing_nulls_from_class_values
    assert one_hot(["a", "b", "b", None], classes, "label").tolist() == [
        [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0]]
    # one NULL row, num_classes 3: '{NULL,NULL,NULL}', the row encoded '{1,0,0}'
    only_null = class_values([None], "label", num_classes=3)
    assert only_null == [None, None, None]
    assert one_hot([None], only_null, "label").tolist() == [[1, 0, 0]]
    # NULL counts toward num_classes: 3 distinct values do not fit in 2
    with pytest.raises(PreprocessError, match=r"\(3, NULL included\)"):
        class_values(MADLIB_NULL_LABELS, "label", num_classes=2)


def test_padding_is_not_a_null_class() -> None:
    classes = class_values(["a", "b"], "label", num_classes=4)
    assert classes == ["a", "b", None, None] and real_classes(classes) == ["a", "b"]
    with pytest.raises(PreprocessError, match="class None is not among"):
        one_hot([None], classes, "label")
    assert unknown_classes([None, "a", "c"], classes, "label") == [None, "c"]


def test_booleans_are_not_numbers_and_ints_match_floats() -> None:
    assert unknown_classes([1, 0], [False, True], "y") == [0, 1]
    assert unknown_classes([4], [4.0, 4.2], "y") == []
    assert one_hot([4], [4.0, 4.2], "y").tolist() == [[1, 0]]


def test_class_values_are_plain_json_values() -> None:
    from decimal import Decimal

    assert class_values([Decimal("2"), Decimal("1.5"), np.int16(3)], "y") == [1.5, 2, 3]
    with pytest.raises(PreprocessError, match="NaN class value"):
        class_values([1.0, float("nan")], "y")
    with pytest.raises(PreprocessError, match="class values must be text, numbers or booleans"):
        class_values([b"x"], "y")
