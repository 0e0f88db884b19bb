"""A reader whose first pass finds the job's epoch entirely in others' hands (issue 13, point 6).

Before: a second process started late got a pass with 0 records and `epoch None` (Keras then ran
`model.fit` for 0 steps and returned an empty history). Now the pass joins the epoch the job is
on, waits while another reader finishes what it has started, and when that epoch completes
without it, goes on into the next epoch: a first pass is never empty.

Real master process; both readers in this process, the first one paused mid-partition so that
every partition of epoch 0 is done or started (nothing can be stolen)."""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed import BatchOptions, MasterSource, PipelineOptions, dist
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RECORDS = 64


def test_a_first_pass_that_finds_the_epoch_taken_reads_the_next_one(tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "source", RECORDS)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    job = f"late-{uuid.uuid4().hex[:8]}"
    with MasterProcess(storage) as master:
        early = dist.reader("flowers", source=MasterSource(master.address, job=job),
                            pipeline=PipelineOptions(batch=BatchOptions(size=1)))
        early_pass = early()
        # All but the last record: every partition is done or started by this reader.
        first = [int(b["_id"][0]) for b in itertools.islice(early_pass, RECORDS - 1)]
        assert early.epoch == 0

        late = dist.reader("flowers", source=MasterSource(master.address, job=job),
                           pipeline=PipelineOptions(batch=BatchOptions(size=1)))
        got: list[int] = []
        finished = threading.Event()

        def late_pass() -> None:
            got.extend(int(b["_id"][0]) for b in late())
            finished.set()

        thread = threading.Thread(target=late_pass, daemon=True)
        thread.start()
        time.sleep(2.0)  # the late reader asks for work; nothing of epoch 0 can be given
        assert not got, "the late reader got a record someone had started"
        assert not finished.is_set(), "the late reader's pass ended empty"

        last = [int(b["_id"][0]) for b in early_pass]  # the early reader completes epoch 0
        assert sorted(first + last) == list(range(RECORDS))

        thread.join(60)
        assert finished.is_set(), "the late reader's pass did not end"
        assert late.epoch == 1, late.epoch
        assert sorted(got) == list(range(RECORDS)), "the late pass is not epoch 1 whole"
        early.close()
        late.close()
