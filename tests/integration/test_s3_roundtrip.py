"""A dataset round trip through a real S3 server (SeaweedFS, checking request signatures).

Upload JPEGs to `s3://bucket/prefix`, serve them from a master process, read them with reader
processes that get only the master's address and AWS credentials (as training pods would), and
compare every delivered record with its source file. The same dataset read locally
(`TRAIN_LOCAL`) must give the same records, and a reader with a wrong secret must fail with the
server's refusal rather than hang or yield nothing.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import s3fs
from integration.roundtrip import (
    SourceImages,
    assert_every_epoch_exactly_once,
    describe_difference,
    make_jpeg_list,
    read_pass,
    run_reader_expecting_failure,
    run_readers,
)

from trainfeed import (
    BatchOptions,
    LocalSource,
    PipelineOptions,
    SamplingOptions,
    UploadOptions,
    dist,
    upload,
)
from trainfeed.formats.manifest import MANIFEST_NAME, read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage

if TYPE_CHECKING:
    from integration.services import S3Server

pytestmark = pytest.mark.integration

NUM_IMAGES = 300
ROW_GROUP_ROWS = 16  # 19 row groups, each cut into 2 slices: 38 partitions, many per reader
DATASET = "pets"
EPOCHS = 2


@dataclass(frozen=True)
class S3Dataset:
    url: str  # the storage root, s3://bucket/prefix
    bucket: str
    source: SourceImages


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Credentials and endpoint in this process's environment, as a user's shell would have."""
    env = {**s3_server.env(), "TRAINFEED_S3_ENDPOINT": s3_server.endpoint_url}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TRAIN_LOCAL", raising=False)
    return env


@pytest.fixture
def s3_dataset(s3_server: S3Server, s3_env: dict[str, str], tmp_path: Path) -> S3Dataset:
    """NUM_IMAGES JPEGs uploaded as dataset DATASET to a fresh bucket, in small row groups."""
    bucket = f"roundtrip-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True).mkdir(bucket)
    source = make_jpeg_list(tmp_path / "source", NUM_IMAGES)
    url = f"s3://{bucket}/datasets"
    result = upload(
        str(source.list_path),
        DATASET,
        open_storage(url, s3_endpoint=s3_server.endpoint_url),
        UploadOptions(row_group_rows=ROW_GROUP_ROWS),
        progress=False,
    )
    assert not result.already_published
    assert result.num_records == NUM_IMAGES
    return S3Dataset(url, bucket, source)


def test_upload_lands_in_the_bucket(s3_server: S3Server, s3_dataset: S3Dataset) -> None:
    # Checked with a client of our own, not through trainfeed: the objects really are in S3.
    fs = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    folder = f"{s3_dataset.bucket}/datasets/{DATASET}"
    assert fs.exists(f"{folder}/{MANIFEST_NAME}")
    shards = fs.glob(f"{folder}/data/*/shard-*.parquet")
    assert shards, fs.find(folder)

    manifest = read_manifest(open_storage(s3_dataset.url), DATASET)
    assert manifest.num_records == NUM_IMAGES
    assert manifest.num_row_groups == math.ceil(NUM_IMAGES / ROW_GROUP_ROWS)
    assert manifest.label_histogram == dict(
        Counter(label for _, _, label in s3_dataset.source.records)
    )
    assert sorted(f"{folder}/{s.path}" for s in manifest.shards) == sorted(shards)


def s3_master(s3_server: S3Server, s3_dataset: S3Dataset) -> MasterProcess:
    """A master process serving the S3 storage, with the server's endpoint and credentials."""
    return MasterProcess(
        s3_dataset.url, env=s3_server.env(), extra_args=["--s3-endpoint", s3_server.endpoint_url]
    )


