"""A reader refuses class ids other than its model's (issue 38): a reader restored from a
checkpoint whose reader delivered other ids (another version's, a moved id with the same count),
or pinned to class values its dataset version's labels do not fit, fails before its first
record, naming both mappings. Before, a 4-class model died with `IndexError: Target 4 is out of
bounds` after an append added a label, and a moved id with the same count trained on wrong
labels without a word. Real uploads (an append adds a label that sorts first), real readers,
local and master-fed; a job pinned to the old version goes on as before."""
from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from sample_data import make_image_list

from trainfeed import (
    BatchOptions,
    LabelOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    dist,
)
from trainfeed.errors import CheckpointError, JobError, UnknownLabelError
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

FIRST = ("boat", "cat", "dog")  # version 1: ids boat 0, cat 1, dog 2
V1 = r"\{0: 'boat', 1: 'cat', 2: 'dog'\} \(3 classes\)"
V2 = r"\{0: 'boat', 1: 'cat', 2: 'dog', 3: 'auk'\} \(4 classes\)"
N1, N2 = 24, 30  # records of version 1, of version 2


def pipeline(pinned: tuple[str, ...] | None = None) -> PipelineOptions:
    return PipelineOptions(batch=BatchOptions(size=4), labels=LabelOptions(class_values=pinned))


@pytest.fixture
def storage(tmp_path: Path) -> str:
    """Version 1 of dataset "ds": 4-pixel images labelled boat, cat, dog (row groups of 4)."""
    root = str(tmp_path / "storage")
    upload(str(make_image_list(tmp_path / "one", N1, labels=FIRST, size=4)), "ds", root,
           UploadOptions(row_group_rows=4, processes=1), progress=False)
    return root


def append_auk(tmp_path: Path, storage: str) -> None:
    """Version 2: adds records labelled "auk" (sorts before every label of version 1)."""
    more = make_image_list(tmp_path / "two", N2 - N1, labels=("auk", "cat"), size=4, seed=1,
                           name="more.list")
    upload(str(more), "ds", storage, UploadOptions(row_group_rows=4, processes=1, append=True),
           progress=False)


def checkpoint(reader: dist.Reader) -> tuple[list[int], dict[str, Any]]:
    """The ids of two batches, and the state saved after them (through JSON, as a file)."""
    ids = [int(i) for b in itertools.islice(reader(), 2) for i in b["_id"]]
    return ids, json.loads(json.dumps(reader.state_dict()))


def opened(reader: dist.Reader) -> tuple[str, ...]:
    """Opens the reader's dataset (no record read), as a trainer sizing its model does."""
    return reader.class_values


def rest(reader: dist.Reader) -> list[int]:
    return [int(i) for b in reader() for i in b["_id"]]


def test_a_local_checkpoint_of_version_1_is_refused_by_version_2_naming_both_mappings(
        tmp_path: Path, storage: str) -> None:
    before, saved = checkpoint(dist.reader("ds", source=LocalSource(storage=storage),
                                           pipeline=pipeline()))
    assert saved["class_values"] == list(FIRST) and saved["dataset_version"] == 1
    append_auk(tmp_path, storage)
    restored = dist.reader("ds", source=LocalSource(storage=storage), pipeline=pipeline(),
                           state=saved)
    with pytest.raises(CheckpointError, match=f"class ids were {V1}; this reader \\(version 2\\) "
                                              f"maps {V2}: added: 'auk' as 3.*dataset@1"):
        opened(restored)
    with pytest.raises(CheckpointError, match="added: 'auk' as 3"):
        next(iter(dist.reader("ds", source=LocalSource(storage=storage), pipeline=pipeline(),
                              state=saved)()))
    # The state's version goes on where it stopped, every record of version 1 once.
    pinned = dist.reader("ds@1", source=LocalSource(storage=storage), pipeline=pipeline(),
                         state=saved)
    assert pinned.class_values == FIRST
    assert sorted(before + rest(pinned)) == list(range(N1))


