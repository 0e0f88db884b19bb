"""Uploads in several processes write exactly what one process writes (issue 30 §2): shards are
planned from the files' sizes before any is read (trainfeed.ingest.plan), so the manifest and
every shard's bytes do not depend on the process count, with or without transforms."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from upload_samples import photo_list

from trainfeed.ingest.plan import Layout, ShardPlan, plan_shards, row_groups, slice_of
from trainfeed.upload import UploadOptions, upload

LAYOUT: dict[str, Any] = {"row_group_rows": 8, "shard_row_groups": 3}


def dataset_files(root: Path) -> dict[str, str]:
    """Path -> sha256 of every file of a dataset folder; the manifest without its time."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            data = path.read_bytes()
            if path.name == "manifest.json" or path.parent.name == "versions":
                body = json.loads(data)
                body.pop("created_at")
                for version in body.get("versions", ()):  # its history names the time too
                    version.pop("created_at")
                data = json.dumps(body, sort_keys=True).encode()
            out[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("transform", [{}, {"jpeg_restarts": True},
                                       {"max_side": 64, "jpeg_restarts": True}])
def test_the_output_does_not_depend_on_the_process_count(tmp_path: Path,
                                                         transform: dict) -> None:
    listing = photo_list(tmp_path / "source")
    outputs = []
    for processes in (1, 2, 3):
        storage = tmp_path / f"storage{processes}"
        result = upload(str(listing), "photos", str(storage),
                        UploadOptions(processes=processes, **LAYOUT, **transform),
                        progress=False)
        assert result.num_records == 60 and result.num_shards == 3
        outputs.append(dataset_files(storage / "photos"))
    assert outputs[0] == outputs[1] == outputs[2]
    assert sum(name.endswith(".parquet") for name in outputs[0]) == 4  # 3 shards, sources


def test_the_plan_is_the_cut_of_one_writer() -> None:
    layout = Layout(row_group_rows=3, row_group_bytes=100, shard_row_groups=2, shard_bytes=150)
    sizes = [10] * 7 + [90, 90, 5, 200, 1]
    assert row_groups(sizes, layout) == [3, 3, 2, 2, 1, 1]  # rows, then bytes, cut them
    # Shards end at 2 groups, or at a group bringing them to 150 bytes.
    assert plan_shards(sizes, layout) == (ShardPlan(0, 0, 6), ShardPlan(1, 6, 10),
                                          ShardPlan(2, 10, 11), ShardPlan(3, 11, 12))
    assert plan_shards([], layout) == ()


def test_slices_cover_the_shards_once_in_order() -> None:
    shards = plan_shards([1] * 50, Layout(2, 100, 2, 1000))
    for count in (1, 2, 3, 7, 20):
        slices = [slice_of(shards, i, count) for i in range(count)]
        assert [s for part in slices for s in part] == list(shards)
    with pytest.raises(ValueError, match="index 3 is not one of the 3 indexes 0..2"):
        slice_of(shards, 3, 3)
