"""Files the reader and the master open because storage said so, and checkpoints a trainer hands
back (issue 35: "files the reader trusts too much", "checkpoints with absurd epochs").

A manifest is a file anyone with write access to the storage can edit. Every path it names must
lie inside the dataset's folder: a `..`, an absolute path, a URL, a backslash, an empty path are a
CorruptDatasetError naming the dataset, the manifest and the path, at load, before anything is
opened (before, `../../x` and `/abs/x` were opened wherever they pointed). A file that is not a
regular one (a FIFO, a device, a socket, a directory), or a symbolic link out of the dataset, is
refused unopened (before, a FIFO hung the reader with no word: pyarrow's open waits for a
writer). Each is checked with a local reader and a master-fed one (a real master process).

A restored reader state's numbers are bounded (trainfeed.reader.position: MAX_EPOCH, ...): an
epoch of 10^9 was accepted, and 2^70 was a raw protobuf "Value out of range" master-fed.

Hangs: a read runs in a thread joined with a bound (WAIT_S, far above the second or so a refusal
takes, so a busy machine cannot fail it); a reader still waiting then fails the test, and the
FIFO it waits on is opened for writing to let it go, so the old code's hang is a failure, not a
hung suite.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.errors import CheckpointError, CorruptDatasetError, JobError, TrainfeedError
from trainfeed.formats.shards import PAYLOAD_INDEX_SUFFIX
from trainfeed.lease.client import GIVE_UP_ENV
from trainfeed.master.serve.process import MasterProcess
from trainfeed.reader.position import MAX_EPOCH

# How long a read may take to fail before the test calls it a hang: a refusal takes well under a
# second; the margin is for a machine shared by many test processes.
WAIT_S = 60
NAME = "flowers"


# --- the dataset and its edits ------------------------------------------------------------------


def folder(storage: str) -> Path:
    return Path(storage) / NAME


def manifest_of(storage: str) -> dict[str, Any]:
    return json.loads((folder(storage) / "manifest.json").read_bytes())


def edit_manifest(storage: str, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edits the published manifest in place, as a storage writer could."""
    manifest = manifest_of(storage)
    edit(manifest)
    (folder(storage) / "manifest.json").write_text(json.dumps(manifest))


def first_shard(storage: str) -> Path:
    return folder(storage) / manifest_of(storage)["shards"][0]["path"]


def outside_copy(storage: str) -> Path:
    """A copy of the first shard (with its index) outside the dataset's folder: what an escaping
    path would read, whole and valid, if it were opened."""
    shard = first_shard(storage)
    target = Path(storage).parent / "elsewhere" / "shard.parquet"
    target.parent.mkdir(exist_ok=True)
    shutil.copy(shard, target)
    shutil.copy(f"{shard}{PAYLOAD_INDEX_SUFFIX}", f"{target}{PAYLOAD_INDEX_SUFFIX}")
    return target


def shard_path(value: Callable[[str], str]) -> Callable[[str], None]:
    """An edit setting the first shard's path to `value(storage)`."""
    def apply(storage: str) -> None:
        path = value(storage)
        edit_manifest(storage, lambda m: m["shards"][0].__setitem__("path", path))
    return apply


def climbing(storage: str) -> str:
    copy = outside_copy(storage)
    return os.path.relpath(copy, folder(storage))  # ../elsewhere/shard.parquet


