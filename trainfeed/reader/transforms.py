"""Transformers and augmentors (the Barrage design) applied to batches at read time.

A transformer is fitted once on training records (e.g. the mean and standard deviation of a
field), saved with the dataset (`<dataset>/transformers/<name>.json`, so every worker and the
validation and scoring readers apply the same numbers), applied to every batch, and can undo
itself on predictions. An augmentor is a chain of importable functions `f(batch, rng, **params)`
applied to training batches only (mode "train"); its random draws come from (seed, epoch,
batch), so the same seed gives the same augmented epoch.
"""
from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainfeed.storage import Storage

Batch = dict[str, Any]
TRANSFORMERS_DIR = "transformers"
AugmentStep = str | tuple[str, dict[str, Any]]


@dataclass
class Standardize:
    """(x - mean) / std per field; per channel (last axis) for arrays of rank ≥ 2 per record.

    Fit it with `fit_transformer`; until then `apply` refuses (an unfitted transformer would
    silently train on other numbers than validation uses)."""

    fields: tuple[str, ...]
    mean: dict[str, list[float]] = field(default_factory=dict)
    std: dict[str, list[float]] = field(default_factory=dict)
    kind: str = "standardize"

    def __post_init__(self) -> None:
        self.fields = tuple(self.fields)

    @property
    def fitted(self) -> bool:
        return all(f in self.mean for f in self.fields)

    def fit(self, batches: Iterable[Batch]) -> Standardize:
        """Streams the batches once (float64 sums), then stores mean and std per field."""
        sums: dict[str, np.ndarray] = {}
        squares: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for batch in batches:
            for name in self.fields:
                values = np.asarray(batch[name], dtype=np.float64)
                flat = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else \
                    values.reshape(-1, 1)
                sums[name] = sums.get(name, 0) + flat.sum(axis=0)
                squares[name] = squares.get(name, 0) + (flat * flat).sum(axis=0)
                counts[name] = counts.get(name, 0) + len(flat)
        for name in self.fields:
            if not counts.get(name):
                raise ValueError(f"cannot fit on field {name!r}: no records")
            mean = sums[name] / counts[name]
            var = np.maximum(squares[name] / counts[name] - mean * mean, 0.0)
            self.mean[name] = mean.tolist()
            self.std[name] = np.where(var > 0, np.sqrt(var), 1.0).tolist()
        return self

    def apply(self, batch: Batch) -> Batch:
        if not self.fitted:
            raise ValueError(f"transformer over {list(self.fields)} is not fitted "
                             f"(fit_transformer(reader, transformer) first)")
        out = dict(batch)
        for name in self.fields:
            mean, std = self._stats(name, out[name])
            out[name] = ((np.asarray(out[name], dtype=np.float32) - mean) / std).astype(
                np.float32)
        return out

    def inverse(self, name: str, values: Any) -> np.ndarray:
        """Undoes `apply` on `values` of field `name` (e.g. a model's predictions)."""
        mean, std = self._stats(name, values)
        return np.asarray(values, dtype=np.float32) * std + mean

    def _stats(self, name: str, values: Any) -> tuple[np.ndarray, np.ndarray]:
        mean = np.asarray(self.mean[name], dtype=np.float32)
        std = np.asarray(self.std[name], dtype=np.float32)
        if np.ndim(values) <= 1:  # scalars per record: one statistic
            return mean[0], std[0]
        return mean, std

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "fields": list(self.fields), "mean": self.mean,
                "std": self.std}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Standardize:
        if data.get("kind") != "standardize":
            raise ValueError(f"not a standardize transformer: {str(data)[:100]}")
        return cls(tuple(data["fields"]), dict(data["mean"]), dict(data["std"]))


def fit_transformer(reader: Any, transformer: Standardize) -> Standardize:
    """Fits `transformer` on one pass of `reader` (a batching reader over training records)."""
    if getattr(reader, "options", None) is None or reader.options.batch.size is None:
        raise ValueError("fit_transformer needs a reader with batch_size set")
    return transformer.fit(reader())


def save_transformer(dataset_folder: Storage, name: str, transformer: Standardize) -> None:
    """Writes it next to the dataset's manifest (atomically), for every reader to load."""
    _check_name(name)
    dataset_folder.write_atomic(f"{TRANSFORMERS_DIR}/{name}.json",
                                json.dumps(transformer.to_dict(), indent=1).encode())


def load_transformer(dataset_folder: Storage, name: str) -> Standardize:
    _check_name(name)
    try:
        data = dataset_folder.read_bytes(TRANSFORMERS_DIR, f"{name}.json")
    except FileNotFoundError:
        raise FileNotFoundError(f"no transformer {name!r} saved with dataset "
                                f"{dataset_folder.url} (save_transformer first)") from None
    return Standardize.from_dict(json.loads(data))


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"transformer name {name!r}: one path segment, not starting with '.'")


class Augmentor:
    """Importable functions `module:function` (with params) applied in order to a batch."""

    def __init__(self, steps: Sequence[AugmentStep]):
        self.steps: list[tuple[Callable[..., Batch], dict[str, Any]]] = []
        for step in steps:
            path, params = (step, {}) if isinstance(step, str) else step
            self.steps.append((_resolve(path), dict(params)))

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        for function, params in self.steps:
            batch = function(batch, rng=rng, **params)
        return batch


def _resolve(path: str) -> Callable[..., Batch]:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"augmentation {path!r} is not an importable function "
                         f"('package.module:function'): {e}") from e
    if not callable(function):
        raise ValueError(f"augmentation {path!r} is not callable")
    return function  # type: ignore[no-any-return]
