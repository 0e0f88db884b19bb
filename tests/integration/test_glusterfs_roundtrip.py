"""A dataset round trip through a real FUSE-mounted GlusterFS volume.

To trainfeed a GlusterFS volume is a plain folder; what differs from a local disk is FUSE: rename
and fsync semantics, and latency. Upload JPEGs to a folder on the mount, serve them from a master
process, read them with three reader processes and with the local reader, and compare every
delivered record with its source file. The upload must leave no temporary files behind: the
manifest (and every shard) is published by an atomic rename.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from integration.roundtrip import (
    SourceImages,
    assert_every_epoch_exactly_once,
    describe_difference,
    make_jpeg_list,
    read_pass,
    run_readers,
)

from trainfeed import LocalSource, UploadOptions, dist, upload
from trainfeed.formats.manifest import MANIFEST_NAME, Manifest, read_manifest
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage

pytestmark = pytest.mark.integration

NUM_IMAGES = 300
ROW_GROUP_ROWS = 16  # 19 row groups, each cut into 2 slices of 8: 38 partitions
SHARD_ROW_GROUPS = 4  # 5 shards: readers move between files, as on a real dataset
DATASET = "pets"
EPOCHS = 2


@pytest.fixture
def gluster_storage(glusterfs_mount: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder on the GlusterFS mount, used as the storage root."""
    monkeypatch.delenv("TRAIN_LOCAL", raising=False)
    root = glusterfs_mount / f"roundtrip-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    return root


@pytest.fixture
def source(tmp_path: Path) -> SourceImages:
    return make_jpeg_list(tmp_path / "source", NUM_IMAGES)


def _upload(source: SourceImages, storage: Path) -> None:
    result = upload(
        str(source.list_path),
        DATASET,
        open_storage(str(storage)),
        UploadOptions(row_group_rows=ROW_GROUP_ROWS, shard_row_groups=SHARD_ROW_GROUPS),
        progress=False,
    )
    assert not result.already_published
    assert result.num_records == NUM_IMAGES
    assert result.num_shards == -(-NUM_IMAGES // (ROW_GROUP_ROWS * SHARD_ROW_GROUPS))


def test_upload_publishes_atomically(
    source: SourceImages, gluster_storage: Path, tmp_path: Path
) -> None:
    _upload(source, gluster_storage)
    folder = gluster_storage / DATASET
    assert _temporary_files(folder) == []
    manifest = read_manifest(open_storage(str(gluster_storage)), DATASET)
    assert sorted([*(s.path for s in manifest.shards), manifest.sources]) == \
        _parquet_files(folder)
    assert manifest.label_histogram == dict(Counter(label for _, _, label in source.records))

    # Replace it with half the images while another thread keeps reading the manifest: every
    # read must see one whole manifest, the old or the new, never a half-written file.
    # (Beside the original list: its paths are relative to its folder. Written in tmp_path,
    # this list was once detected as a *text* list of path strings and published silently.)
    half = source.list_path.with_name("half.list")
    half.write_text("".join(source.list_path.read_text().splitlines(keepends=True)[:150]))
    dataset_folder = open_storage(str(gluster_storage)).child(DATASET)
    seen: Counter[int] = Counter()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            # Storage.read_bytes rides out the ESTALE that the GlusterFS client can answer to an
            # open() racing the rename (about 1 in 500 renames here): no error may reach us.
            data = dataset_folder.read_bytes(MANIFEST_NAME)
            current = Manifest.from_json(data, where="manifest read during the upload")
            seen[current.num_records] += 1

    with ThreadPoolExecutor(1) as pool:
        watcher = pool.submit(watch)
        try:
            upload(
                str(half),
                DATASET,
                open_storage(str(gluster_storage)),
                UploadOptions(row_group_rows=ROW_GROUP_ROWS, overwrite=True),
                progress=False,
            )
        finally:
            stop.set()
        watcher.result(timeout=30)  # re-raises what the watcher saw
    assert set(seen) <= {NUM_IMAGES, 150} and seen, seen

    assert _temporary_files(folder) == []
    replaced = read_manifest(open_storage(str(gluster_storage)), DATASET)
    assert replaced.num_records == 150
    # The old upload's shards (and record sources) were deleted once the new manifest was live.
    assert sorted([*(s.path for s in replaced.shards), replaced.sources]) == \
        _parquet_files(folder)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _temporary_files(folder: Path) -> list[str]:
    return [f for f in _files(folder) if ".tmp-" in f]


def _parquet_files(folder: Path) -> list[str]:
    return [f for f in _files(folder) if f.endswith(".parquet")]


@pytest.mark.slow
def test_readers_get_every_record_once_per_epoch(
    source: SourceImages, gluster_storage: Path, tmp_path: Path
) -> None:
    _upload(source, gluster_storage)

    with MasterProcess(str(gluster_storage)) as master:
        outputs = run_readers(3, DATASET, master.address, tmp_path / "readers", epochs=EPOCHS)

    shares = assert_every_epoch_exactly_once(outputs, source, EPOCHS)
    for epoch, by_reader in shares.items():
        assert all(by_reader.values()), f"epoch {epoch} was not split between readers: {by_reader}"


def test_local_reader_gets_the_same_records(source: SourceImages, gluster_storage: Path) -> None:
    _upload(source, gluster_storage)

    with dist.reader(DATASET, source=LocalSource(storage=str(gluster_storage))) as reader:
        first = read_pass(reader, batch_size=32)
        second = read_pass(reader, batch_size=32)

    want = source.expected()
    assert Counter(first) == want, describe_difference(Counter(first), want)
    assert Counter(second) == want, describe_difference(Counter(second), want)