# (case, edit of the storage, what the error names). Each reads the escaped-to copy on the old code.
ESCAPES: list[tuple[str, Callable[[str], None], str]] = [
    ("dot-dot", shard_path(climbing), r"shards\[0\]\.path is '\.\./.*'.*'\.\.' component"),
    ("absolute", shard_path(lambda s: str(outside_copy(s))), r"shards\[0\]\.path is '/.*absolute"),
    ("url", shard_path(lambda s: f"file://{outside_copy(s)}"), r"shards\[0\]\.path.*':'"),
    ("backslash", shard_path(lambda s: climbing(s).replace("/", "\\")),
     r"shards\[0\]\.path.*backslash"),
    ("empty", shard_path(lambda s: ""), r"shards\[0\]\.path is '': it is empty"),
    ("nul", shard_path(lambda s: "data/x\x00.parquet"), r"shards\[0\]\.path.*control character"),
    ("sources", lambda s: edit_manifest(s, lambda m: m.__setitem__("sources", "../../x")),
     r"sources is '\.\./\.\./x'"),
    ("payload index", lambda s: edit_manifest(
        s, lambda m: m["shards"][0].__setitem__("payload_index", "/etc/passwd")),
     r"shards\[0\]\.payload_index is '/etc/passwd'"),
]


def replace_with(make: Callable[[Path], None], which: Callable[[str], Path] = first_shard
                 ) -> Callable[[str], None]:
    """An edit replacing file `which(storage)` with what `make(path)` creates there."""
    def apply(storage: str) -> None:
        path = which(storage)
        path.unlink()
        make(path)
    return apply


def index_of_first_shard(storage: str) -> Path:
    return Path(f"{first_shard(storage)}{PAYLOAD_INDEX_SUFFIX}")


def bind_socket(path: Path) -> None:
    """A Unix socket file at `path` (bound through its folder's descriptor: a socket's path
    is limited to 107 bytes, and pytest's are longer)."""
    parent = os.open(path.parent, os.O_RDONLY)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(f"/proc/self/fd/{parent}/{path.name}")  # the file stays once it is closed
    finally:
        os.close(parent)


def link_out(storage: str) -> None:
    """The first shard made a symbolic link to a valid copy of it outside the dataset."""
    copy = outside_copy(storage)
    first_shard(storage).unlink()
    first_shard(storage).symlink_to(copy)


# (case, edit, what the error says). None of these files is a regular one inside the dataset.
NOT_FILES: list[tuple[str, Callable[[str], None], str]] = [
    ("fifo shard", replace_with(os.mkfifo), r"is a FIFO.*not a regular file: refused unopened"),
    ("fifo payload index", replace_with(os.mkfifo, index_of_first_shard), r"is a FIFO"),
    ("directory shard", replace_with(os.mkdir), r"is a directory, not a regular file"),
    ("socket shard", replace_with(bind_socket), r"is a socket, not a regular file"),
    ("device via a symlink", replace_with(lambda p: p.symlink_to("/dev/zero")),
     r"leads out of .*'/dev/zero'"),
    ("symlink out of the dataset", link_out, r"leads out of .*elsewhere"),
]


def fifos(storage: str) -> Iterator[Path]:
    return (p for p in Path(storage).rglob("*") if p.is_fifo())


