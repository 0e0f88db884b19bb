"""Exactly-once across a checkpoint, on every path of the reader, locally and fed by a master.

One helper (`check_resume`): a trainer takes a few units (batches or instances), saves the
reader's state, takes a few more (lost with the crash that follows), and a new reader restored
from the saved state reads the rest of the epoch. The records the saved model saw plus those the
restored reader delivers must be the epoch's records, each as often as an uninterrupted epoch
delivers it (once; with resampling, its number of copies): nothing re-sent, nothing skipped.

Run over every path × {no shuffle, shuffle buffer, resample} × {local, a real master process}.
The raw paths (tuples, batch(), columnar batches, packed buffers) have no shuffle or resample
options: they run unshuffled only.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from optional import require
from sample_data import file_digests, make_image_list

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    Reader,
    SamplingOptions,
    batch,
    dist,
)
from trainfeed.decode.remote.client import DecoderPool
from trainfeed.decoder.process import DecoderProcess
from trainfeed.master.serve.process import MasterProcess
from trainfeed.preprocess import training_preprocessor
from trainfeed.upload import UploadOptions, upload

N = 100
BATCH = 16
SAVED_AFTER = 3  # units the saved model saw (the issue's case: 3 batches of 16 of 100 records)
LOST = 2  # units taken after the checkpoint, lost with the crash
SAMPLING = {"none": {}, "shuffle": {"shuffle_buffer": 1000},
            "resample": {"resample": {"cat": 2.0, "dog": 1.0, "bird": 0.5}}}
Ids = Callable[[Any], list[int]]


@dataclass
class Case:
    """How to read one path: a reader's options, one pass as units, a unit's record ids."""

    options: dict[str, Any]
    units: Callable[[Reader], Iterator[Any]]
    ids: Ids
    dataset: str = "flowers"


def check_resume(make: Callable[[dict[str, Any] | None], Reader],
                 units: Callable[[Reader], Iterator[Any]], ids: Ids,
                 reference: Counter[int], saved_after: int = SAVED_AFTER,
                 lost: int = LOST, stop: str = "killed") -> tuple[list[int], list[int]]:
    """The checkpoint round trip; asserts exactly-once against `reference` (an uninterrupted
    epoch's record counts). The first reader stops "killed" (the master hears nothing more) or
    "left" (closed cleanly: it reports its progress and hands its tasks back). Returns (ids the
    saved model saw, ids after the restore)."""
    reader = make(None)
    stream = units(reader)
    saw = [i for unit in itertools.islice(stream, saved_after) for i in ids(unit)]
    saved = json.loads(json.dumps(reader.state_dict()))  # what a checkpoint file holds
    crashed = [i for unit in itertools.islice(stream, lost) for i in ids(unit)]
    assert crashed, "the test must lose something after its checkpoint"
    if stop == "killed":
        crash(reader, stream)
    else:
        end = getattr(stream, "close", None)  # a DataLoader's iterator has none
        if end is not None:
            end()
        reader.close()
    restored = make(saved)
    after = [i for unit in units(restored) for i in ids(unit)]
    restored.close()
    got = Counter(saw) + Counter(after)
    resent = sorted((got - reference).elements())
    skipped = sorted((reference - got).elements())
    assert not resent and not skipped, (f"re-sent {len(resent)} {resent[:10]}, skipped "
                                        f"{len(skipped)} {skipped[:10]}")
    assert saved["epoch"] == 0 and not saved["finished"]
    return saw, after


def crash(reader: Reader, stream: Iterator[Any]) -> None:
    """Stops `reader` as a killed trainer stops: the master hears nothing more from it (its
    leases stay held until they expire or a restored reader rewinds them)."""
    client = getattr(reader._backend, "client", None)
    if client is not None:
        client.close()
    with contextlib.suppress(Exception):  # what would tell the master fails: as after SIGKILL
        stream.close()  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        reader.close()


# -- the datasets ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, int]]:
    """100 JPEGs in partitions of 8 records, and a packed dataset of 100 rows in buffers of 4;
    with a map from each image's sha256 to its record id (raw tuples carry no id)."""
    root = tmp_path_factory.mktemp("resume")
    source = make_image_list(root / "source", N)
    out = str(root / "storage")
    upload(str(source), "flowers", out, UploadOptions(row_group_rows=8), progress=False)
    images = np.random.default_rng(0).integers(0, 256, (N, 2, 2, 3))
    table = pa.table({"rgb": [img.tolist() for img in images],
                      "species": [("cat", "dog", "bird")[i % 3] for i in range(N)]})
    training_preprocessor(table, "packed", "species", "rgb", buffer_size=4, storage=out)
    sha_to_id = {sha: i for i, (sha, _) in file_digests(source).items()}
    return out, sha_to_id


def _sha_ids(sha_to_id: dict[str, int]) -> Callable[[Iterable[tuple[bytes, str]]], list[int]]:
    return lambda rows: [sha_to_id[hashlib.sha256(image).hexdigest()] for image, _ in rows]


def _cases(sha_to_id: dict[str, int], decoded_to_id: dict[bytes, int]) -> dict[str, Case]:
    by_sha = _sha_ids(sha_to_id)
    decode = {"decode": True, "image_size": (8, 8)}
    return {
        "tuples": Case({}, lambda r: iter(r()), lambda row: by_sha([row])),
        "batch-lists": Case({}, lambda r: iter(batch(r, BATCH)()), by_sha),
        "batch-columnar": Case({}, lambda r: iter(batch(r, BATCH, columnar=True)()),
                               lambda b: b["_id"].tolist()),
        "packed": Case({}, lambda r: iter(r()), lambda b: [int(b["buffer_id"])], "packed"),
        "pipeline-batches": Case({**decode, "batch_size": BATCH}, lambda r: iter(r()),
                                 lambda b: b["_id"].tolist()),
        "pipeline-instances": Case(decode, lambda r: iter(r()),
                                   lambda row: [decoded_to_id[row[0].tobytes()]]),
        "torch": Case({**decode, "batch_size": BATCH}, _torch_units,
                      lambda b: b["_id"].tolist()),
        "tf": Case({**decode, "batch_size": BATCH}, _tf_units, lambda b: b[0].tolist()),
    }


RAW = ("tuples", "batch-lists", "batch-columnar", "packed")
PIPELINE = ("pipeline-batches", "pipeline-instances", "torch", "tf")
MATRIX = [(path, "none") for path in RAW] + [
    (path, sampling) for path in PIPELINE for sampling in SAMPLING]


def _torch_units(reader: Reader) -> Iterator[Any]:
    torch = require("torch")
    del torch
    from torch.utils.data import DataLoader
    return iter(DataLoader(reader.as_torch(), batch_size=None))


def _tf_units(reader: Reader) -> Iterator[Any]:
    """Keras's view: (inputs, targets) elements; the inputs here are the record ids."""
    require("tensorflow")
    return (tuple(x.numpy() for x in element)
            for element in reader.as_tf_dataset(inputs="_id", targets="label"))


@pytest.fixture(scope="module")
def decoded_to_id(storage: tuple[str, dict[str, int]]) -> dict[bytes, int]:
    """Each record's decoded 8x8 image (the pipeline's instances carry no id) -> its id."""
    out, _ = storage
    reader = dist.reader("flowers", source=LocalSource(storage=out),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8)),
                                                  batch=BatchOptions(size=N)))
    try:
        return {image.tobytes(): int(i) for b in reader()
                for image, i in zip(b["image"], b["_id"].tolist())}
    finally:
        reader.close()


