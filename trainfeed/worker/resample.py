"""Class rebalancing by under- and over-sampling (the design note on imbalanced data).

From the source label distribution A (the manifest's histogram) and a target B, each class c
gets a ratio factor p_c = B_c / A_c. A record of class c is emitted floor(p_c) times plus once
more with probability frac(p_c): p < 1 under-samples (kept with probability p), p > 1
over-samples. Since sum_c A_c p_c = sum_c B_c = 1, an epoch keeps its expected size.

Decisions are drawn from (seed, epoch, partition) alone, so a partition re-leased to another
worker (after a crash) makes the same decisions, and the same seed gives the same epoch.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

Target = str | Mapping[str, float] | float
# Mixed into the seed so that resampling draws are independent of the shuffle's.
_STREAM = 0x5E5A


def target_distribution(source: Mapping[str, int], target: Target) -> dict[str, float]:
    """B as probabilities over the source's classes.

    `target`: "uniform"; a dict class -> weight (classes left out get weight 0: never emitted);
    or a number alpha, B ∝ A^alpha (0: uniform, 1: unchanged, 0.5: between)."""
    classes = sorted(source)
    if not classes or sum(source.values()) <= 0:
        raise ValueError("resampling needs a label histogram with at least one record")
    if isinstance(target, str):
        if target != "uniform":
            raise ValueError(f"resample target {target!r}: expected 'uniform', a dict of "
                             f"class -> weight, or a power of the source distribution")
        weights = {c: 1.0 for c in classes}
    elif isinstance(target, Mapping):
        unknown = sorted(set(target) - set(classes))
        if unknown:
            raise ValueError(f"resample target names classes {unknown[:5]} that the dataset "
                             f"does not have (classes: {classes[:10]})")
        if any(w < 0 for w in target.values()):
            raise ValueError("resample target weights must be ≥ 0")
        weights = {c: float(target.get(c, 0.0)) for c in classes}
    else:
        alpha = float(target)
        weights = {c: float(source[c]) ** alpha if source[c] > 0 else 0.0 for c in classes}
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("resample target gives every class weight 0")
    return {c: w / total for c, w in weights.items()}


def ratio_factors(source: Mapping[str, int], target: Target) -> dict[str, float]:
    """p_c = B_c / A_c for every class of the source (0 for a class B drops)."""
    b = target_distribution(source, target)
    n = sum(source.values())
    return {c: (b[c] / (source[c] / n) if source[c] > 0 else 0.0) for c in sorted(source)}


class Resampler:
    """Per-record copy counts from class ids, reproducible per (seed, epoch, partition)."""

    def __init__(self, factors: np.ndarray, seed: int):
        self.factors = np.asarray(factors, dtype=np.float64)
        self.seed = seed

    def copies(self, class_ids: np.ndarray, epoch: int, partition: int) -> np.ndarray:
        """How many times to emit each record: 0 drops it."""
        p = self.factors[class_ids]
        base = np.floor(p)
        rng = np.random.default_rng((self.seed, _STREAM, epoch, partition))
        return (base + (rng.random(len(p)) < (p - base))).astype(np.int64)