def test_a_moved_id_with_the_same_class_count_is_refused(storage: str) -> None:
    """A model trained with other ids for the same labels (here: an edited state) would train
    on wrong labels without an error of its own."""
    _, saved = checkpoint(dist.reader("ds", source=LocalSource(storage=storage),
                                      pipeline=pipeline()))
    saved["class_values"] = ["cat", "boat", "dog"]
    with pytest.raises(CheckpointError, match=r"moved: 'cat' 0 → 1, 'boat' 1 → 0"):
        opened(dist.reader("ds", source=LocalSource(storage=storage), pipeline=pipeline(),
                           state=saved))
    # A pin that differs from the state's ids is refused at creation: nothing is opened.
    with pytest.raises(CheckpointError, match=r"this reader \(its pinned class_values\) maps "
                                              r"\{0: 'boat', 1: 'cat', 2: 'dog'\}"):
        dist.reader("ds", source=LocalSource(storage=str(Path(storage) / "nowhere")),
                    pipeline=pipeline(FIRST), state=saved)
    # With the state's ids pinned, the reader delivers them and restores.
    pinned = dist.reader("ds", source=LocalSource(storage=storage),
                         pipeline=pipeline(("cat", "boat", "dog")), state=saved)
    assert pinned.class_values == ("cat", "boat", "dog")


def test_a_pin_that_lacks_a_label_of_the_version_is_refused_before_a_record(
        tmp_path: Path, storage: str) -> None:
    append_auk(tmp_path, storage)
    reader = dist.reader("ds", source=LocalSource(storage=storage), pipeline=pipeline(FIRST))
    with pytest.raises(UnknownLabelError, match=f"dataset 'ds' version 2 has label\\(s\\) "
                                                f"\\['auk'\\] outside the reader's class_values: "
                                                f"pinned {V1}, the dataset's {V2}"):
        opened(reader)
    # A pin that covers the labels (a validation set may lack some) reads, with its ids.
    wide = ("dog", "cat", "boat", "auk", "emu")
    assert dist.reader("ds@1", source=LocalSource(storage=storage),
                       pipeline=pipeline(wide)).class_values == wide


@pytest.mark.integration
def test_master_fed_readers_refuse_other_ids_and_a_job_of_version_1_goes_on(
        tmp_path: Path, storage: str) -> None:
    with MasterProcess(storage) as master:
        def reader(job: str, state: dict[str, Any] | None = None,
                   pinned: tuple[str, ...] | None = None) -> dist.Reader:
            return dist.reader("ds", source=MasterSource(master.address, job,
                                                         prefetch_partitions=1),
                               pipeline=pipeline(pinned), state=state)

        first = reader("train")
        before, saved = checkpoint(first)
        assert saved["class_values"] == list(FIRST)
        first.close()
        append_auk(tmp_path, storage)
        # The job created on version 1 keeps it: the restored reader goes on, same ids.
        restored = reader("train", saved)
        assert restored.class_values == FIRST
        assert sorted(before + rest(restored)) == list(range(N1))
        restored.close()
        # A new job reads version 2: the master refuses the state's version, and the reader
        # says what the state's model was trained with and how to keep it.
        with reader("fresh", saved) as refused, pytest.raises(
                JobError, match=f"saved reading version 1.*trained with class ids "
                                f"{V1}: .*LabelOptions\\(class_values=state"):
            next(iter(refused()))
        # Pinned to the state's ids, a reader of version 2 refuses the added label.
        pinned = reader("fresh", pinned=tuple(saved["class_values"]))
        with pytest.raises(UnknownLabelError, match=f"\\['auk'\\] outside the reader's "
                                                    f"class_values: pinned {V1}, the "
                                                    f"dataset's {V2}"):
            opened(pinned)
        pinned.close()
        # A moved id with the same count, on the job's own version.
        moved = {**saved, "class_values": ["cat", "boat", "dog"]}
        # (Closed by hand: the session it opened to learn the job's ids would go on
        # heartbeating until the reader is collected.)
        with reader("train", moved) as refused, pytest.raises(
                CheckpointError, match=r"moved: 'cat' 0 → 1, 'boat' 1 → 0"):
            opened(refused)
        # Not closed this time: the refusal itself ends the session it opened.
        refused = reader("train", moved)
        with pytest.raises(CheckpointError, match=r"moved: 'cat' 0 → 1"):
            opened(refused)
        session = refused._connected.session  # type: ignore[attr-defined]
        assert not [t.name for t in threading.enumerate() if t.name.endswith(
            f"-{session.opened.worker_id}") and t.name.startswith("trainfeed-")]
        refused.close()
