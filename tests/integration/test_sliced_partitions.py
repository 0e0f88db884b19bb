"""A real master process and 2 reader processes over a small dataset whose partitions are slices
of its row groups (issue 13, point 3): the tasks carry each slice's first row, and every epoch
delivers every record exactly once, with the right content."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sample_data import file_digests, make_image_list
from test_multiprocess import delivered, lines, start_together, wait_all

from trainfeed.formats.manifest import read_manifest
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.planning.partitions import plan_partitions
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow]
N = 600  # 3 row groups of 200 rows: 64 slices of 9 or 10 records


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[str, Path]:
    source = make_image_list(tmp_path / "source", N)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=200), progress=False)
    manifest = read_manifest(open_storage(storage), "flowers")
    assert manifest.num_row_groups == 3 and len(plan_partitions(manifest)) == 64
    return storage, source


def test_two_readers_split_sliced_epochs_exactly_once(dataset: tuple[str, Path],
                                                      tmp_path: Path) -> None:
    storage, source = dataset
    digests = file_digests(source)
    with MasterProcess(storage) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        outs = [tmp_path / f"reader{i}.jsonl" for i in range(2)]
        slow = ("--epochs", "2", "--delay", "0.02")
        wait_all(start_together([(outs[0], slow), (outs[1], (*slow, "--batch", "7"))], env))
        with MasterClient(master.address) as client:
            status = client.job_status("train")
    assert status.num_partitions == 64
    per_epoch = delivered(outs, digests)  # checks each record's bytes and label by its id
    assert sorted(per_epoch) == [0, 1]
    for epoch, counts in per_epoch.items():
        assert counts == Counter(range(N)), (
            f"epoch {epoch}: missing {sorted(set(range(N)) - set(counts))[:10]}, repeated "
            f"{[i for i, n in counts.items() if n > 1][:10]}")
    assert all(any(not l.get("end") for l in lines(out)) for out in outs)  # both got work


@pytest.mark.timing
def test_pipeline_readers_decode_and_shuffle_slices_exactly_once(dataset: tuple[str, Path],
                                                                 tmp_path: Path) -> None:
    storage, source = dataset
    labels = {rid: label for rid, (_, label) in file_digests(source).items()}
    classes = sorted(set(labels.values()))
    with MasterProcess(storage) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        outs = [tmp_path / f"pipeline{i}.jsonl" for i in range(2)]
        wait_all(start_together([(out, ("--mode", "pipeline", "--epochs", "2", "--batch", "16",
                                         "--delay", "0.01")) for out in outs], env))
    per_epoch: dict[int, Counter[int]] = {}
    for out in outs:
        for line in lines(out):
            if line.get("end"):
                continue
            for rid, class_id in zip(line["ids"], line["class_ids"]):
                assert classes[class_id] == labels[rid]
            per_epoch.setdefault(line["epoch"], Counter()).update(line["ids"])
    assert sorted(per_epoch) == [0, 1]
    for counts in per_epoch.values():
        assert counts == Counter(range(N))
