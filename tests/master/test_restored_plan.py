"""A master upgraded to sliced partitions restores a job saved before them with the plan it was
made with: its ledger's partition ids keep naming the same records (issue 13, point 3)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed.formats.manifest import Manifest, read_manifest
from trainfeed.master.core import answers
from trainfeed.master.core.ledger import Ledger
from trainfeed.master.serve.service import Job, MasterConfig, MasterServicer
from trainfeed.master.stores import open_state_store
from trainfeed.planning.partitions import plan_partitions, whole_row_group_plan
from trainfeed.storage import Storage, open_storage
from trainfeed.upload import UploadOptions, upload


@pytest.fixture
def eight_row_groups(tmp_path: Path) -> tuple[Storage, Manifest]:
    """160 records in 8 row groups of 20: today 16 slices, before slices 8 partitions."""
    storage = str(tmp_path / "storage")
    upload(str(make_image_list(tmp_path / "source", 160, size=8)), "flowers", storage,
           UploadOptions(row_group_rows=20), progress=False)
    folder = open_storage(storage)
    return folder, read_manifest(folder, "flowers")


def save_job(tmp_path: Path, storage: Storage, manifest: Manifest, num_partitions: int) -> str:
    """Saves a job of `num_partitions` partitions mid-epoch, as an older master did."""
    url = f"sqlite:///{tmp_path / 'master.db'}"
    old = MasterServicer(MasterConfig(storage), open_state_store(url))
    ledger = Ledger(num_partitions, seed=1)
    ledger.lease("w", 0, 3, now=0.0, lease_timeout=10.0)
    old._snapshot(Job("train", manifest, whole_row_group_plan(manifest), ledger, 64))
    return url


def test_a_job_saved_before_slices_keeps_its_whole_row_group_partitions(
        tmp_path: Path, eight_row_groups: tuple[Storage, Manifest]) -> None:
    storage, manifest = eight_row_groups
    assert len(plan_partitions(manifest)) == 16
    url = save_job(tmp_path, storage, manifest, 8)
    master = MasterServicer(MasterConfig(storage), open_state_store(url))
    master.restore()
    job = master.jobs["train"]
    assert job.partitions == whole_row_group_plan(manifest)
    leased = sorted(job.ledger.pending)
    assert len(leased) == 3
    for p in leased:  # the leased ids still name whole row group p
        task = answers.task(job, 0, p)
        assert (task.row_group_start, task.row_group_stop, task.row_start,
                task.num_records) == (p, p + 1, 0, 20)


def test_a_job_whose_plan_is_unknown_starts_afresh(
        tmp_path: Path, eight_row_groups: tuple[Storage, Manifest],
        caplog: pytest.LogCaptureFixture) -> None:
    storage, manifest = eight_row_groups
    url = save_job(tmp_path, storage, manifest, 9)
    master = MasterServicer(MasterConfig(storage), open_state_store(url))
    with caplog.at_level(logging.WARNING):
        master.restore()
    assert "train" not in master.jobs
    assert "no partition plan of dataset 'flowers' (target 64) has 9 partitions" in caplog.text
