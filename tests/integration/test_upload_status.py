"""An upload's progress in `trainfeed status --uploads` and on a running master's /status.json
and /status page (issue 30 §3): three `trainfeed upload-slice` processes given
JOB_COMPLETION_INDEX, as submit-upload's Indexed Job runs them, on a shared folder and on real
S3 (SeaweedFS); one paused mid-slice, one failing, then run again until the commit publishes.

What is shown is compared with what is on the storage: the records of every shard that has its
progress record (a shard packed), mid-upload and at the end."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import s3fs
from ingest import test_upload_slices
from ingest.test_upload_slices import IMAGES, cli, slice_args
from machine_load import hang_bound
from sample_data import make_image_list
from webdriver import Browser, require_chromium

from trainfeed.ingest.progress import ShardProgress
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The shared folder or fresh S3 bucket (parametrised) of the slices' own tests.
storages = test_upload_slices.storages
T = TypeVar("T")
TOKEN = "upload-status-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]
# A packer that stops at its `at`-th row group (inside slice 1's second shard, as FAULTY fails
# there) until the test creates `<gate>.open`; it creates `<gate>.reached` when it gets there.
PAUSING = """
import os, sys, time
from trainfeed.formats import shards
from trainfeed.cli.main import main

at, gate, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
calls = {"n": 0}
add = shards.ShardEncoder.add

def pausing(self, group):
    calls["n"] += 1
    if calls["n"] == at:
        open(gate + ".reached", "w").close()
        print(f"paused at row group {at} until {gate}.open exists (at most 120 s)",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(gate + ".open"):
            if time.monotonic() > deadline:
                raise SystemExit(f"{gate}.open never came")
            time.sleep(0.05)
    add(self, group)

shards.ShardEncoder.add = pausing
sys.exit(main(rest))
"""
WAIT_S = 45.0  # the master reads the board every 5 s; a packer reports within 2 s


def wait_for(what: str, get: Callable[[], T], ok: Callable[[T], bool]) -> T:
    """`get()` once `ok` of it holds; fails after WAIT_S naming `what` and the last value."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = get()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S:g} s: {what}; last seen: {value!r}")
        time.sleep(0.25)


def status_lines(env: dict[str, str], storage: str, *extra: str) -> str:
    run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "status", "--uploads",
                          "--storage", storage, *extra], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def master_uploads(master: MasterProcess, token: str | None = None) -> list[dict[str, Any]]:
    url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore[union-attr]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # (10 s against a hang, scaled to the load: beside stress-ng at load 18 it ran out.)
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=hang_bound(10)) as answer:
        data = json.load(answer)
    assert data["uploads_error"] is None, data["uploads_error"]
    return list(data["uploads"])


