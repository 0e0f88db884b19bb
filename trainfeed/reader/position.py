"""Where a reader stands in an epoch: what `reader.state()` returns and a restored reader resumes.

A trainer saves it with each checkpoint. Restoring it after a crash continues the epoch with the
records the checkpointed model had not seen, and only those: partitions consumed before the
checkpoint are skipped, a partition in the trainer's hands resumes after exactly the records it
had, and (through the master) whatever the crashed reader consumed after the checkpoint is handed
out again. It is a small JSON-able dict: partitions, not records. "Records it had" count in the
partition's delivery order (see trainfeed.reader.batcher), which `order` names, so that a state is
never restored into a reader that would deliver partitions in another order.

Two shapes of the same content: `to_dict()` (version 1, what `Reader.state()` always returned:
`positions` maps partitions to counts) and `to_state_dict()` (version 2, `Reader.state_dict()`:
`positions` is a list of [partition, count] pairs). Version 2 has the same keys whatever the
position, which torch.distributed.checkpoint needs: it loads a checkpoint into the structure of a
fresh reader's `state_dict()`, and would drop per-partition keys that a fresh reader lacks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

POSITION_VERSION = 1
STATE_DICT_VERSION = 2
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
    order: str = ""  # the delivery order counts refer to ("" in states older than it: any)
    # Records handed to the trainer in batches this epoch: a synchronous rank's progress toward
    # its quota (trainfeed.reader.world), so that a restored rank takes the rest of it.
    delivered: int = 0
    # How many partitions the plan that `done` and `positions` name had (local readers; 0 in
    # states older than sliced partitions, and in distributed ones: the master keeps its plan).
    partitions: int = 0
    # Distributed: the resume credential the master gave `worker`'s session, without which the
    # master refuses to rewind that session's work ("" in states older than it, and local ones).
    credential: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"version": POSITION_VERSION, "mode": self.mode, "dataset": self.dataset,
                "job": self.job, "worker": self.worker, "seed": self.seed, "epoch": self.epoch,
                "finished": self.finished, "done": sorted(self.done),
                "positions": {str(p): n for p, n in sorted(self.positions.items())},
                "order": self.order, "delivered": self.delivered,
                "partitions": self.partitions, "credential": self.credential}

    def to_state_dict(self) -> dict[str, Any]:
        """The same as `to_dict()` with fixed keys: `positions` as [partition, count] pairs."""
        state = self.to_dict()
        state["version"] = STATE_DICT_VERSION
        state["positions"] = [[p, n] for p, n in sorted(self.positions.items())]
        return state

    @classmethod
    def from_dict(cls, state: dict[str, Any], dataset: str, mode: str) -> ReaderPosition:
        """Validates a saved state against the reader restoring it."""
        if not isinstance(state, dict) or state.get("version") not in (POSITION_VERSION,
                                                                       STATE_DICT_VERSION):
            raise ValueError(f"not a trainfeed reader state (version {POSITION_VERSION} or "
                             f"{STATE_DICT_VERSION}): {str(state)[:200]}")
        if state["dataset"] != dataset:
            raise ValueError(f"reader state is of dataset {state['dataset']!r}, not {dataset!r}")
        if state["mode"] != mode:
            raise ValueError(f"reader state was saved by a {state['mode']} reader; this one is "
                             f"{mode} (TRAIN_LOCAL must match between save and restore)")
        try:
            pairs = state["positions"]
            pairs = pairs.items() if isinstance(pairs, dict) else [tuple(x) for x in pairs]
            return cls(mode=mode, dataset=dataset, epoch=int(state["epoch"]),
                       done={int(p) for p in state["done"]},
                       positions={int(p): int(n) for p, n in pairs},
                       finished=bool(state["finished"]), job=str(state.get("job", "")),
                       worker=str(state.get("worker", "")), seed=int(state.get("seed", 0)),
                       order=str(state.get("order", "")),
                       delivered=int(state.get("delivered", 0)),
                       partitions=int(state.get("partitions", 0)),
                       credential=str(state.get("credential", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed reader state ({type(e).__name__}: {e})") from e

    @property
    def next_epoch(self) -> int:
        return self.epoch + 1 if self.finished else self.epoch
