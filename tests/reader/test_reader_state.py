"""reader.state_dict() / load_state_dict: a trainer restarted from a checkpoint sees every record
once."""
from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from sample_data import file_digests

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.errors import CheckpointError

N = 100


def key(instance: tuple[bytes, str]) -> tuple[str, str]:
    return hashlib.sha256(instance[0]).hexdigest(), instance[1]


def checkpoint_round_trip(state: dict) -> dict:
    """What saving with a checkpoint does: JSON and back."""
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("k", [0, 1, 8, 37, 99])
def test_tuple_pass_resumes_exactly_after_the_last_instance_the_trainer_got(
        storage: str, image_list: Path, k: int) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage, prefetch_partitions=3))
    stream = reader()
    before = [key(x) for x in itertools.islice(stream, k)]
    saved = checkpoint_round_trip(reader.state_dict())
    list(itertools.islice(stream, 20))  # trained on, then crashed before the next checkpoint
    reader.close()

    restored = dist.reader("flowers", source=LocalSource(storage=storage), state=saved)
    after = [key(x) for x in restored()]
    assert restored.epoch == 0
    assert Counter(before + after) == Counter(file_digests(image_list).values())
    assert sum(1 for _ in restored()) == N and restored.epoch == 1  # then epochs go on


def test_batched_pass_resumes_after_the_last_batch(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage, prefetch_partitions=2))
    batches = reader.column_batches(16)
    before = [i for b in itertools.islice(batches, 3) for i in b["_id"].tolist()]
    saved = checkpoint_round_trip(reader.state_dict())
    assert saved["epoch"] == 0 and not saved["finished"]
    assert len(saved["done"]) + len(saved["positions"]) >= 1
    next(batches)  # lost with the crash
    restored = dist.reader("flowers", source=LocalSource(storage=storage), state=saved)
    after = [i for b in restored.column_batches(16) for i in b["_id"].tolist()]
    assert sorted(before + after) == list(range(N))


def test_a_finished_pass_resumes_with_the_next_epoch(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=5))
    order = [b["_id"].tolist() for b in reader.column_batches()]
    saved = reader.state_dict()
    assert saved["finished"] and saved["epoch"] == 0 and saved["positions"] == []
    second = [b["_id"].tolist() for b in reader.column_batches()]
    restored = dist.reader("flowers", source=LocalSource(storage=storage, seed=5), state=saved)
    assert [b["_id"].tolist() for b in restored.column_batches()] == second != order
    assert restored.epoch == 1


def test_an_abandoned_pass_is_resumed_by_the_next_one(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    first = [b["_id"].tolist() for b in itertools.islice(reader.column_batches(10), 2)]
    rest = [b["_id"].tolist() for b in reader.column_batches(10)]
    assert reader.epoch == 0
    assert sorted(i for b in first + rest for i in b) == list(range(N))


def test_bad_states_are_refused_clearly(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    list(reader())
    saved = reader.state_dict()
    with pytest.raises(ValueError, match="before the reader's first pass"):
        reader.load_state_dict(saved)
    with pytest.raises(ValueError, match="of dataset 'flowers', not 'tulips'"):
        dist.reader("tulips", source=LocalSource(storage=storage), state=saved)
    with pytest.raises(ValueError, match="saved by a local reader; this one is distributed"):
        dist.reader("flowers", source=MasterSource("127.0.0.1:1"), state=saved)
    with pytest.raises(ValueError, match="not a trainfeed reader state"):
        dist.reader("flowers", source=LocalSource(storage=storage), state={"epoch": 3})
    with pytest.raises(ValueError, match="malformed reader state"):
        dist.reader("flowers", source=LocalSource(storage=storage), state={**saved, "done": [None]})
    bad = dist.reader("flowers", source=LocalSource(storage=storage),
                      state={**saved, "finished": False, "done": [500]})
    with pytest.raises(ValueError, match="names partition 500.*re-uploaded"):
        list(bad())


def test_the_retired_state_names_say_what_replaces_them(storage: str) -> None:
    """Issue 27: one state protocol. Reader.state()/restore() and state version 1 are gone;
    each is refused saying what to use instead."""
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    with pytest.raises(AttributeError, match=r"Reader.state was retired: use "
                                             r"reader.state_dict\(\)"):
        reader.state()  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=r"Reader.restore was retired: use "
                                             r"reader.load_state_dict\(state\)"):
        reader.restore({})  # type: ignore[attr-defined]
    version_1 = {**reader.state_dict(), "version": 1, "positions": {}}
    with pytest.raises(CheckpointError, match=r"version 1, saved by Reader.state\(\) of earlier "
                                              r"releases, is no longer read: save "
                                              r"reader.state_dict\(\)"):
        reader.load_state_dict(version_1)
    for name in ("backend", "pipeline"):
        with pytest.raises(AttributeError, match=f"Reader.{name} is private"):
            getattr(reader, name)