def records_packed(env: dict[str, str], storage: str) -> int:
    """Records of every shard of `photos` that has its progress record (a shard packed)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        folder = open_storage(storage).child("photos")
        folder.fs.invalidate_cache()
        found = folder.fs.glob(folder.path("data/*/_progress/shard-*.json"))
        return sum(ShardProgress.from_json(folder.fs.cat_file(p)).shard.num_rows
                   for p in found)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def slice_row(upload: dict[str, Any], index: int) -> dict[str, Any]:
    return next(s for s in upload["slice_rows"] if s["slice"] == index)


def test_progress_mid_upload_a_failed_slice_and_the_end(
        tmp_path: Path, storages: tuple[dict[str, str], list[str]]) -> None:
    env, (storage, _, _) = storages
    listing = make_image_list(tmp_path / "source", IMAGES)
    gate = tmp_path / "gate"
    with MasterProcess(storage, env=env) as master:
        assert master_uploads(master) == []
        assert "none in progress" in status_lines(env, storage)
        assert cli(env, "upload-slice", *slice_args(listing, storage), index=0).returncode == 0
        paused = subprocess.Popen(
            [sys.executable, "-c", PAUSING, "74", str(gate), "upload-slice",
             *slice_args(listing, storage)], env={**env, "JOB_COMPLETION_INDEX": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for("slice 1 reaches its second shard", lambda: gate.with_suffix(".reached")
                     .exists() or paused.poll(), bool)
            assert paused.poll() is None, paused.communicate()[0]
            # Slice 0 (shard 0) packed, slice 1 in its second shard, slice 2 not started.
            assert records_packed(env, storage) == 128
            text = wait_for("slice 1's first shard in `status --uploads`",
                            lambda: status_lines(env, storage),
                            lambda t: "64/128 records" in t)
            assert ("running · 1/3 slices done, 1 running, 1 not started · 128/300 records "
                    "(43%)") in text, text
            assert "ETA" in text and "slice 1     running" in text, text
            [upload] = wait_for("slice 1's first shard on the master", lambda: master_uploads(
                master), lambda u: len(u) == 1 and u[0]["records_done"] == 128)
            assert upload["state"] == "running" and upload["dataset"] == "photos"
            assert (upload["slices"], upload["slices_done"], upload["slices_running"],
                    upload["slices_waiting"]) == (3, 1, 1, 1)
            assert slice_row(upload, 1)["records_done"] == 64
            assert slice_row(upload, 1)["records_per_s"] > 0 and upload["eta_s"] > 0

            # Slice 2 fails in its second shard: flagged, with its reason, on both.
            failed = cli(env, "upload-slice", *slice_args(listing, storage), index=2,
                         fault="fail")
            assert failed.returncode == 1 and "the disk is on fire" in failed.stderr
            assert records_packed(env, storage) == 192
            text = status_lines(env, storage)
            assert "FAILED · 1/3 slices done, 1 running, 1 failed · 192/300 records" in text
            assert ("problem   slice 2: failed: OSError: [Errno 5] the disk is on fire"
                    in text), text
            [upload] = wait_for("the failed slice on the master", lambda: master_uploads(
                master), lambda u: len(u) == 1 and u[0]["slices_failed"] == 1)
            assert upload["state"] == "failed" and upload["records_done"] == 192
            assert slice_row(upload, 2)["reason"] == "OSError: [Errno 5] the disk is on fire"
        finally:
            gate.with_suffix(".open").touch()
            out = paused.communicate(timeout=120)[0]
        assert paused.returncode == 0, out  # its commit refused (slice 2 failed): not an error

        again = cli(env, "upload-slice", *slice_args(listing, storage), index=2)
        assert again.returncode == 0 and "published" in again.stdout, again.stderr
        assert records_packed(env, storage) == IMAGES
        text = status_lines(env, storage)
        assert "(3 slices, fingerprint " in text
        assert "published 300 records in 5 shard(s)" in text, text
        assert "none in progress" in status_lines(env, storage, "--dataset", "other")
        [upload] = wait_for("the published upload on the master", lambda: master_uploads(
            master), lambda u: len(u) == 1 and u[0]["state"] == "published")
        assert upload["records_done"] == upload["records_total"] == IMAGES
        assert upload["shards_done"] == 5 and upload["slices"] == 3


def test_a_killed_packer_is_named_by_the_commit_with_what_it_last_reported(
        tmp_path: Path) -> None:
    storage = str(tmp_path / "shared")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOB_COMPLETION")}
    listing = make_image_list(tmp_path / "source", IMAGES)
    for index in (0, 2):
        assert cli(env, "upload-slice", *slice_args(listing, storage), index=index,
                   ).returncode == 0
    killed = cli(env, "upload-slice", *slice_args(listing, storage), index=1, fault="kill")
    assert killed.returncode < 0
    refused = cli(env, "upload-commit", *slice_args(listing, storage))
    assert ("slice 1 (shards 1-2): not finished (no slice record); its packer on "
            in refused.stderr), refused.stderr
    # What it last wrote: it reports at most every 2 s, and died within a second of starting.
    assert re.search(r"last reported \d+ of 128 records \d+ s ago \(running\)",
                     refused.stderr), refused.stderr
    # On the board it is running until its record is STALE_S old (tests/ingest/test_board.py).
    assert re.search(r"slice 1     running  \d+/128 records", status_lines(env, storage))


def test_the_status_page_shows_the_uploads_section(tmp_path: Path) -> None:
    require_chromium()
    storage = str(tmp_path / "shared")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOB_COMPLETION")}
    listing = make_image_list(tmp_path / "source", IMAGES)
    assert cli(env, "upload-slice", *slice_args(listing, storage), index=0).returncode == 0
    assert cli(env, "upload-slice", *slice_args(listing, storage), index=2,
               fault="fail").returncode == 1
    with MasterProcess(storage, token=TOKEN) as master, Browser() as browser:
        base = master.metrics_url.replace("/metrics", "")  # type: ignore[union-attr]
        browser.get(base + "/login")
        browser.type("#token", TOKEN)
        browser.click("#login")
        browser.wait_until(lambda b: b.url.endswith("/status"))
        browser.get(base + "/status?refresh=0")
        page = browser.source
        assert 'id="uploads"' in page and 'data-dataset="photos"' in page, page[:3000]
        assert 'data-state="failed"' in page and 'data-records-done="128"' in page
        assert "the disk is on fire" in page and TOKEN not in page
        assert browser.script(
            "return document.querySelectorAll('#uploads tr.slice.flagged').length") == 1
        shot = browser.screenshot()
        browser.resize(390, 844)  # a phone: the slices' table scrolls inside its box
        browser.get(base + "/status?refresh=0")
        overflow = browser.script("return document.documentElement.scrollWidth - "
                                  "document.documentElement.clientWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a phone's screen"
    if os.environ.get("TRAINFEED_UPDATE_SCREENSHOT") == "1":  # docs/operations.md shows it
        (REPO / "docs" / "images" / "status-uploads.png").write_bytes(shot)



def test_status_uploads_says_when_the_storage_refuses_its_credentials(
        s3_server: Any) -> None:
    bucket = f"refused-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True).mkdir(bucket)
    env = {**os.environ, **s3_server.env(), "TRAINFEED_S3_ENDPOINT": s3_server.endpoint_url,
           "AWS_SECRET_ACCESS_KEY": "not-the-secret-key-0123456789"}
    run = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "status", "--uploads",
                          "--storage", f"s3://{bucket}/datasets"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"access to s3://{bucket}/datasets refused" in run.stderr, run.stderr
    assert "AWS_SECRET_ACCESS_KEY" in run.stderr and "not-the-secret" not in run.stderr
