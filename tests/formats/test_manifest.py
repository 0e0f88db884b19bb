from __future__ import annotations

import json

import pytest

from trainfeed.errors import CorruptDatasetError, DatasetNotFoundError
from trainfeed.formats.manifest import (
    FieldSpec,
    Manifest,
    RowGroupInfo,
    ShardInfo,
    list_datasets,
    read_manifest,
    write_manifest,
)
from trainfeed.storage import open_storage


def sample(name: str = "flowers") -> Manifest:
    groups = (RowGroupInfo(2, 10, 0), RowGroupInfo(1, 5, 2))
    return Manifest(
        name=name, kind="file", fields=(FieldSpec("image", "binary"), FieldSpec("label", "string")),
        label_field="label", num_records=3, num_bytes=15,
        shards=(ShardInfo("data/x/shard-00000.parquet", 3, 999, "ab" * 32, groups),),
        label_histogram={"cat": 2, "dog": 1}, fingerprint="f" * 64, source="train_data.list",
        created_at="2026-11-22T00:00:00Z", skipped=("l:3: gone.jpg",))


def test_round_trip_through_storage(storage_dir: str) -> None:
    storage = open_storage(storage_dir)
    write_manifest(storage, sample())
    write_manifest(storage, sample("public/digits"))
    assert read_manifest(storage, "flowers") == sample()
    assert list_datasets(storage) == ["flowers", "public/digits"]


def test_missing_dataset_names_what_exists(storage_dir: str) -> None:
    storage = open_storage(storage_dir)
    write_manifest(storage, sample())
    with pytest.raises(DatasetNotFoundError, match="no dataset 'tulips'.*datasets here: flowers"):
        read_manifest(storage, "tulips")


def test_counts_that_do_not_add_up_are_corrupt() -> None:
    body = json.loads(sample().to_json())
    body["num_records"] = 4
    with pytest.raises(CorruptDatasetError, match="row counts do not add up"):
        Manifest.from_json(json.dumps(body).encode())


def test_unknown_format_or_version_is_refused() -> None:
    body = json.loads(sample().to_json())
    body["version"] = 99
    with pytest.raises(CorruptDatasetError, match="manifest version 99"):
        Manifest.from_json(json.dumps(body).encode())
    with pytest.raises(CorruptDatasetError, match="unreadable manifest"):
        Manifest.from_json(b"{not json")
