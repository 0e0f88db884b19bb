"""A master job pins the dataset version it was created on (issue 30 §4): its readers read that
version while an append publishes the next; a reader asking for another version, or restoring
a state saved on another, is refused naming both; a restarted master keeps the job's version.
The master runs as its own process; readers count every record id they are handed."""
from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from trainfeed import MasterSource, dist
from trainfeed.errors import JobError
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = pytest.mark.integration

FIRST, ADDED = 60, 30
OPTIONS = UploadOptions(kind="text", columns=("word", "label"), row_group_rows=4, processes=1)


def word_list(path: Path, start: int, count: int) -> Path:
    path.write_text("".join(f"w{i}\t{'ab'[i % 2]}\n" for i in range(start, start + count)))
    return path


def source(master: MasterProcess, job: str) -> MasterSource:
    return MasterSource(master.address, job, prefetch_partitions=1)


def test_a_job_reads_the_version_it_was_created_on(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    state = f"sqlite:///{tmp_path / 'master.db'}"
    with MasterProcess(storage, state=state) as master:
        first = dist.reader("ds", source=source(master, "train"))
        batches = first.column_batches(5)
        got = [i for b in itertools.islice(batches, 2) for i in b["_id"].tolist()]
        saved = json.loads(json.dumps(first.state_dict()))
        assert saved["dataset_version"] == 1
        upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage,
               UploadOptions(**{**OPTIONS.__dict__, "append": True}), progress=False)
        # A second reader of the job, opened after the append: the job's version, 1.
        second = dist.reader("ds", source=source(master, "train"))
        assert second.state_dict()["dataset_version"] == 0  # not opened yet
        got += [i for b in batches for i in b["_id"].tolist()]
        assert Counter(got) == Counter(range(FIRST))  # epoch 0 of the job: version 1, once
        # (epoch 1: the first reader finished epoch 0 alone.)
        assert Counter(i for b in second.column_batches(5) for i in b["_id"].tolist()) == Counter(
            range(FIRST))
        assert second.state_dict()["dataset_version"] == 1 and second.epoch == 1
        with pytest.raises(JobError, match=r"job 'train' reads version 1 of dataset 'ds', not "
                                           r"version 2.*Read ds@1"):
            list(dist.reader("ds@2", source=source(master, "train")).column_batches(5))
        # A new job reads the current version, every record once.
        fresh = dist.reader("ds", source=source(master, "fresh"))
        assert Counter(i for b in fresh.column_batches(5) for i in b["_id"].tolist()) == Counter(
            range(FIRST + ADDED))
        # The state saved on version 1, restored into the job of version 2: refused, before
        # the master changed anything.
        restored = dist.reader("ds", source=source(master, "fresh"), state=saved)
        with pytest.raises(JobError, match=r"reads version 2 of dataset 'ds'; the reader state "
                                           r"restored was saved reading version 1"):
            list(restored.column_batches(5))
        for reader in (first, second, fresh, restored):
            reader.close()
    # A restarted master restores job 'train' on its version (1), not the current one.
    with MasterProcess(storage, state=state) as master:
        again = dist.reader("ds", source=source(master, "train"))
        assert Counter(i for b in again.column_batches(5) for i in b["_id"].tolist()) == Counter(
            range(FIRST))
        assert again.state_dict()["dataset_version"] == 1
        again.close()
