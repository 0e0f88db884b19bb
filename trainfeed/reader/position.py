"""Where a reader stands in an epoch: what `reader.state_dict()` returns and a restored reader
resumes.

A trainer saves it with each checkpoint. Restoring it after a crash continues the epoch with the
records the checkpointed model had not seen, and only those: partitions consumed before the
checkpoint are skipped, a partition in the trainer's hands resumes after exactly the records it
had, and (through the master) whatever the crashed reader consumed after the checkpoint is handed
out again. It is a small JSON-able dict: partitions, not records. "Records it had" count in the
partition's delivery order (see trainfeed.reader.batcher), which `order` names, so that a state is
never restored into a reader that would deliver partitions in another order.

One shape, version 2 (`to_state_dict()`): `positions` is a list of [partition, count] pairs, so
that the state has the same keys whatever the position, which torch.distributed.checkpoint needs:
it loads a checkpoint into the structure of a fresh reader's `state_dict()`, and would drop
per-partition keys that a fresh reader lacks. Version 1 (the retired `Reader.state()`, whose
`positions` mapped partitions to counts) is refused, saying what to do.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfeed.errors import CheckpointError

STATE_DICT_VERSION = 2
# Retired versions, each with what to do about a state saved in it.
RETIRED_VERSIONS = {
    1: "version 1, saved by Reader.state() of earlier releases, is no longer read: save "
       "reader.state_dict() (version 2) with new checkpoints, or restore this one with the "
       "release before and save its state_dict()",
}
MODES = ("local", "distributed")
# Keys every saved state has (the others came later: a state without them gets their default).
REQUIRED_KEYS = ("version", "mode", "dataset", "epoch", "finished", "done", "positions")
# Upper bounds (exclusive) of a saved state's numbers: far above any real run, and inside the
# wire's fields (trainfeed/v1/master.proto), so that an edited state is a CheckpointError
# naming the key, not a protobuf "Value out of range" or an epoch counter a billion passes on.
# Epochs: 2^26 (67 million) is a pass a second, without a break, for two years; a pass costs
# more than that (it starts threads, and master-fed a round trip), so no real run gets near it,
# while 10^9, an edit's typical number, is refused (ResumePosition.epoch is an int64).
MAX_EPOCH = 2**26
# Partition indices and counts: ResumePosition.done and the positions' keys are uint32; a plan
# of 2^31 partitions would be a manifest of 2^31 row groups (and a master ledger of as many).
MAX_PARTITIONS = 2**31
# Records handed of one partition, or in one epoch: 2^48 is 281 trillion, 10^5 times the
# largest datasets read (positions are uint64 on the wire; over-sampling may repeat records).
MAX_RECORDS = 2**48
# Seeds: OpenJobRequest.seed is a uint64.
MAX_SEED = 2**64
# Dataset versions: the wire's dataset_version is a uint32; a version a day for 5.9 million years.
MAX_VERSION = 2**31
# Class values (labels behind ids 0..K-1) a state records: 16 million classes, far above any
# classifier's output layer.
MAX_CLASSES = 2**24


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
    # How many partitions the plan that `done` and `positions` name had (0 in states older
    # than sliced partitions, and in distributed ones older than this count: the master keeps
    # its plan, and a restored reader checks against it before it sends the state).
    partitions: int = 0
    # Distributed: the resume credential the master gave `worker`'s session, without which the
    # master refuses to rewind that session's work ("" in states older than it, and local ones).
    credential: str = ""
    # The version of the dataset read (trainfeed.formats.manifest, "Versions"): partitions are
    # counted in its plan, so a state restores only into a reader of the same version (0 in
    # states older than versions, and before the reader opened its dataset: not checked).
    dataset_version: int = 0
    # The labels behind the class ids 0..K-1 the reader delivered (trainfeed.reader.label_ids):
    # a restored reader that would map them otherwise refuses the state. () in states older
    # than it, of readers that map no labels, and before the reader opened its dataset.
    class_values: tuple[str, ...] = ()

    def to_state_dict(self) -> dict[str, Any]:
        """The position as a JSON-able dict with fixed keys (version 2): `done` sorted,
        `positions` as sorted [partition, count] pairs."""
        return {"version": STATE_DICT_VERSION, "mode": self.mode, "dataset": self.dataset,
                "job": self.job, "worker": self.worker, "seed": self.seed, "epoch": self.epoch,
                "finished": self.finished, "done": sorted(self.done),
                "positions": [[p, n] for p, n in sorted(self.positions.items())],
                "order": self.order, "delivered": self.delivered,
                "partitions": self.partitions, "credential": self.credential,
                "dataset_version": self.dataset_version,
                "class_values": list(self.class_values)}

    @classmethod
    def from_dict(cls, state: dict[str, Any], dataset: str, mode: str) -> ReaderPosition:
        """Validates a saved state against the reader restoring it: every key, type and range
        that does not need the dataset's partition plan (`check_plan` does the rest, once the
        reader knows the plan or, master-fed, before it sends the state: against the count of
        partitions the state says its plan had).

        Raises:
            CheckpointError (a ValueError): not a reader state, a retired or unknown version, a
                missing key, a value of the wrong type or range, another dataset or mode.
        """
        if not isinstance(state, dict) or "version" not in state:
            raise CheckpointError(f"not a trainfeed reader state (a dict with a 'version', "
                                  f"{STATE_DICT_VERSION}): {str(state)[:200]}")
        version = state["version"]
        if type(version) is int and version in RETIRED_VERSIONS:
            raise CheckpointError(f"reader state {RETIRED_VERSIONS[version]}")
        if type(version) is not int or version != STATE_DICT_VERSION:
            raise CheckpointError(f"not a trainfeed reader state: 'version' is {version!r}, "
                                  f"expected {STATE_DICT_VERSION} (was it saved by a newer "
                                  f"trainfeed?)")
        missing = [k for k in REQUIRED_KEYS if k not in state]
        if missing:
            raise CheckpointError(f"malformed reader state: missing key(s) {missing} (a "
                                  f"state_dict() has {list(REQUIRED_KEYS)}); restore the state "
                                  f"the reader saved, unchanged")
        saved_mode = _text(state, "mode")
        if saved_mode not in MODES:
            raise CheckpointError(f"malformed reader state: 'mode' is {saved_mode!r}, expected "
                                  f"one of {list(MODES)}")
        saved_dataset = _text(state, "dataset")
        if saved_dataset != dataset:
            raise CheckpointError(f"reader state is of dataset {saved_dataset!r}, not "
                                  f"{dataset!r}")
        if saved_mode != mode:
            raise CheckpointError(f"reader state was saved by a {saved_mode} reader; this one "
                                  f"is {mode} (TRAIN_LOCAL must match between save and restore)")
        position = cls(mode=mode, dataset=dataset, epoch=_count(state, "epoch", MAX_EPOCH, -1),
                       done=_partitions(state), positions=_positions(state),
                       finished=_flag(state, "finished"), job=_text(state, "job"),
                       worker=_text(state, "worker"), seed=_count(state, "seed", MAX_SEED),
                       order=_text(state, "order"),
                       delivered=_count(state, "delivered", MAX_RECORDS),
                       partitions=_count(state, "partitions", MAX_PARTITIONS),
                       credential=_text(state, "credential"),
                       dataset_version=_count(state, "dataset_version", MAX_VERSION),
                       class_values=_labels(state))
        return position

    def check_version(self, opened: int) -> None:
        """Checks that this state was saved reading version `opened` of the dataset (a state
        from before versions, or saved before its reader opened the dataset, names none).

        Raises:
            CheckpointError: naming both versions and the two ways on.
        """
        saved = self.dataset_version
        if saved and opened and saved != opened:
            raise CheckpointError(
                f"reader state was saved reading version {saved} of dataset {self.dataset!r}, "
                f"but this reader opened version {opened}: its partitions and positions count "
                f"in version {saved}'s plan. Open the state's version to go on where it stopped "
                f"(dist.reader({f'{self.dataset}@{saved}'!r}, ...)), or start a reader without "
                f"the state to read version {opened} from the beginning of an epoch")

    @property
    def may_repeat(self) -> bool:
        """Whether its counts may exceed a partition's records: over-sampling (resample=)
        delivers copies, and a state older than `order` does not say whether it resampled."""
        return not self.order or "resample=" in self.order

    def check_plan(self, sizes: Sequence[int | None] | None, count: int | None = None) -> None:
        """Checks `done` and `positions` against a partition plan: `sizes` (records per
        partition, None where unknown: a SQL bucket), or only its partition `count` where the
        sizes are not known here. Counts are bounded by sizes unless `may_repeat` (then the
        partition's load checks them: trainfeed.reader.batcher.past_the_end).

        Raises:
            CheckpointError: a partition the plan does not have, or more records handed of a
                partition than it holds.
        """
        count = len(sizes) if sizes is not None else count
        assert count is not None, "check_plan needs the sizes or the count"
        for key, partitions in (("done", sorted(self.done)), ("positions", self.positions)):
            for p in partitions:
                if p >= count:
                    raise CheckpointError(
                        f"reader state: {key!r} names partition {p}, but dataset "
                        f"{self.dataset!r} has {count} (partitions 0..{count - 1}): was it "
                        f"re-uploaded, or the state edited?")
        if sizes is None or self.may_repeat:
            return
        for p, n in self.positions.items():
            size = sizes[p]
            if size is not None and n > size:
                raise CheckpointError(
                    f"reader state: 'positions' has {n} records handed of partition {p}, which "
                    f"holds {sizes[p]} (a position is at most its partition's size): was the "
                    f"dataset re-uploaded, or the state edited?")

    @property
    def next_epoch(self) -> int:
        return self.epoch + 1 if self.finished else self.epoch


def _bad(key: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(f"malformed reader state: {key} is {str(repr(value))[:100]}, "
                           f"expected {rule}; restore the state the reader saved, unchanged")


def _int(key: str, value: Any, minimum: int, limit: int) -> int:
    """An int (numpy's too, not a bool or a float) in [minimum, limit)."""
    rule = f"an int ≥ {minimum}"
    if isinstance(value, bool):
        raise _bad(key, value, rule)
    try:
        number = operator.index(value)
    except TypeError:
        raise _bad(key, value, rule) from None
    if number < minimum:
        raise _bad(key, value, rule)
    if number >= limit:
        raise _bad(key, value, f"an int in [{minimum}, {_power(limit)}) (no real run reaches "
                               f"{_power(limit)})")
    return number


def _power(limit: int) -> str:
    """2^31 rather than 2147483648, for a bound that is a power of two."""
    return f"2^{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)


def _count(state: dict[str, Any], key: str, limit: int, minimum: int = 0) -> int:
    return _int(repr(key), state.get(key, 0), minimum, limit)


def _text(state: dict[str, Any], key: str) -> str:
    value = state.get(key, "")
    if not isinstance(value, str):
        raise _bad(repr(key), value, "a string")
    return value


def _flag(state: dict[str, Any], key: str) -> bool:
    value = state[key]
    if not isinstance(value, bool):
        raise _bad(repr(key), value, "true or false")
    return value


def _labels(state: dict[str, Any]) -> tuple[str, ...]:
    """`class_values`: distinct labels, at most MAX_CLASSES ([] where the state has none)."""
    values = state.get("class_values", [])
    rule = f"a list of at most {_power(MAX_CLASSES)} distinct labels (strings)"
    if (not isinstance(values, list | tuple) or len(values) > MAX_CLASSES
            or not all(isinstance(v, str) for v in values) or len(set(values)) != len(values)):
        raise _bad("'class_values'", values, rule)
    return tuple(values)


def _partitions(state: dict[str, Any]) -> set[int]:
    done = state["done"]
    if not isinstance(done, list | tuple):
        raise _bad("'done'", done, "a list of partition indices")
    return {_int(f"'done'[{i}]", p, 0, MAX_PARTITIONS) for i, p in enumerate(done)}


def _positions(state: dict[str, Any]) -> dict[int, int]:
    """`positions`: [[partition, count], ...]."""
    raw = state["positions"]
    if not isinstance(raw, list | tuple):
        raise _bad("'positions'", raw, "a list of [partition, records] pairs")
    pairs: list[tuple[str, Any, Any]] = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise _bad(f"'positions'[{i}]", pair, "a [partition, records] pair")
        pairs.append((f"'positions'[{i}]", *pair))
    positions: dict[int, int] = {}
    for where, p, n in pairs:
        partition = _int(f"the partition of {where}", p, 0, MAX_PARTITIONS)
        if partition in positions:
            raise _bad(where, p, "each partition once")
        positions[partition] = _int(f"the records of {where}", n, 0, MAX_RECORDS)
    return positions
