"""A partition no reader can read: the master gives up on it, and the trainer is told.

Issue 14 measured a deleted or corrupted shard ending a master-fed epoch "normally" with records
missing (only ERROR lines in a log). Now the pass that lost records raises LostRecordsError at
its end, naming the partitions and why, unless the reader opted into skipping them, in which
case it lists them; every other record still comes exactly once.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import MasterSource, dist
from trainfeed.errors import LostRecordsError
from trainfeed.formats.manifest import read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.planning.partitions import plan_partitions
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

pytestmark = pytest.mark.integration
N = 80


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[str, set[int]]:
    """80 records in 8-row partitions, one of whose pages has flipped bytes; returns the
    storage and the ids of the damaged partition's records."""
    storage = str(tmp_path / "storage")
    upload(str(make_image_list(tmp_path / "src", N)), "flowers", storage,
           UploadOptions(row_group_rows=8), progress=False)
    manifest = read_manifest(open_storage(storage), "flowers")
    shard = Path(storage) / "flowers" / manifest.shards[0].path
    index = np.load(str(shard) + ".payload.npy")
    data = bytearray(shard.read_bytes())
    at = int(index[20, 0, 0]) + 50  # record 20: row group 2 (rows 16-23)
    data[at:at + 3] = bytes(b ^ 0xFF for b in data[at:at + 3])
    shard.write_bytes(bytes(data))
    partition = next(p for p in plan_partitions(manifest)
                     if p.row_group_start <= 2 < p.row_group_stop)
    first = sum(g.num_rows for g in manifest.shards[0].row_groups[:partition.row_group_start])
    return storage, set(range(first, first + partition.num_records))


def read_pass(reader: dist.Reader) -> Counter[int]:  # type: ignore[name-defined]
    seen: Counter[int] = Counter()
    for batch in reader.column_batches(8):
        seen.update(batch["_id"].tolist())
    return seen


def test_a_pass_that_lost_records_raises_at_its_end(damaged: tuple[str, set[int]]) -> None:
    storage, lost_ids = damaged
    with MasterProcess(storage, extra_args=["--max-failures", "2"]) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, job="lost"))
        seen: Counter[int] = Counter()
        with pytest.raises(LostRecordsError) as caught:
            for batch in reader.column_batches(8):
                seen.update(batch["_id"].tolist())
        reader.close()
    message = str(caught.value)
    assert "epoch 0 of job 'lost' lost 1 partition(s), 8 records" in message
    assert "record 20 of shard" in message and "does not match its checksum" in message
    assert "lost_partitions='skip'" in message
    assert set(seen) == set(range(N)) - lost_ids and max(seen.values()) == 1


def test_skipping_lists_what_was_lost_and_reads_on(damaged: tuple[str, set[int]]) -> None:
    storage, lost_ids = damaged
    with MasterProcess(storage, extra_args=["--max-failures", "2"]) as master:
        reader = dist.reader("flowers",
                             source=MasterSource(master.address, job="skip",
                                                 lost_partitions="skip"))
        first, second = read_pass(reader), read_pass(reader)
        lost = reader.lost_partitions
        reader.close()
    for seen in (first, second):
        assert set(seen) == set(range(N)) - lost_ids and max(seen.values()) == 1
    assert [(epoch, records) for epoch, _, records, _ in lost] == [(0, 8), (1, 8)]
    assert all("does not match its checksum" in reason for *_, reason in lost)


def test_a_bad_policy_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match=r"lost_partitions is 'ignore' \(str\), expected one "
                                         r"of \['raise', 'skip'\]"):
        dist.reader("flowers", source=MasterSource("localhost:1", lost_partitions="ignore"))
