"""The order of an epoch: which partition comes when, derived from (seed, epoch) alone.

The master's ledger deals an epoch's partitions out in this order, and a local reader reads
them in it, so that `TRAIN_LOCAL=1` and a cluster shuffle alike, and a restarted master or
reader recomputes an epoch's order instead of storing it.
"""
from __future__ import annotations

import numpy as np

__all__ = ["epoch_order"]


def epoch_order(num_partitions: int, seed: int, epoch: int) -> list[int]:
    """The partition order of an epoch: a permutation derived from (seed, epoch) alone."""
    return [int(p) for p in np.random.default_rng((seed, epoch)).permutation(num_partitions)]
