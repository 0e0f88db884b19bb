"""Synchronous data-parallel training: who this process is in its group, and what it reads.

In all-reduce training (PyTorch DDP under torchrun, Horovod, `tf.distribute.
MultiWorkerMirroredStrategy`) every rank must take the same number of steps per epoch, or the
rank that runs out first leaves the others hanging in their next all-reduce. So a synchronous
reader takes exactly `steps × batch_size` records per epoch, where `steps = records //
(world_size × batch_size)`; the rest of the epoch (fewer than `world_size × batch_size`
records, the last ones of its shuffled partition order) is dropped, and counted.

Where the group comes from, first match wins: `world_size=`/`rank=` arguments; torchrun's
`WORLD_SIZE`/`RANK`; `TF_CONFIG` (its chief, then its workers, are ranks 0, 1, …: the order
MultiWorkerMirroredStrategy numbers them); else a group of one (a laptop).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from trainfeed import settings
from trainfeed.errors import ConfigurationError

# TF_CONFIG task types that train (take batches); "ps" and "evaluator" do not.
TRAINING_ROLES = ("chief", "worker")


@dataclass(frozen=True)
class SyncGroup:
    """A synchronous reader's group: `world_size` ranks taking `batch_size` records a step."""

    world_size: int
    rank: int
    batch_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.batch_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"synchronous group: need world_size ≥ 1, batch_size ≥ 1 and "
                             f"0 ≤ rank < world_size, got world_size={self.world_size}, "
                             f"rank={self.rank}, batch_size={self.batch_size}")

    def steps(self, records: int) -> int:
        """Batches every rank takes in an epoch of `records` records."""
        return records // (self.world_size * self.batch_size)

    def quota(self, records: int) -> int:
        """Records every rank takes in an epoch of `records` records."""
        return self.steps(records) * self.batch_size

    def kept(self, records: int) -> int:
        """Records an epoch of `records` delivers to the whole group; the rest is dropped."""
        return self.quota(records) * self.world_size

    def share(self, records: int) -> tuple[int, int]:
        """This rank's records [start, stop) of the epoch's record order, when the split is
        static (a local reader: no master to balance)."""
        quota = self.quota(records)
        return self.rank * quota, (self.rank + 1) * quota


def detect_world(world_size: int | None = None, rank: int | None = None,
                 environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(world_size, rank) of this process: the arguments, else WORLD_SIZE/RANK, else
    TF_CONFIG, else (1, 0).

    Raises:
        ValueError: only one of world_size/rank is given, or they are out of range.
        ConfigurationError: WORLD_SIZE without RANK (or the reverse), or a TF_CONFIG that does
            not parse or names no training task.
    """
    if (world_size is None) != (rank is None):
        raise ValueError("pass world_size and rank together (or neither: they come from "
                         "WORLD_SIZE/RANK, set by torchrun, or TF_CONFIG)")
    if world_size is not None and rank is not None:
        return _checked(world_size, rank, "world_size=/rank=")
    env_world, env_rank = settings.WORLD_SIZE.get(environ), settings.RANK.get(environ)
    if env_world is not None or env_rank is not None:
        if env_world is None or env_rank is None:
            raise ConfigurationError(f"${settings.WORLD_SIZE.name} and ${settings.RANK.name} "
                                     "must be set together (torchrun sets both)")
        return _checked(env_world, env_rank, "$WORLD_SIZE/$RANK")
    tf_config = settings.TF_CONFIG.get(environ)
    if tf_config is not None:
        return _from_tf_config(tf_config)
    return 1, 0


def _checked(world_size: int, rank: int, source: str) -> tuple[int, int]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"{source}: rank {rank} of world size {world_size}: need world size "
                         f"≥ 1 and 0 ≤ rank < world size")
    return world_size, rank


def _from_tf_config(text: str) -> tuple[int, int]:
    """(world_size, rank) from TF_CONFIG: the chief and the workers are the ranks."""
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        kind, index = task["type"], int(task["index"])
        counts = {role: len(cluster.get(role, ())) for role in TRAINING_ROLES}
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigurationError(f"${settings.TF_CONFIG.name} is not TensorFlow's cluster JSON "
                                 f"({type(e).__name__}: {e})") from None
    if kind not in TRAINING_ROLES:
        raise ConfigurationError(f"${settings.TF_CONFIG.name}: task type {kind!r} takes no "
                                 f"batches; a synchronous reader runs in {TRAINING_ROLES}")
    world = counts["chief"] + counts["worker"]
    rank = index if kind == "chief" else counts["chief"] + index
    if not 0 <= rank < world:
        raise ConfigurationError(f"${settings.TF_CONFIG.name}: task {kind} {index} is not in "
                                 f"its cluster ({counts})")
    return world, rank
