"""trainfeed.reader.position: the reader state, field by field, what a state saved by an older
trainfeed (fewer keys) restores to, and the retired version 1 refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trainfeed.errors import CheckpointError
from trainfeed.reader.position import STATE_DICT_VERSION, ReaderPosition


def full() -> ReaderPosition:
    return ReaderPosition(mode="distributed", dataset="flowers", epoch=3, done={4, 1},
                          positions={7: 12, 2: 5}, finished=False, job="resnet",
                          worker="host:1-ab12", seed=9, order="shuffle:9:64",
                          delivered=170, partitions=64, credential="c0ffee", dataset_version=2,
                          class_values=("cat", "bird"))


def test_to_state_dict_holds_every_field_under_its_key_with_fixed_keys_and_pairs() -> None:
    state = full().to_state_dict()
    assert state == {
        "version": STATE_DICT_VERSION, "mode": "distributed", "dataset": "flowers",
        "job": "resnet", "worker": "host:1-ab12", "seed": 9, "epoch": 3, "finished": False,
        "done": [1, 4], "positions": [[2, 5], [7, 12]], "order": "shuffle:9:64",
        "delivered": 170, "partitions": 64, "credential": "c0ffee", "dataset_version": 2,
        "class_values": ["cat", "bird"]}
    empty = ReaderPosition("local", "flowers", 0).to_state_dict()
    assert set(empty) == set(state) and empty["positions"] == []


def test_the_state_restores_every_field_through_json() -> None:
    saved = json.loads(json.dumps(full().to_state_dict()))
    assert ReaderPosition.from_dict(saved, "flowers", "distributed") == full()


@pytest.mark.parametrize("values,shown", [
    ("cat", "'cat'"), (["cat", 1], r"\['cat', 1\]"), (["cat", "cat"], r"\['cat', 'cat'\]")])
def test_class_values_that_are_not_distinct_labels_are_refused(values: object,
                                                               shown: str) -> None:
    """Issue 38: the class ids a state's reader delivered, checked like every key."""
    with pytest.raises(CheckpointError, match=f"'class_values' is {shown}, expected a list of "
                                              f"at most 2\\^24 distinct labels"):
        ReaderPosition.from_dict({**full().to_state_dict(), "class_values": values}, "flowers",
                                 "distributed")
    older = {k: v for k, v in full().to_state_dict().items() if k != "class_values"}
    assert ReaderPosition.from_dict(older, "flowers", "distributed").class_values == ()


def test_version_1_is_refused_saying_what_to_do() -> None:
    """Issue 27: one state format. Version 1 (Reader.state(), positions as a dict) is retired."""
    version_1 = {**full().to_state_dict(), "version": 1, "positions": {"2": 5, "7": 12}}
    with pytest.raises(CheckpointError, match=r"version 1, saved by Reader.state\(\) of earlier "
                                              r"releases, is no longer read: save "
                                              r"reader.state_dict\(\) \(version 2\)"):
        ReaderPosition.from_dict(version_1, "flowers", "distributed")


def test_a_state_without_the_later_keys_restores_their_defaults() -> None:
    oldest = {"version": 2, "mode": "local", "dataset": "flowers", "epoch": 2,
              "finished": True, "done": [0], "positions": [[3, 1]]}
    position = ReaderPosition.from_dict(oldest, "flowers", "local")
    assert position == ReaderPosition(mode="local", dataset="flowers", epoch=2, done={0},
                                      positions={3: 1}, finished=True)
    assert (position.job, position.worker, position.seed, position.order, position.delivered,
            position.partitions) == ("", "", 0, "", 0, 0)
    assert position.next_epoch == 3


def without(key: str) -> dict:
    return {k: v for k, v in full().to_state_dict().items() if k != key}


def edited(**changes: object) -> dict:
    return {**full().to_state_dict(), **changes}


