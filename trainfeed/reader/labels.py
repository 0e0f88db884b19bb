"""Labels to integer class ids, the same on every worker and in validation.

Class values come from the dataset version's manifest (`Manifest.classes`: its labels in the
dataset's label order, trainfeed.formats.labels, integer labels by value, others as text; an
append's new labels after them): every reader of a version derives the same ids without talking
to the others, and a validation set that lacks some
classes still maps the ones it has to the training ids when given the training class values.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainfeed.errors import UnknownLabelError
from trainfeed.formats.labels import STRING_ORDER, sorted_labels


class ClassIndex:
    """Class values and the mapping of labels to ids 0..K-1: `values[i]` is class i."""

    def __init__(self, values: Iterable[str]):
        """`values` in class-id order, each once (e.g. a training reader's `class_values`)."""
        self.values: tuple[str, ...] = tuple(map(str, values))
        if not self.values:
            raise ValueError("no class values (the dataset has no label histogram)")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"class values must be distinct, got {list(self.values)[:20]}")
        self._value_set = pa.array(self.values, pa.string())

    @classmethod
    def from_histogram(cls, histogram: Mapping[str, int],
                       order: str = STRING_ORDER) -> ClassIndex:
        """The dataset's labels in its label order (a manifest's `label_order`)."""
        return cls(sorted_labels(histogram, order))

    @property
    def num_classes(self) -> int:
        return len(self.values)

    def ids(self, labels: pa.Array | pa.ChunkedArray | Sequence[str],
            where: str | Callable[[], str] = "") -> np.ndarray:
        """int64 class ids of `labels` (vectorized: no Python loop per record). `where` names
        the labels in an error; a callable is only called then (naming a record may read its
        source file, which the hot path must not pay for)."""
        array = labels if isinstance(labels, pa.Array | pa.ChunkedArray) else pa.array(
            labels, pa.string())
        index = pc.index_in(array, value_set=self._value_set)
        if index.null_count:
            missing = pc.filter(array, pc.is_null(index))
            if callable(where):
                where = where()
            raise UnknownLabelError(
                f"{where + ': ' if where else ''}label {missing[0].as_py()!r} is not one of the "
                f"{self.num_classes} class values {list(self.values)[:10]}")
        return np.asarray(index.to_numpy(zero_copy_only=False), dtype=np.int64)

    def one_hot(self, ids: np.ndarray, dtype: type = np.float32) -> np.ndarray:
        out: np.ndarray = np.zeros((len(ids), self.num_classes), dtype=dtype)
        out[np.arange(len(ids)), ids] = 1
        return out
