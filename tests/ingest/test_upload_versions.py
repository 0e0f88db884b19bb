"""Dataset versions (issue 30 §4): `upload --append` adds a list as the next version without
rewriting a shard; a reader keeps the version it opened while another is published; a reader
state names its version and is refused by another; an append that does not fit, or is killed
mid-write, publishes nothing. On a local folder and on real S3 (SeaweedFS)."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from sample_data import make_image_list

from trainfeed import LocalSource, dist
from trainfeed.errors import AppendMismatchError, CheckpointError, DatasetNotFoundError
from trainfeed.formats.manifest import MANIFEST_NAME, Manifest, dataset_storage, read_manifest
from trainfeed.formats.sources import SourceIndex
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

FIRST, ADDED = 40, 25
# Text records in row groups of 4 rows, shards of 4 groups: several shards per version.
OPTIONS = UploadOptions(kind="text", columns=("word", "label"), row_group_rows=4,
                        shard_row_groups=4, processes=1)
APPEND = UploadOptions(**{**OPTIONS.__dict__, "append": True})


def word_list(path: Path, start: int, count: int) -> Path:
    """`count` lines "w<i>\\t<label>" for i from `start` (labels a, b, c in turn)."""
    path.write_text("".join(f"w{i}\t{'abc'[i % 3]}\n" for i in range(start, start + count)))
    return path


def ids(storage: str, name: str) -> list[int]:
    reader = dist.reader(name, source=LocalSource(storage=storage, seed=3))
    return [i for b in reader.column_batches(7) for i in b["_id"].tolist()]


def words(storage: str, name: str) -> Counter[str]:
    reader = dist.reader(name, source=LocalSource(storage=storage))
    return Counter(b for batch in reader.column_batches(7) for b in batch["word"])


def folder_files(storage: str, name: str) -> dict[str, str]:
    """Every file of the dataset's folder (but the manifest) -> its SHA-256."""
    folder = dataset_storage(open_storage(storage), name)
    out = {}
    for path in folder.fs.find(folder.root):
        rel = path[len(folder.root):].strip("/")
        if rel != MANIFEST_NAME:
            out[rel] = hashlib.sha256(folder.fs.cat_file(path)).hexdigest()
    return out


