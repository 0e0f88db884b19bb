"""Class rebalancing by under- and over-sampling (the design note on imbalanced data).

From the source label distribution A (the manifest's histogram) and a target B, each class c
gets a ratio factor p_c = B_c / A_c. A record of class c is emitted floor(p_c) times plus once
more with probability frac(p_c): p < 1 under-samples (kept with probability p), p > 1
over-samples. Since sum_c A_c p_c = sum_c B_c = 1, an epoch keeps its expected size.

Decisions are drawn from (seed, epoch, partition) alone, so a partition re-leased to another
worker (after a crash) makes the same decisions, and the same seed gives the same epoch.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from trainfeed.errors import ConfigurationError

Target = str | Mapping[str, float] | float
# Mixed into the seed so that resampling draws are independent of the shuffle's.
_STREAM = 0x5E5A


def target_distribution(source: Mapping[str, int], target: Target) -> dict[str, float]:
    """B as probabilities over the source's classes.

    `target`: "uniform" (over the classes that have records); a dict class -> weight (classes
    left out get weight 0: never emitted); or a number alpha, B ∝ A^alpha (0: uniform, 1:
    unchanged, 0.5: between).

    Raises:
        ConfigurationError (a ValueError): an empty histogram or a negative count; an unknown
            target name; a dict naming a class the dataset lacks, giving weight to a class
            without records, or a weight that is negative, NaN or infinite; an alpha that is not
            finite; a target giving every class weight 0.
    """
    classes = _checked_classes(source)
    if isinstance(target, str):
        weights = _uniform_weights(source, classes, target)
    elif isinstance(target, Mapping):
        weights = _named_weights(source, classes, target)
    else:
        weights = _power_weights(source, classes, target)
    total = sum(weights.values())
    if total <= 0:
        raise ConfigurationError("resample target gives every class weight 0")
    return {c: w / total for c, w in weights.items()}


def _checked_classes(source: Mapping[str, int]) -> list[str]:
    """The histogram's classes, sorted, once it is known to hold records and no negative
    count."""
    classes = sorted(source)
    for c in classes:
        if source[c] < 0:
            raise ConfigurationError(f"label histogram: class {c!r} has a negative count "
                                     f"{source[c]}")
    if not classes or sum(source.values()) <= 0:
        raise ConfigurationError("resampling needs a label histogram with at least one record")
    return classes


def _uniform_weights(source: Mapping[str, int], classes: list[str],
                     target: str) -> dict[str, float]:
    """A named target: "uniform" is the only name."""
    if target != "uniform":
        raise ConfigurationError(
            f"resample target {target!r}: expected 'uniform', a dict of class -> weight, or "
            f"a power of the source distribution")
    # Only classes with records: an empty class cannot be emitted, and a share of B given
    # to it would shrink every epoch instead of rebalancing it.
    return {c: float(source[c] > 0) for c in classes}


def _named_weights(source: Mapping[str, int], classes: list[str],
                   target: Mapping[str, float]) -> dict[str, float]:
    """A dict class -> weight: every class named exists, every weight is finite and ≥ 0, and
    only classes with records get weight."""
    unknown = sorted(set(target) - set(classes))
    if unknown:
        raise ConfigurationError(
            f"resample target names classes {unknown[:5]} that the dataset does not have "
            f"(classes: {classes[:10]})")
    for c, w in sorted(target.items()):
        if not (isinstance(w, numbers.Real) and math.isfinite(w) and w >= 0):
            raise ConfigurationError(f"resample target weight of class {c!r} is {w!r}: "
                                     f"weights must be finite numbers ≥ 0")
        if w > 0 and source[c] == 0:
            raise ConfigurationError(
                f"resample target gives class {c!r} weight {w!r}, but the dataset has no "
                f"record of it to emit: give it weight 0 or leave it out")
    return {c: float(target.get(c, 0.0)) for c in classes}


def _power_weights(source: Mapping[str, int], classes: list[str],
                   target: float) -> dict[str, float]:
    """A number alpha: B ∝ A^alpha over the classes with records."""
    alpha = float(target)
    if not math.isfinite(alpha):
        raise ConfigurationError(f"resample target power {alpha}: expected a finite number")
    return {c: float(source[c]) ** alpha if source[c] > 0 else 0.0 for c in classes}


def ratio_factors(source: Mapping[str, int], target: Target) -> dict[str, float]:
    """p_c = B_c / A_c for every class of the source (0 for a class B drops)."""
    b = target_distribution(source, target)
    n = sum(source.values())
    return {c: (b[c] / (source[c] / n) if source[c] > 0 else 0.0) for c in sorted(source)}


class Resampler:
    """Per-record copy counts from class ids, reproducible per (seed, epoch, partition)."""

    def __init__(self, factors: np.ndarray, seed: int):
        self.factors = np.asarray(factors, dtype=np.float64)
        if self.factors.ndim != 1 or not np.isfinite(self.factors).all() or (
                self.factors < 0).any():
            raise ValueError(f"ratio factors must be a 1-d array of finite numbers ≥ 0 (one "
                             f"per class id), got {self.factors.tolist()[:10]}")
        self.seed = seed

    def copies(self, class_ids: np.ndarray, epoch: int, partition: int) -> np.ndarray:
        """How many times to emit each record: 0 drops it.

        Raises:
            ValueError: a class id outside [0, number of factors) (numpy would silently take
                a negative id from the end).
        """
        class_ids = np.asarray(class_ids, dtype=np.int64)
        if len(class_ids) and (class_ids.min() < 0 or class_ids.max() >= len(self.factors)):
            bad = class_ids[(class_ids < 0) | (class_ids >= len(self.factors))]
            raise ValueError(f"class id {int(bad[0])} of partition {partition} is not one of "
                             f"the {len(self.factors)} classes [0, {len(self.factors)})")
        p = self.factors[class_ids]
        base = np.floor(p)
        rng = np.random.default_rng((self.seed, _STREAM, epoch, partition))
        return (base + (rng.random(len(p)) < (p - base))).astype(np.int64)
