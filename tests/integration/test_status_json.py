"""What `/status.json` (and so the page and `--watch`) says of a master's harder cases (issue 29):
partitions given up, with the readers' reasons, and a synchronous group with its ranks; records
left in the epoch with the time to its end, a job's state, and a newer version of its dataset
(issue 38)."""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import BatchOptions, MasterSource, PipelineOptions, SyncOptions, dist
from trainfeed.cli import status_watch
from trainfeed.formats.manifest import read_manifest
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.serve.version_watch import VERSION_CHECK_S
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

pytestmark = pytest.mark.integration


def snapshot_of(master: MasterProcess) -> dict[str, Any]:
    url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore[union-attr]
    with urllib.request.urlopen(url, timeout=10) as answer:
        return dict(json.load(answer))


def status_of(master: MasterProcess, job: str) -> dict[str, Any]:
    return next(j for j in snapshot_of(master)["jobs"] if j["job"] == job)


def test_lost_partitions_are_listed_with_the_readers_reason(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(make_image_list(tmp_path / "src", 40)), "flowers", storage,
           UploadOptions(row_group_rows=8), progress=False)
    manifest = read_manifest(open_storage(storage), "flowers")
    shard = Path(storage) / "flowers" / manifest.shards[0].path
    index = np.load(str(shard) + ".payload.npy")
    data = bytearray(shard.read_bytes())
    at = int(index[20, 0, 0]) + 50  # a payload byte of record 20 flipped: its checksum fails
    data[at:at + 3] = bytes(b ^ 0xFF for b in data[at:at + 3])
    shard.write_bytes(bytes(data))
    with MasterProcess(storage, extra_args=["--max-failures", "2"]) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, "lossy",
                                                            lost_partitions="skip"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(8)) == 32
            job = status_of(master, "lossy")
        finally:
            reader.close()
    [lost] = job["failed_partitions"]
    assert lost["epoch"] == 0 and lost["records"] == 8
    assert "does not match its checksum" in lost["reason"]
    assert job["failed"] == 1 and job["progress"] == 1.0


def test_a_synchronous_group_shows_its_ranks(storage: str) -> None:
    with MasterProcess(storage) as master:
        readers = [dist.reader("flowers", source=MasterSource(master.address, "synced"),
                               sync=SyncOptions(world_size=2, rank=rank),
                               pipeline=PipelineOptions(batch=BatchOptions(size=10)))
                   for rank in (0, 1)]
        counts = [0, 0]

        def read(rank: int) -> None:
            counts[rank] = sum(len(b["_id"]) for b in readers[rank].column_batches(10))
        threads = [threading.Thread(target=read, args=(rank,)) for rank in (0, 1)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            job = status_of(master, "synced")
        finally:
            for reader in readers:
                reader.close()
    assert counts == [50, 50]
    group = job["sync_group"]
    assert (group["world_size"], group["batch_size"], group["broken"]) == (2, 10, None)
    assert sorted(group["ranks"]) == ["0", "1"]
    assert set(group["ranks"].values()) == {r["worker"] for r in job["readers"]}


def test_records_left_follow_the_ledger_and_a_job_read_through_is_finished(
        storage: str) -> None:
    """f44c545 gave an epoch's progress in partitions only: no records left, no estimate of
    the time to its end; and no job state to list running jobs above finished ones."""
    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        opened = client.open_job("counted", "flowers", seed=0)
        job = status_of(master, "counted")
        assert (job["records_left"], job["eta_s"], job["state"]) == (100, None, "running")
        assert "to the end of the epoch — (no records read lately)" in "\n".join(
            status_watch.render(snapshot_of(master), "counted"))
        tasks = client.get_tasks("counted", opened.worker_id, 0, 2, 0).tasks
        first, second = tasks
        client.report("counted", opened.worker_id, [
            pb.TaskReport(epoch=0, partition=first.partition, lease=first.lease,
                          outcome=pb.TaskReport.DONE),
            pb.TaskReport(epoch=0, partition=second.partition, lease=second.lease,
                          outcome=pb.TaskReport.PROGRESS, consumed=3)],
            held=[(0, second.partition, second.lease)])
        job = status_of(master, "counted")
        assert job["records_left"] == 100 - first.num_records - 3
        client.leave_job("counted", opened.worker_id)
        assert status_of(master, "counted")["state"] == "idle"  # left inside its epoch

        reader = dist.reader("flowers", source=MasterSource(master.address, "whole"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(10)) == 100
            job = status_of(master, "whole")
            assert (job["records_left"], job["eta_s"], job["state"]) == (0, 0.0, "running")
        finally:
            reader.close()
        job = status_of(master, "whole")
        assert (job["state"], job["workers_alive"]) == ("finished", 0)
        lines = status_watch.render(snapshot_of(master), "whole")
        assert lines[0].endswith("· finished") and "left        0 records" in lines[2], lines


def test_an_append_is_logged_once_and_shown_with_how_to_move(tmp_path: Path) -> None:
    """f44c545: after `upload --append` a master job stayed on version 1 without a word, and a
    job restarted under its name never got the new records."""
    storage = str(tmp_path / "storage")
    words = tmp_path / "one.list"
    words.write_text("".join(f"w{i}\t{'ab'[i % 2]}\n" for i in range(20)))
    options = UploadOptions(kind="text", columns=("word", "label"), row_group_rows=4,
                            processes=1)
    upload(str(words), "ds", storage, options, progress=False)
    with MasterProcess(storage) as master:
        reader = dist.reader("ds", source=MasterSource(master.address, "pinned"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(5)) == 20
        finally:
            reader.close()
        assert status_of(master, "pinned")["newer_version"] is None
        words.write_text("".join(f"w{i}\t{'ab'[i % 2]}\n" for i in range(20, 30)))
        upload(str(words), "ds", storage, UploadOptions(**{**options.__dict__, "append": True}),
               progress=False)
        deadline = time.monotonic() + 6 * VERSION_CHECK_S + 30  # a check, with a busy machine
        while status_of(master, "pinned")["newer_version"] is None:
            assert time.monotonic() < deadline, "the master never noticed version 2"
            time.sleep(0.5)
        newer = status_of(master, "pinned")["newer_version"]
        log = "\n".join(master.log)
    assert (newer["version"], newer["num_records"]) == (2, 30)
    assert "job 'pinned' reads version 1 of dataset 'ds'; version 2 (30 records)" in \
        newer["notice"] and "a new job name (TRAINFEED_JOB or job=...)" in newer["notice"]
    assert log.count("job 'pinned' reads version 1 of dataset 'ds'; version 2") == 1, log