@pytest.fixture(params=["folder", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A storage root: a local folder, or a fresh S3 bucket (credentials in the environment)."""
    if request.param == "folder":
        yield str(tmp_path / "storage")
        return
    server = request.getfixturevalue("s3_server")
    for name, value in {**server.env(), "TRAINFEED_S3_ENDPOINT": server.endpoint_url}.items():
        monkeypatch.setenv(name, value)
    bucket = f"versions-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True).mkdir(bucket)
    yield f"s3://{bucket}/datasets"


def test_append_adds_a_version_and_each_version_reads_exactly_once(root: str,
                                                                   tmp_path: Path) -> None:
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", root, OPTIONS, progress=False)
    before = folder_files(root, "ds")
    result = upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", root, APPEND,
                    progress=False)
    assert result.version == 2 and result.num_records == FIRST + ADDED
    # No shard of version 1 was rewritten (or removed): same files, same bytes.
    after = folder_files(root, "ds")
    assert {k: v for k, v in after.items() if k in before} == before
    store = open_storage(root)
    v1, v2 = read_manifest(store, "ds", 1), read_manifest(store, "ds")
    assert v2.dataset_version == 2 and v2.shards[:len(v1.shards)] == v1.shards
    assert len(v2.shards) > len(v1.shards)
    assert [v.version for v in v2.history] == [1, 2]
    # Record ids continue after version 1's: unique and stable.
    assert Counter(ids(root, "ds@1")) == Counter(range(FIRST))
    assert Counter(ids(root, "ds")) == Counter(range(FIRST + ADDED))
    assert words(root, "ds") == Counter(f"w{i}" for i in range(FIRST + ADDED))
    # Re-running the same append does nothing, as a re-run upload does.
    again = upload(str(tmp_path / "two.list"), "ds", root, APPEND, progress=False)
    assert again.already_published and read_manifest(store, "ds").dataset_version == 2


def test_an_appended_image_list_adds_its_labels_and_its_sources(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(make_image_list(tmp_path / "a", 30)), "pets", storage, progress=False)
    more = make_image_list(tmp_path / "b", 12, labels=("dog", "fox"), seed=1, name="more.list")
    upload(str(more), "pets", storage, UploadOptions(append=True), progress=False)
    manifest = read_manifest(open_storage(storage), "pets")
    assert manifest.label_histogram == {"bird": 10, "cat": 10, "dog": 16, "fox": 6}
    reader = dist.reader("pets", source=LocalSource(storage=storage))
    got = {i: label for b in reader.column_batches(8)
           for i, label in zip(b["_id"].tolist(), b["label"])}
    assert sorted(got) == list(range(42)) and got[30] == "dog" and got[31] == "fox"
    # A record's provenance names its own list, whichever version brought it.
    sources = reader_sources(storage, manifest)
    assert sources.describe(31) == "images/00001.jpg, more.list line 2"
    assert sources.describe(1) == "images/00001.jpg, train_data.list line 2"


def reader_sources(storage: str, manifest: Manifest) -> SourceIndex:
    """The provenance index a reader's pipeline builds (trainfeed.reader.pipeline)."""
    return SourceIndex(dataset_storage(open_storage(storage), manifest.name), manifest.sources,
                       manifest.source, [(v.sources, v.source) for v in manifest.versions])


def test_a_reader_keeps_its_version_while_the_next_is_published(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    reader = dist.reader("ds", source=LocalSource(storage=storage, prefetch_partitions=1))
    batches = reader.column_batches(5)
    got = [i for b in itertools.islice(batches, 2) for i in b["_id"].tolist()]
    upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage, APPEND,
           progress=False)
    got += [i for b in batches for i in b["_id"].tolist()]
    assert Counter(got) == Counter(range(FIRST))
    # The next epoch too: the reader reads the version it opened until it is closed.
    assert Counter(i for b in reader.column_batches(5) for i in b["_id"].tolist()) == Counter(
        range(FIRST))
    assert reader.state_dict()["dataset_version"] == 1


def test_a_state_of_one_version_is_refused_by_another(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    reader = dist.reader("ds", source=LocalSource(storage=storage, prefetch_partitions=1))
    batches = reader.column_batches(5)
    before = [i for b in itertools.islice(batches, 3) for i in b["_id"].tolist()]
    saved = json.loads(json.dumps(reader.state_dict()))
    reader.close()
    assert saved["dataset_version"] == 1
    upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage, APPEND,
           progress=False)
    restored = dist.reader("ds", source=LocalSource(storage=storage), state=saved)
    with pytest.raises(CheckpointError, match=r"saved reading version 1 of dataset 'ds', but "
                                              r"this reader opened version 2.*'ds@1'"):
        list(restored.column_batches(5))
    # Opened on the state's version, it goes on exactly where the state stopped.
    on_v1 = dist.reader("ds@1", source=LocalSource(storage=storage), state=saved)
    after = [i for b in on_v1.column_batches(5) for i in b["_id"].tolist()]
    assert Counter(before + after) == Counter(range(FIRST))


def test_an_append_that_does_not_fit_names_the_field_and_publishes_nothing(
        tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    before = (folder_files(storage, "ds"), read_manifest(open_storage(storage), "ds"))
    three = tmp_path / "three.list"
    three.write_text("w1\ta\tx\n")
    with pytest.raises(AppendMismatchError, match="field 'note' is not one of the dataset's "
                                                  r"fields \(word, label\)"):
        upload(str(three), "ds", storage,
               UploadOptions(**{**APPEND.__dict__, "columns": ("word", "label", "note")}),
               progress=False)
    renamed = UploadOptions(**{**APPEND.__dict__, "columns": ("text", "label")})
    with pytest.raises(AppendMismatchError, match="field 'text' is not one of"):
        upload(str(word_list(tmp_path / "two.list", FIRST, 3)), "ds", storage, renamed,
               progress=False)
    assert (folder_files(storage, "ds"), read_manifest(open_storage(storage), "ds")) == before
    with pytest.raises(DatasetNotFoundError, match="upload the first list without --append"):
        upload(str(tmp_path / "two.list"), "other", storage, APPEND, progress=False)


# Runs the CLI, SIGKILLed at the `kill_at`-th row group it encodes, or as it writes the name
# given (a path ending), whichever comes first.
KILLER = """
import os, signal, sys
from trainfeed.formats import shards
from trainfeed.storage import Storage
from trainfeed.cli.main import main

kill_at, name, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
calls = {"n": 0}
add, write = shards.ShardEncoder.add, Storage.write_atomic

def counted(self, group):
    calls["n"] += 1
    if calls["n"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    add(self, group)

def watched(self, rel, data):
    if name and rel.endswith(name):
        os.kill(os.getpid(), signal.SIGKILL)
    return write(self, rel, data)

shards.ShardEncoder.add = counted
Storage.write_atomic = watched
sys.exit(main(rest))
"""


def append_cli(listing: Path, storage: str, kill_at: int = 0, name: str = "",
               ) -> subprocess.CompletedProcess[str]:
    args = [str(listing), "--dataset", "ds", "--storage", storage, "--kind", "text",
            "--columns", "word,label", "--rows-per-group", "4", "--processes", "1", "--append",
            "--no-progress"]
    return subprocess.run([sys.executable, "-c", KILLER, str(kill_at), name, "upload", *args],
                          capture_output=True, text=True, timeout=300)


def test_an_append_killed_mid_write_publishes_nothing(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    published = read_manifest(open_storage(storage), "ds")
    two = word_list(tmp_path / "two.list", FIRST, 300)  # 75 row groups: 2 shards
    killed = append_cli(two, storage, kill_at=70)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert read_manifest(open_storage(storage), "ds") == published
    assert Counter(ids(storage, "ds")) == Counter(range(FIRST))
    # Killed between the new version's own manifest and manifest.json: still not published.
    killed = append_cli(two, storage, name=MANIFEST_NAME)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert read_manifest(open_storage(storage), "ds") == published
    with pytest.raises(DatasetNotFoundError, match="has no version 2: its readable versions "
                                                   "are 1"):
        read_manifest(open_storage(storage), "ds", 2)
    done = append_cli(two, storage)
    assert done.returncode == 0, done.stderr
    assert "version 2" in done.stdout
    assert Counter(ids(storage, "ds")) == Counter(range(FIRST + 300))


def test_info_lists_the_versions(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage, APPEND,
           progress=False)
    out = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "info", "ds",
                          "--storage", storage], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert "version   2" in out and "versions  2" in out
    assert "ds@1\t" in out and f"+{FIRST} records from one.list\t{FIRST} in all" in out
    assert f"+{ADDED} records from two.list\t{FIRST + ADDED} in all" in out


def test_a_dataset_from_before_versions_can_be_appended_to(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    listing = tmp_path / "one.list"
    word_list(listing, 0, FIRST)
    listing.write_text(listing.read_text() + "# a comment\n")
    upload(str(listing), "ds", storage, OPTIONS, progress=False)
    # The manifest as written before versions: no version fields, no versions/ folder.
    # A dataset never appended to has a manifest that releases before versions read: none of
    # the version keys.
    folder = dataset_storage(open_storage(storage), "ds")
    assert not {"dataset_version", "next_id", "versions"} & set(
        json.loads(folder.read_bytes(MANIFEST_NAME)))
    folder.fs.rm(folder.path("versions"), recursive=True)
    upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage, APPEND,
           progress=False)
    assert Counter(ids(storage, "ds@1")) == Counter(range(FIRST))
    assert Counter(ids(storage, "ds")) == Counter(range(FIRST + ADDED))
    # (The trailing comment took no id: the append numbers its records from FIRST.)
    appended = json.loads(folder.read_bytes(MANIFEST_NAME))
    assert appended["dataset_version"] == 2 and len(appended["versions"]) == 2


def test_overwrite_takes_the_next_number_and_drops_the_replaced_versions(
        tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    upload(str(word_list(tmp_path / "one.list", 0, FIRST)), "ds", storage, OPTIONS,
           progress=False)
    upload(str(word_list(tmp_path / "two.list", FIRST, ADDED)), "ds", storage, APPEND,
           progress=False)
    replaced = UploadOptions(**{**OPTIONS.__dict__, "overwrite": True})
    result = upload(str(word_list(tmp_path / "new.list", 0, 10)), "ds", storage, replaced,
                    progress=False)
    assert result.version == 3
    store = open_storage(storage)
    assert [v.version for v in read_manifest(store, "ds").history] == [3]
    with pytest.raises(DatasetNotFoundError, match="no version 1: its readable versions are 3"):
        read_manifest(store, "ds", 1)
    assert sorted(os.listdir(tmp_path / "storage" / "ds" / "versions")) == ["3.json"]
    assert Counter(ids(storage, "ds")) == Counter(range(10))