@pytest.mark.slow
def test_readers_get_every_record_once_per_epoch(
    s3_server: S3Server, s3_env: dict[str, str], s3_dataset: S3Dataset, tmp_path: Path
) -> None:
    with s3_master(s3_server, s3_dataset) as master:
        # The readers get the master's address and credentials, nothing else: the dataset's URL
        # and endpoint come from the master.
        outputs = run_readers(
            2,
            DATASET,
            master.address,
            tmp_path / "readers",
            epochs=EPOCHS,
            env={**s3_server.env(), "TRAINFEED_S3_ENDPOINT": "", "TRAINFEED_STORAGE": ""},
        )

    shares = assert_every_epoch_exactly_once(outputs, s3_dataset.source, EPOCHS)
    for epoch, by_reader in shares.items():
        assert all(by_reader.values()), f"epoch {epoch} was not split between readers: {by_reader}"


def test_local_reader_gets_the_same_records(s3_dataset: S3Dataset, s3_env: dict[str, str]) -> None:
    with dist.reader(DATASET, source=LocalSource(storage=s3_dataset.url)) as reader:
        first = read_pass(reader, batch_size=32)
        second = read_pass(reader, batch_size=32)

    want = s3_dataset.source.expected()
    assert Counter(first) == want, describe_difference(Counter(first), want)
    assert Counter(second) == want, describe_difference(Counter(second), want)
    assert first != second, "two local epochs came in the same order: no reshuffle"


def _wrong_secret(s3_server: S3Server) -> dict[str, str]:
    return {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": s3_server.secret_key + "-wrong"}


def test_local_reader_with_wrong_secret_fails(
    s3_server: S3Server, s3_env: dict[str, str], s3_dataset: S3Dataset, tmp_path: Path
) -> None:
    # In a child process: this process's S3 client, cached by fsspec, holds the right secret.
    failed = run_reader_expecting_failure(
        DATASET, {**_wrong_secret(s3_server), "TRAINFEED_STORAGE": s3_dataset.url}, tmp_path
    )
    # It names the storage and the credentials to check.
    assert "StorageAccessError: access to s3://" in failed.stderr, failed.stderr[-3000:]
    assert "AWS_SECRET_ACCESS_KEY" in failed.stderr, failed.stderr[-3000:]


@pytest.mark.slow
def test_distributed_reader_with_wrong_secret_fails(
    s3_server: S3Server, s3_env: dict[str, str], s3_dataset: S3Dataset, tmp_path: Path
) -> None:
    # The master's credentials are right, the reader's are not: OpenJob succeeds, every
    # partition read is refused. The reader must raise, not keep asking for partitions.
    with s3_master(s3_server, s3_dataset) as master:
        failed = run_reader_expecting_failure(
            DATASET, _wrong_secret(s3_server), tmp_path, master=master.address
        )
    # It names the cause: no partition could be read, and the storage's refusal.
    assert "PartitionReadError" in failed.stderr, failed.stderr[-3000:]
    assert "Forbidden" in failed.stderr, failed.stderr[-3000:]


def test_resampling_fetches_only_kept_payloads_by_byte_range(
        s3_dataset: S3Dataset, s3_env: dict[str, str]) -> None:
    """Over S3 the kept records' payloads come as ranged GETs (fsspec cat_ranges), and their
    bytes are exactly the files' bytes."""
    labels = sorted({label for _, _, label in s3_dataset.source.records})
    keep_one = {labels[0]: 1.0}  # every other class gets weight 0: never fetched
    with dist.reader(DATASET, source=LocalSource(storage=s3_dataset.url),
                     pipeline=PipelineOptions(sampling=SamplingOptions(resample=keep_one),
                                              batch=BatchOptions(size=32))) as reader:
        got = {int(i): bytes(img) for b in reader() for i, img in zip(b["_id"], b["image"])}
        fetched = reader.payload_bytes_read
    with dist.reader(DATASET, source=LocalSource(storage=s3_dataset.url)) as plain:
        everything = {int(i): img for b in plain.column_batches(32)
                      for i, img in zip(b["_id"], b["image"])}
        total = plain.payload_bytes_read
    assert sorted(got) == sorted(i for i, _, label in s3_dataset.source.records
                                 if label == labels[0])
    assert all(got[i] == everything[i] for i in got)
    assert fetched == sum(len(img) for img in got.values()) < total
