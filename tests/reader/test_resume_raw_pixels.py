"""A checkpoint resumed mid-epoch on a dataset of raw pixel records (`upload --raw-below`, issue
39 item 3) is exactly once, with the crops of the training path, locally (tests/reader/
test_resume.py's round trip: ids the saved model saw plus those the restored reader delivers are
the epoch's, each once)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_resume import BATCH, check_resume
from upload_samples import photo_list

from trainfeed import LocalSource, PipelineOptions, Reader, dist
from trainfeed.decode import raw
from trainfeed.formats.manifest import read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

N = 60


@pytest.fixture(scope="module")
def raw_storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """60 photos stored at most 32 px, every one as raw pixels (32² ≥ any stored size)."""
    root = tmp_path_factory.mktemp("raw-resume")
    listing = photo_list(root / "source", count=N)
    out = str(root / "storage")
    upload(str(listing), "raw", out, UploadOptions(max_side=32, raw_below=32 * 32,
                                                   row_group_rows=8), progress=False)
    assert "raw_pixels" in read_manifest(open_storage(out), "raw").extra
    return out


@pytest.mark.parametrize("sampling", [{}, {"shuffle_buffer": 1000}])
def test_a_raw_dataset_resumes_mid_epoch_exactly_once(raw_storage: str,
                                                      sampling: dict[str, Any]) -> None:
    pipeline = PipelineOptions.from_keywords(
        decode=True, image_size=(16, 16), batch_size=BATCH, random_flip=True,
        random_resized_crop=((0.08, 1.0), (3 / 4, 4 / 3)), **sampling)

    def make(state: dict[str, Any] | None) -> Reader:
        return dist.reader("raw", state=state, pipeline=pipeline,
                           source=LocalSource(raw_storage, seed=7, prefetch_partitions=2))

    def units(reader: Reader) -> Any:
        return iter(reader())

    def ids(batch: dict[str, Any]) -> list[int]:
        assert batch["image"].shape[1:] == (16, 16, 3)
        return [int(i) for i in batch["_id"].tolist()]

    with make(None) as plain:
        reference = Counter(i for unit in units(plain) for i in ids(unit))
    assert sorted(reference) == list(range(N))
    saw, after = check_resume(make, units, ids, reference, saved_after=1, lost=1)
    assert saw and after


def test_every_record_of_the_resume_dataset_is_raw(raw_storage: str) -> None:
    """The round trip above read raw records (not JPEGs the threshold let through)."""
    import pyarrow.parquet as pq

    store = open_storage(raw_storage)
    for shard in read_manifest(store, "raw").shards:
        images = pq.read_table(store.path("raw", shard.path))["image"].to_pylist()
        assert all(raw.is_raw(image) for image in images)
    assert Path(store.path("raw")).is_dir()
