"""An upload as N packers and a commit (issue 30 §3), run as submit-upload's Indexed Job runs
them: `trainfeed upload-slice` processes given JOB_COMPLETION_INDEX, against a shared folder
and real S3 (SeaweedFS). A packer killed mid-slice and run again leaves the same dataset, byte
for byte; a slice that failed or never finished makes the commit refuse, naming it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from sample_data import make_image_list

from trainfeed.storage import open_storage

WORKERS = 3
CREATED_AT = "2026-11-26T00:00:00Z"
# 300 records in row groups of one: 5 shards of at most 64 groups, slices [0], [1, 2], [3, 4].
IMAGES = 300
OPTIONS = ["--rows-per-group", "1", "--processes", "1"]

# A packer that dies (SIGKILL) or fails (an OSError) in the middle of its slice: at the 10th
# row group it encodes, which is inside the slice's second shard for slice 1.
FAULTY = """
import os, signal, sys
from trainfeed.formats import shards
from trainfeed.cli.main import main

how, rest = sys.argv[1], sys.argv[2:]
calls = {"n": 0}
add = shards.ShardEncoder.add

def faulty(self, group):
    calls["n"] += 1
    if calls["n"] == 74:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(5, "the disk is on fire")
    add(self, group)

shards.ShardEncoder.add = faulty
sys.exit(main(rest))
"""


def cli(env: dict[str, str], *args: str, index: int | None = None,
        fault: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = [sys.executable, "-c", FAULTY, fault] if fault else [
        sys.executable, "-m", "trainfeed.cli.main"]
    run_env = {**env, **({"JOB_COMPLETION_INDEX": str(index)} if index is not None else {})}
    return subprocess.run([*prefix, *args], env=run_env, capture_output=True, text=True,
                          timeout=300)


def slice_args(listing: Path, storage: str, *extra: str) -> list[str]:
    return [str(listing), "--dataset", "photos", "--storage", storage, "--workers",
            str(WORKERS), "--created-at", CREATED_AT, *OPTIONS, *extra]


@pytest.fixture(params=["folder", "s3"])
def storages(request: pytest.FixtureRequest, tmp_path: Path,
             ) -> Iterator[tuple[dict[str, str], list[str]]]:
    """(environment, three storage roots) on a shared folder or in a fresh S3 bucket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOB_COMPLETION")}
    if request.param == "folder":
        yield env, [str(tmp_path / f"shared{i}") for i in range(3)]
        return
    server = request.getfixturevalue("s3_server")
    bucket = f"slices-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**server.storage_options(), skip_instance_cache=True).mkdir(bucket)
    env.update(server.env(), TRAINFEED_S3_ENDPOINT=server.endpoint_url)
    yield env, [f"s3://{bucket}/run{i}" for i in range(3)]


def read(env: dict[str, str], storage: str, rel: str) -> bytes:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return open_storage(storage).read_bytes(rel)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.slow
def test_a_killed_packer_run_again_gives_the_same_manifest(
        tmp_path: Path, storages: tuple[dict[str, str], list[str]]) -> None:
    env, (reference, interrupted, _) = storages
    listing = make_image_list(tmp_path / "source", IMAGES)
    for index in range(WORKERS):  # the reference: every index once, then the commit
        run = cli(env, "upload-slice", *slice_args(listing, reference, "--no-commit"),
                  index=index)
        assert run.returncode == 0, run.stderr
    run = cli(env, "upload-commit", *slice_args(listing, reference))
    assert run.returncode == 0 and "published 'photos': 300 records in 5 shard(s)" in run.stdout
    expected = read(env, reference, "photos/manifest.json")

    for index in (0, 2):
        run = cli(env, "upload-slice", *slice_args(listing, interrupted), index=index)
        assert run.returncode == 0, run.stderr
        assert "published" not in run.stdout  # slice 1 is not done
    killed = cli(env, "upload-slice", *slice_args(listing, interrupted), index=1, fault="kill")
    assert killed.returncode == -signal.SIGKILL
    refused = cli(env, "upload-commit", *slice_args(listing, interrupted))
    assert refused.returncode != 0
    assert ("1 of 3 slice(s) incomplete: slice 1 (shards 1-2): not finished (no slice record)"
            in refused.stderr), refused.stderr
    with pytest.raises(FileNotFoundError):
        read(env, interrupted, "photos/manifest.json")

    again = cli(env, "upload-slice", *slice_args(listing, interrupted), index=1)
    assert again.returncode == 0, again.stderr
    assert "(shards 1-2, 1 resumed); every slice done: published" in again.stdout
    assert read(env, interrupted, "photos/manifest.json") == expected
    # The commit again (a re-run of the Job's last index, say) writes the same bytes.
    assert cli(env, "upload-commit", *slice_args(listing, interrupted)).returncode == 0
    assert read(env, interrupted, "photos/manifest.json") == expected


@pytest.mark.slow
def test_a_failed_slice_makes_the_commit_refuse_naming_it(
        tmp_path: Path, storages: tuple[dict[str, str], list[str]]) -> None:
    env, (_, _, storage) = storages
    listing = make_image_list(tmp_path / "source", IMAGES)
    for index in (0, 1):
        assert cli(env, "upload-slice", *slice_args(listing, storage),
                   index=index).returncode == 0
    failed = cli(env, "upload-slice", *slice_args(listing, storage), index=2, fault="fail")
    assert failed.returncode == 1 and "the disk is on fire" in failed.stderr
    refused = cli(env, "upload-commit", *slice_args(listing, storage))
    assert refused.returncode != 0
    assert ("slice 2 (shards 3-4): failed: OSError: [Errno 5] the disk is on fire"
            in refused.stderr), refused.stderr
    assert "JOB_COMPLETION_INDEX=<slice>" in refused.stderr
    with pytest.raises(FileNotFoundError):
        read(env, storage, "photos/manifest.json")
    # Run again, it succeeds, clears its failure and publishes.
    again = cli(env, "upload-slice", *slice_args(listing, storage), index=2)
    assert again.returncode == 0 and "published" in again.stdout, again.stderr


def test_upload_slice_needs_an_index(tmp_path: Path) -> None:
    listing = make_image_list(tmp_path / "source", 3)
    env = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    run = cli(env, "upload-slice", *slice_args(listing, str(tmp_path / "s")))
    assert run.returncode != 0
    assert "pass --index I, or set $JOB_COMPLETION_INDEX" in run.stderr
