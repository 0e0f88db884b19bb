"""What `/status.json` (and so the page and `--watch`) says of a master's harder cases (issue 29):
partitions given up, with the readers' reasons, and a synchronous group with its ranks."""
from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import BatchOptions, MasterSource, PipelineOptions, SyncOptions, dist
from trainfeed.formats.manifest import read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

pytestmark = pytest.mark.integration


def status_of(master: MasterProcess, job: str) -> dict[str, Any]:
    url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore[union-attr]
    with urllib.request.urlopen(url, timeout=10) as answer:
        return next(j for j in json.load(answer)["jobs"] if j["job"] == job)


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