@pytest.fixture(scope="module")
def master(storage: tuple[str, dict[str, int]]) -> Iterator[MasterProcess]:
    with MasterProcess(storage[0]) as process:
        yield process


def _run(where: str, path: str, sampling: str, storage: tuple[str, dict[str, int]],
         decoded_to_id: dict[bytes, int], address: str | None, stop: str = "killed") -> None:
    out, sha_to_id = storage
    case = _cases(sha_to_id, decoded_to_id)[path]
    pipeline = PipelineOptions.from_keywords(**case.options, **SAMPLING[sampling])
    if where == "local":
        def make(state: dict[str, Any] | None, job: str = "") -> Reader:
            return dist.reader(case.dataset, state=state, pipeline=pipeline,
                               source=LocalSource(out, seed=7, prefetch_partitions=2))
    else:
        job = f"resume-{uuid.uuid4().hex[:8]}"

        def make(state: dict[str, Any] | None, job: str = job) -> Reader:
            return dist.reader(case.dataset, state=state, pipeline=pipeline,
                               source=MasterSource(address, job, seed=7, prefetch_partitions=2))
    # The reference: an uninterrupted epoch (for master-fed readers, a job of its own).
    with make(None, f"reference-{uuid.uuid4().hex[:8]}") as plain:
        reference = Counter(i for unit in case.units(plain) for i in case.ids(unit))
    if sampling != "resample":
        expected = 25 if path == "packed" else N
        assert sorted(reference) == list(range(expected)) and max(reference.values()) == 1
    else:
        assert max(reference.values()) > 1 and len(reference) < N  # copies and drops
    saw, after = check_resume(make, case.units, case.ids, reference, stop=stop)
    print(f"{where} {path} {sampling} {stop}: saved model saw {len(saw)}, "
          f"restored read {len(after)}")


@pytest.mark.parametrize("path,sampling", MATRIX)
def test_local_resume_is_exactly_once(path: str, sampling: str,
                                      storage: tuple[str, dict[str, int]],
                                      decoded_to_id: dict[bytes, int]) -> None:
    _run("local", path, sampling, storage, decoded_to_id, None)


