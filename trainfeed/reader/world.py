"""Synchronous data-parallel training: who this process is in its group, and what it reads.

In all-reduce training (PyTorch DDP under torchrun, Horovod, `tf.distribute.
MultiWorkerMirroredStrategy`) every rank must take the same number of steps per epoch, or the
rank that runs out first leaves the others hanging in their next all-reduce. So a synchronous
reader takes exactly `steps × batch_size` records per epoch, where `steps = records //
(world_size × batch_size)`; the rest of the epoch (fewer than `world_size × batch_size`
records, the last ones of its shuffled partition order) is dropped, and counted.

Where the group comes from (`locate`): the arguments (`SyncOptions(world_size=, rank=)`); an
initialised `torch.distributed` process group (`torch.multiprocessing.spawn` +
`init_process_group(rank=, world_size=)` sets no environment: without it each rank read the
whole epoch, issue 26); the environment: torchrun's `WORLD_SIZE`/`RANK`, else SLURM's
`SLURM_NTASKS`/`SLURM_PROCID`, else `TF_CONFIG` (its chief, then its workers, are ranks 0, 1, …:
the order MultiWorkerMirroredStrategy numbers them); else a group of one (a laptop). Sources that
are set must agree: two that disagree are refused, each named with its value, rather than one
silently winning, so none overrides another. (SLURM's and TF_CONFIG's numbers describe the
launcher's tasks, which torch.distributed may subdivide, as torchrun inside `srun` does: they
are consulted only when neither torch.distributed nor WORLD_SIZE/RANK is set.)
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from trainfeed import settings
from trainfeed.errors import ConfigurationError
from trainfeed.reader.checks import check_int

# TF_CONFIG task types that train (take batches); "ps" and "evaluator" do not.
TRAINING_ROLES = ("chief", "worker")


@dataclass(frozen=True)
class SyncOptions:
    """Synchronous data-parallel training (DDP, Horovod, MultiWorkerMirroredStrategy).

    Every rank yields exactly `reader.steps_per_epoch` full batches per epoch,
    records // (world_size × batch_size), while the master balances partitions between the
    ranks; the rest of each epoch (fewer than world_size × batch_size records) is dropped and
    counted in `reader.dropped_per_epoch`. Needs a batch size; not with resampling or
    `decode_errors="skip"` (either would change a rank's record count). Read locally, each rank
    reads its own contiguous share of every epoch's order.

    Where the process stands comes from these arguments first, then from an initialised
    torch.distributed and the environment (torchrun's WORLD_SIZE/RANK, else SLURM_NTASKS/
    SLURM_PROCID, else TF_CONFIG); sources that are set must agree (see `locate`). None of them:
    a group of one.

    Attributes:
        world_size: Processes in the training group. None: from torch.distributed or the
            environment. Given with `rank`, or neither.
        rank: This process's rank in the group, 0-based. None: likewise.

    Example:
        >>> SyncOptions(world_size=4, rank=1)
        SyncOptions(world_size=4, rank=1)
        >>> SyncOptions(world_size=4)
        Traceback (most recent call last):
        ...
        ValueError: SyncOptions: pass world_size and rank together (or neither: they come from \
torch.distributed, WORLD_SIZE/RANK set by torchrun, SLURM, or TF_CONFIG), got world_size=4, \
rank=None
    """

    world_size: int | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_size", check_int(
            "SyncOptions.world_size", self.world_size, 1, none="from the environment"))
        object.__setattr__(self, "rank", check_int(
            "SyncOptions.rank", self.rank, 0, none="from the environment"))
        if (self.world_size is None) != (self.rank is None):
            raise ValueError(f"SyncOptions: {_TOGETHER}, got world_size={self.world_size}, "
                             f"rank={self.rank}")
        if self.world_size is not None and self.rank is not None \
                and self.rank >= self.world_size:
            raise ValueError(f"SyncOptions.rank must be < world_size ({self.world_size}), got "
                             f"{self.rank}")


_TOGETHER = ("pass world_size and rank together (or neither: they come from torch.distributed, "
             "WORLD_SIZE/RANK set by torchrun, SLURM, or TF_CONFIG)")


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
    """(world_size, rank) of this process: see `locate` (which also says where it came from)."""
    world, index, _ = locate(world_size, rank, environ)
    return world, index


def locate(world_size: int | None = None, rank: int | None = None,
           environ: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """(world_size, rank, where they came from) of this process: an initialised
    torch.distributed, the environment (WORLD_SIZE/RANK, else SLURM_NTASKS/SLURM_PROCID, else
    TF_CONFIG), the arguments; else (1, 0, "default").

    Raises:
        ValueError: only one of world_size/rank is given, or they are out of range.
        ConfigurationError: two sources disagree (each is named with its values); WORLD_SIZE
            without RANK (or the reverse), or a TF_CONFIG that does not parse or names no
            training task.
    """
    if (world_size is None) != (rank is None):
        raise ValueError(_TOGETHER)
    found: list[tuple[int, int, str]] = []
    torch_group = _from_torch()
    if torch_group is not None:
        found.append((*torch_group, "torch.distributed (init_process_group)"))
    env = _from_environment(environ, launcher=torch_group is None)
    if env is not None:
        found.append(env)
    if world_size is not None and rank is not None:
        found.append((*_checked(world_size, rank, "world_size=/rank="), "world_size=/rank="))
    if not found:
        return 1, 0, "default (a group of one)"
    first = found[0]
    differ = [f for f in found[1:] if f[:2] != first[:2]]
    if differ:
        said = "; ".join(f"{source} says rank {r} of world size {w}" for w, r, source in found)
        raise ConfigurationError(
            f"synchronous reader: where this process stands in its group is given twice, "
            f"differently: {said}. Make them agree, or drop all but one (torch.distributed, "
            f"when initialised, is the one the trainer all-reduces with)")
    return first


def _from_torch() -> tuple[int, int] | None:
    """(world_size, rank) of torch.distributed's default group, if this process initialised one.
    Never imports torch: a process that did not import torch.distributed has no group."""
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is None:
        return None
    try:
        if not (torch_dist.is_available() and torch_dist.is_initialized()):
            return None
        return int(torch_dist.get_world_size()), int(torch_dist.get_rank())
    except (AttributeError, RuntimeError, ValueError):
        return None


def _from_environment(environ: Mapping[str, str] | None,
                      launcher: bool) -> tuple[int, int, str] | None:
    """(world_size, rank, variables) from WORLD_SIZE/RANK; with `launcher`, else from SLURM's
    task numbers, else TF_CONFIG; None if none is set."""
    env_world, env_rank = settings.WORLD_SIZE.get(environ), settings.RANK.get(environ)
    if env_world is not None or env_rank is not None:
        if env_world is None or env_rank is None:
            raise ConfigurationError(f"${settings.WORLD_SIZE.name} and ${settings.RANK.name} "
                                     "must be set together (torchrun sets both)")
        source = f"${settings.WORLD_SIZE.name}/${settings.RANK.name}"
        return (*_checked(env_world, env_rank, source), source)
    if not launcher:
        return None
    tasks, task = settings.SLURM_NTASKS.get(environ), settings.SLURM_PROCID.get(environ)
    if tasks is not None and task is not None:
        source = f"${settings.SLURM_NTASKS.name}/${settings.SLURM_PROCID.name}"
        return (*_checked(tasks, task, source), source)
    tf_config = settings.TF_CONFIG.get(environ)
    if tf_config is not None:
        return (*_from_tf_config(tf_config), f"${settings.TF_CONFIG.name}")
    return None


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