def outcome(storage: str, read: Callable[[], object]) -> BaseException | None:
    """What `read()` raised (None: nothing), failing the test if it is still waiting after
    WAIT_S; a reader waiting on a FIFO of `storage` is let go first."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            read()
        except BaseException as e:  # handed to the test thread
            raised.append(e)
    thread = threading.Thread(target=run, daemon=True, name="reader-doors")
    thread.start()
    thread.join(WAIT_S)
    if thread.is_alive():
        for fifo in fifos(storage):  # a writer opening and closing it ends the reader's wait
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(WAIT_S)
        pytest.fail(f"the read was still waiting after {WAIT_S} s, with no error")
    return raised[0] if raised else None


def read_local(storage: str) -> Callable[[], object]:
    def read() -> object:
        with dist.reader(NAME, source=LocalSource(storage=storage)) as reader:
            return [b for b in reader.column_batches(10)]
    return read


def read_master_fed(address: str, job: str) -> Callable[[], object]:
    def read() -> object:
        with dist.reader(NAME, source=MasterSource(address, job=job)) as reader:
            return [b for b in reader.column_batches(10)]
    return read


def assert_refused(error: BaseException | None, match: str) -> None:
    """A TrainfeedError whose message (or its cause's, for an error a pass wraps) matches."""
    assert error is not None, "the read went through: nothing was refused"
    messages = []
    seen: BaseException | None = error
    while seen is not None:
        messages.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    assert isinstance(error, TrainfeedError), f"{type(error).__name__}: {error}"
    assert any(re.search(match, m, re.S) for m in messages), messages


# --- paths a manifest names ---------------------------------------------------------------------


@pytest.mark.parametrize("case,edit,match", ESCAPES, ids=[c for c, _, _ in ESCAPES])
def test_a_manifest_path_out_of_the_dataset_is_refused_at_load_by_a_local_reader(
        storage: str, case: str, edit: Callable[[str], None], match: str) -> None:
    edit(storage)
    error = outcome(storage, read_local(storage))
    assert isinstance(error, CorruptDatasetError), repr(error)
    assert f"dataset {NAME!r}" in str(error) and "manifest.json" in str(error), str(error)
    assert_refused(error, match)


@pytest.mark.integration
def test_a_manifest_path_out_of_the_dataset_is_refused_by_the_master(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The master plans from the manifest it loads: it refuses the job (DATA_LOSS, naming the
    path) instead of leasing partitions of a shard outside the dataset."""
    monkeypatch.setenv(GIVE_UP_ENV, "30")
    with MasterProcess(storage) as master:
        for k, (case, edit, match) in enumerate(ESCAPES[:3]):
            shutil.rmtree(Path(storage).parent / "elsewhere", ignore_errors=True)
            saved = (folder(storage) / "manifest.json").read_bytes()
            edit(storage)
            try:
                error = outcome(storage, read_master_fed(master.address, f"job{k}"))
            finally:
                (folder(storage) / "manifest.json").write_bytes(saved)
            assert isinstance(error, CorruptDatasetError | JobError), f"{case}: {error!r}"
            assert_refused(error, match)
            assert "manifest.json" in str(error), f"{case}: {error}"


def test_the_paths_trainfeed_writes_pass(storage: str) -> None:
    records = outcome(storage, read_local(storage))
    assert records is None


# --- files that are not regular files inside the dataset ----------------------------------------


@pytest.mark.parametrize("case,edit,match", NOT_FILES, ids=[c for c, _, _ in NOT_FILES])
def test_a_file_that_is_not_a_regular_one_is_refused_unopened_by_a_local_reader(
        storage: str, case: str, edit: Callable[[str], None], match: str) -> None:
    edit(storage)
    assert_refused(outcome(storage, read_local(storage)), match)


def test_a_fifo_manifest_is_refused_not_waited_on(storage: str) -> None:
    replace_with(os.mkfifo, lambda s: folder(s) / "manifest.json")(storage)
    error = outcome(storage, read_local(storage))
    assert isinstance(error, CorruptDatasetError), repr(error)
    assert_refused(error, r"manifest\.json is a FIFO")


def test_a_symlink_inside_the_dataset_is_followed(storage: str) -> None:
    """Symbolic links are resolved and confined, not refused: one within the folder reads."""
    shard = first_shard(storage)
    moved = shard.parent / "moved.parquet"
    shard.rename(moved)
    shard.symlink_to(moved.name)
    assert outcome(storage, read_local(storage)) is None


@pytest.mark.integration
def test_a_master_fed_reader_refuses_a_fifo_shard_and_a_fifo_manifest(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO shard: the reader refuses it (the master leased it, never opens it). A FIFO
    manifest: the master's read is refused, not left waiting on a thread with OpenJob held."""
    monkeypatch.setenv(GIVE_UP_ENV, "30")
    with MasterProcess(storage) as master:
        shard = first_shard(storage)
        replace_with(os.mkfifo)(storage)
        assert_refused(outcome(storage, read_master_fed(master.address, "shard")),
                       r"is a FIFO.*refused unopened")
        shard.unlink()
        replace_with(os.mkfifo, lambda s: folder(s) / "manifest.json")(storage)
        error = outcome(storage, read_master_fed(master.address, "manifest"))
        assert_refused(error, r"manifest\.json is a FIFO")


# --- checkpoints ---------------------------------------------------------------------------------


def saved_state(reader: dist.Reader) -> dict[str, Any]:
    """The state after two batches of 10."""
    batches = reader.column_batches(10)
    next(batches), next(batches)
    state = reader.state_dict()
    assert state["positions"], state  # a partition in hand: the edits below mean something
    return state


def in_hand(state: dict[str, Any]) -> int:
    return int(state["positions"][0][0])


# (field, edit, what the error names). Each would be taken (or be a raw ValueError) before.
ABSURD: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    ("epoch 1e9", lambda s: {**s, "epoch": 10**9},
     rf"'epoch' is 1000000000, expected an int in \[-1, 2\^{MAX_EPOCH.bit_length() - 1}\)"),
    ("epoch 2^70", lambda s: {**s, "epoch": 2**70}, rf"'epoch' is {2**70}, expected an int in"),
    ("epoch below -1", lambda s: {**s, "epoch": -2}, r"'epoch' is -2, expected an int ≥ -1"),
    ("seed 2^70", lambda s: {**s, "seed": 2**70}, r"'seed' is \d+, expected an int in \[0, 2\^64"),
    ("done 2^40", lambda s: {**s, "done": [2**40]}, r"'done'\[0\] is \d+, expected an int in"),
    ("position partition 2^40", lambda s: {**s, "positions": [[2**40, 1]]},
     r"the partition of 'positions'\[0\] is \d+, expected an int in \[0, 2\^31\)"),
    ("position count 2^70", lambda s: {**s, "positions": [[in_hand(s), 2**70]]},
     r"the records of 'positions'\[0\] is \d+, expected an int in \[0, 2\^48\)"),
    ("negative position", lambda s: {**s, "positions": [[in_hand(s), -1]]},
     r"the records of 'positions'\[0\] is -1, expected an int ≥ 0"),
    ("delivered 2^70", lambda s: {**s, "delivered": 2**70}, r"'delivered' is \d+, expected"),
    ("partitions 2^40", lambda s: {**s, "partitions": 2**40}, r"'partitions' is \d+, expected"),
    ("dataset_version 2^40", lambda s: {**s, "dataset_version": 2**40},
     r"'dataset_version' is \d+, expected an int in"),
]


@pytest.mark.parametrize("case,edit,match", ABSURD, ids=[c for c, _, _ in ABSURD])
def test_an_absurd_local_state_is_a_checkpoint_error_naming_the_field(
        storage: str, case: str, edit: Callable[[dict[str, Any]], dict[str, Any]],
        match: str) -> None:
    saved = saved_state(dist.reader(NAME, source=LocalSource(storage=storage)))
    with pytest.raises(CheckpointError, match=match):
        reader = dist.reader(NAME, source=LocalSource(storage=storage))
        reader.load_state_dict(edit(saved))
        next(reader.column_batches(10))


@pytest.mark.integration
def test_an_absurd_master_fed_state_is_a_checkpoint_error_naming_the_field(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GIVE_UP_ENV, "30")
    with MasterProcess(storage) as master:
        first = dist.reader(NAME, source=MasterSource(master.address, job="train"))
        saved = saved_state(first)
        first.close()
        for _case, edit, match in ABSURD:
            reader = dist.reader(NAME, source=MasterSource(master.address, job="train"))
            try:
                with pytest.raises(CheckpointError, match=match):
                    reader.load_state_dict(edit(saved))
                    next(reader.column_batches(10))
            finally:
                reader.close()
        restored = dist.reader(NAME, source=MasterSource(master.address, job="train"),
                               state=saved)  # the unedited state still resumes
        assert next(restored.column_batches(10))["_id"].size
        restored.close()