@pytest.mark.integration
@pytest.mark.parametrize("stop", ["killed", "left"])
@pytest.mark.parametrize("path,sampling", MATRIX)
def test_master_fed_resume_is_exactly_once(path: str, sampling: str, stop: str,
                                           storage: tuple[str, dict[str, int]],
                                           decoded_to_id: dict[bytes, int],
                                           master: MasterProcess) -> None:
    _run("master", path, sampling, storage, decoded_to_id, master.address, stop)


# Remote decode (issue 37): the decoded paths, read through a `trainfeed decoder` process; the
# trainer keeps the leases, positions, shuffle buffer and state_dict(). Resampling is refused
# with remote decode (trainfeed.reader.remote_decode), so it is not in this matrix.
REMOTE = [(path, sampling) for path in ("pipeline-batches", "pipeline-instances")
          for sampling in ("none", "shuffle")]


@pytest.fixture(scope="module")
def decoder(storage: tuple[str, dict[str, int]]) -> Iterator[DecoderProcess]:
    """One decoder (no token: neither is the master's) serving the test's storage."""
    with DecoderProcess(storage[0]) as process:
        yield process


@pytest.mark.integration
@pytest.mark.parametrize("where", ["local", "master"])
@pytest.mark.parametrize("path,sampling", REMOTE)
def test_resume_with_remote_decode_is_exactly_once(
        path: str, sampling: str, where: str, storage: tuple[str, dict[str, int]],
        decoded_to_id: dict[bytes, int], decoder: DecoderProcess,
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The same round trip with TRAINFEED_DECODE=remote. "pipeline-instances" finds each
    record by its locally decoded pixels: a remote-decoded record that differed would not be
    found."""
    address = request.getfixturevalue("master").address if where == "master" else None
    monkeypatch.setenv("TRAINFEED_DECODE", "remote")
    monkeypatch.setenv("TRAINFEED_DECODERS", decoder.address)
    for name in ("TRAINFEED_TOKEN", "TRAINFEED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    fetched = Counter[str]()
    fetch = DecoderPool.fetch

    def counted(pool: DecoderPool, decode: Any) -> Any:
        fetched["segments"] += 1
        return fetch(pool, decode)
    monkeypatch.setattr(DecoderPool, "fetch", counted)  # a spy: the real fetch runs
    _run(where, path, sampling, storage, decoded_to_id, address)
    assert fetched["segments"] >= 100 // 8, "the readers did not decode through the decoder"


def _ids_of(batches: Iterable[dict[str, Any]]) -> list[int]:
    return [i for b in batches for i in b["_id"].tolist()]


@pytest.mark.parametrize("where", ["local", pytest.param("master", marks=pytest.mark.integration)])
def test_stateful_dataloader_and_distributed_checkpoint_resume_exactly(
        where: str, storage: tuple[str, dict[str, int]], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    """torchdata's StatefulDataLoader saves the dataset's state_dict and restores it with
    load_state_dict (no replay); torch.distributed.checkpoint saves and loads it in place."""
    require("torch")
    stateful = require("torchdata.stateful_dataloader")
    import torch.distributed.checkpoint as dcp

    out = storage[0]
    address = request.getfixturevalue("master").address if where == "master" else None
    job = f"torch-{uuid.uuid4().hex[:8]}"
    pipeline = PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8)),
                               batch=BatchOptions(size=BATCH),
                               sampling=SamplingOptions(shuffle_buffer=1000))

    def make() -> Reader:
        if address is None:
            return dist.reader("flowers", source=LocalSource(out, seed=3), pipeline=pipeline)
        return dist.reader("flowers", source=MasterSource(address, job, seed=3),
                           pipeline=pipeline)

    reader = make()
    data = reader.as_torch()
    loader = stateful.StatefulDataLoader(data, batch_size=None)
    batches = iter(loader)
    saw = _ids_of(itertools.islice(batches, SAVED_AFTER))
    saved = loader.state_dict()
    dcp.save({"data": data}, checkpoint_id=str(tmp_path / "dcp"))
    assert _ids_of(itertools.islice(batches, LOST))
    crash(reader, batches)

    restored = make()
    again = stateful.StatefulDataLoader(restored.as_torch(), batch_size=None)
    again.load_state_dict(saved)
    after = _ids_of(again)
    assert sorted(saw + after) == list(range(N)), (len(saw), len(after))
    restored.close()
    if address is None:  # a second restore of the same local checkpoint, through DCP
        fresh = make()
        target = fresh.as_torch()
        dcp.load({"data": target}, checkpoint_id=str(tmp_path / "dcp"))
        assert sorted(saw + _ids_of(target)) == list(range(N))
        fresh.close()
