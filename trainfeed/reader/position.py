"""Where a reader stands in an epoch: what `reader.state()` returns and a restored reader resumes.

A trainer saves it with each checkpoint. Restoring it after a crash continues the epoch with the
records the checkpointed model had not seen, and only those: partitions consumed before the
checkpoint are skipped, a partition in the trainer's hands resumes after exactly the records it
had, and (through the master) whatever the crashed reader consumed after the checkpoint is handed
out again. It is a small JSON-able dict: partitions, not records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

POSITION_VERSION = 1
MODES = ("local", "distributed")


@dataclass
class ReaderPosition:
    """One reader's place in one epoch.

    `done`: partitions whose every record the trainer was handed; `positions`: partitions in
    its hands, and how many leading records of each it was handed; `finished`: the pass over
    `epoch` ran to its end (a restored reader starts the next epoch).
    """

    mode: str
    dataset: str
    epoch: int
    done: set[int] = field(default_factory=set)
    positions: dict[int, int] = field(default_factory=dict)
    finished: bool = False
    job: str = ""
    worker: str = ""  # distributed: the worker id whose later work a restore undoes
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"version": POSITION_VERSION, "mode": self.mode, "dataset": self.dataset,
                "job": self.job, "worker": self.worker, "seed": self.seed, "epoch": self.epoch,
                "finished": self.finished, "done": sorted(self.done),
                "positions": {str(p): n for p, n in sorted(self.positions.items())}}

    @classmethod
    def from_dict(cls, state: dict[str, Any], dataset: str, mode: str) -> ReaderPosition:
        """Validates a saved state against the reader restoring it."""
        if not isinstance(state, dict) or state.get("version") != POSITION_VERSION:
            raise ValueError(f"not a trainfeed reader state (version {POSITION_VERSION}): "
                             f"{str(state)[:200]}")
        if state["dataset"] != dataset:
            raise ValueError(f"reader state is of dataset {state['dataset']!r}, not {dataset!r}")
        if state["mode"] != mode:
            raise ValueError(f"reader state was saved by a {state['mode']} reader; this one is "
                             f"{mode} (TRAIN_LOCAL must match between save and restore)")
        try:
            return cls(mode=mode, dataset=dataset, epoch=int(state["epoch"]),
                       done={int(p) for p in state["done"]},
                       positions={int(p): int(n) for p, n in state["positions"].items()},
                       finished=bool(state["finished"]), job=str(state.get("job", "")),
                       worker=str(state.get("worker", "")), seed=int(state.get("seed", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed reader state ({type(e).__name__}: {e})") from e

    @property
    def next_epoch(self) -> int:
        return self.epoch + 1 if self.finished else self.epoch