# Every rule a saved state is checked by before a reader uses it or sends it to the master: the
# key, the value and the rule named (issue 25: these gave raw KeyErrors, pyarrow IndexErrors,
# or were taken silently).
@pytest.mark.parametrize("state,match", [
    ({"epoch": 3}, "not a trainfeed reader state"),
    ("text", "not a trainfeed reader state"),
    (edited(version=7), r"'version' is 7, expected 2"),
    (edited(version="2"), r"'version' is '2', expected 2"),
    (edited(version=True), r"'version' is True"),
    (edited(dataset="other"), "of dataset 'other', not 'flowers'"),
    (edited(mode="local"), "saved by a local reader; this one is distributed"),
    (edited(mode="cluster"), r"'mode' is 'cluster', expected one of \['local', 'distributed'\]"),
    (without("done"), r"missing key\(s\) \['done'\]"),
    (without("dataset"), r"missing key\(s\) \['dataset'\]"),
    (without("epoch"), r"missing key\(s\) \['epoch'\]"),
    (edited(epoch="x"), r"'epoch' is 'x', expected an int ≥ -1"),
    (edited(epoch=-2), r"'epoch' is -2, expected an int ≥ -1"),
    (edited(epoch=1.0), r"'epoch' is 1.0, expected an int ≥ -1"),
    (edited(finished="no"), r"'finished' is 'no', expected true or false"),
    (edited(done=[-1]), r"'done'\[0\] is -1, expected an int ≥ 0"),
    (edited(done=[1, None]), r"'done'\[1\] is None, expected an int ≥ 0"),
    (edited(done=5), r"'done' is 5, expected a list of partition indices"),
    (edited(positions=[[1]]), r"'positions'\[0\] is \[1\], expected a \[partition, records\]"),
    (edited(positions=[[2, -5]]), r"the records of 'positions'\[0\] is -5, expected an int ≥ 0"),
    (edited(positions=[[-2, 5]]), r"the partition of 'positions'\[0\] is -2, expected an int ≥ 0"),
    (edited(positions=[[2, "5"]]), r"the records of 'positions'\[0\] is '5', expected an int"),
    (edited(positions=[[2, 5], [2, 6]]), r"'positions'\[1\] is 2, expected each partition once"),
    (edited(positions={"2": 5}), r"'positions' is \{'2': 5\}, expected a list of \[partition, "),
    (edited(positions="2:5"), r"'positions' is '2:5', expected a list of \[partition, records\]"),
    (edited(delivered=-5), r"'delivered' is -5, expected an int ≥ 0"),
    (edited(seed=-1), r"'seed' is -1, expected an int ≥ 0"),
    (edited(partitions=-1), r"'partitions' is -1, expected an int ≥ 0"),
    (edited(job=3), r"'job' is 3, expected a string"),
])
def test_a_bad_state_is_refused_naming_the_key_the_value_and_the_rule(state: object,
                                                                      match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        ReaderPosition.from_dict(state, "flowers", "distributed")  # type: ignore[arg-type]


def test_numpy_ints_are_ints_and_the_plan_bounds_positions_by_partition_size() -> None:
    state = edited(epoch=np.int64(3), positions=[[np.int64(2), np.uint32(5)], [7, 12]])
    position = ReaderPosition.from_dict(state, "flowers", "distributed")
    assert position == full()
    sizes = [8] * 64
    sizes[7] = 12  # a position may equal its partition's size (all handed, not yet acknowledged)
    position.check_plan(sizes)
    with pytest.raises(CheckpointError, match="'done' names partition 64, but dataset "
                                              "'flowers' has 64"):
        ReaderPosition.from_dict(edited(done=[64]), "flowers", "distributed").check_plan(None, 64)
    sizes[7] = 11
    with pytest.raises(CheckpointError, match="'positions' has 12 records handed of partition 7, "
                                              "which holds 11"):
        position.check_plan(sizes)
    with pytest.raises(CheckpointError, match="'positions' names partition 7, but dataset "
                                              "'flowers' has 5"):
        position.check_plan([100] * 5)


def test_an_unknown_state_is_shown_cut_at_200_characters() -> None:
    with pytest.raises(ValueError) as error:
        ReaderPosition.from_dict("x" * 300, "flowers", "local")  # type: ignore[arg-type]
    assert str(error.value).endswith(": " + "x" * 200)


def test_a_state_restores_only_into_the_version_it_was_saved_on() -> None:
    position = full()
    position.check_version(2)
    position.check_version(0)  # a master before versions names none: not checked
    with pytest.raises(CheckpointError, match=r"saved reading version 2 of dataset 'flowers', "
                                              r"but this reader opened version 3.*"
                                              r"dist.reader\('flowers@2', ...\)"):
        position.check_version(3)
    with pytest.raises(CheckpointError, match="'dataset_version' is -1"):
        ReaderPosition.from_dict({**full().to_state_dict(), "dataset_version": -1}, "flowers",
                                 "distributed")
