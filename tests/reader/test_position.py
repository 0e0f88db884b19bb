"""trainfeed.reader.position: the reader state's two shapes, field by field, and what a state
saved by an older trainfeed (fewer keys) restores to."""
from __future__ import annotations

import json

import pytest

from trainfeed.reader.position import POSITION_VERSION, STATE_DICT_VERSION, ReaderPosition


def full() -> ReaderPosition:
    return ReaderPosition(mode="distributed", dataset="flowers", epoch=3, done={4, 1},
                          positions={7: 12, 2: 5}, finished=False, job="resnet",
                          worker="host:1-ab12", seed=9, order="shuffle:9:64",
                          delivered=170, partitions=64, credential="c0ffee")


def test_to_dict_holds_every_field_under_its_key() -> None:
    assert full().to_dict() == {
        "version": POSITION_VERSION, "mode": "distributed", "dataset": "flowers",
        "job": "resnet", "worker": "host:1-ab12", "seed": 9, "epoch": 3, "finished": False,
        "done": [1, 4], "positions": {"2": 5, "7": 12}, "order": "shuffle:9:64",
        "delivered": 170, "partitions": 64, "credential": "c0ffee"}


def test_to_state_dict_has_fixed_keys_and_pairs() -> None:
    state = full().to_state_dict()
    assert state == {**full().to_dict(), "version": STATE_DICT_VERSION,
                     "positions": [[2, 5], [7, 12]]}
    empty = ReaderPosition("local", "flowers", 0).to_state_dict()
    assert set(empty) == set(state) and empty["positions"] == []


@pytest.mark.parametrize("shape", ["to_dict", "to_state_dict"])
def test_both_shapes_restore_every_field_through_json(shape: str) -> None:
    saved = json.loads(json.dumps(getattr(full(), shape)()))
    assert ReaderPosition.from_dict(saved, "flowers", "distributed") == full()


def test_a_state_without_the_later_keys_restores_their_defaults() -> None:
    oldest = {"version": 1, "mode": "local", "dataset": "flowers", "epoch": 2,
              "finished": True, "done": [0], "positions": {"3": 1}}
    position = ReaderPosition.from_dict(oldest, "flowers", "local")
    assert position == ReaderPosition(mode="local", dataset="flowers", epoch=2, done={0},
                                      positions={3: 1}, finished=True)
    assert (position.job, position.worker, position.seed, position.order, position.delivered,
            position.partitions) == ("", "", 0, "", 0, 0)
    assert position.next_epoch == 3


@pytest.mark.parametrize("state,match", [
    ({"version": 7}, "not a trainfeed reader state"),
    ("text", "not a trainfeed reader state"),
    ({**full().to_dict(), "dataset": "other"}, "of dataset 'other', not 'flowers'"),
    ({**full().to_dict(), "mode": "local"}, "saved by a local reader; this one is distributed"),
    ({**full().to_dict(), "epoch": "x"}, r"malformed reader state \(ValueError: "),
    ({k: v for k, v in full().to_dict().items() if k != "done"},
     r"malformed reader state \(KeyError: 'done'\)"),
    ({**full().to_dict(), "positions": [[1]]}, r"malformed reader state \(ValueError: "),
])
def test_a_bad_state_is_named(state: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReaderPosition.from_dict(state, "flowers", "distributed")  # type: ignore[arg-type]


def test_an_unknown_state_is_shown_cut_at_200_characters() -> None:
    with pytest.raises(ValueError) as error:
        ReaderPosition.from_dict("x" * 300, "flowers", "local")  # type: ignore[arg-type]
    assert str(error.value).endswith(": " + "x" * 200)
