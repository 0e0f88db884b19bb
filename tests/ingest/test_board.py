"""The uploads board (trainfeed.ingest.board): what a packer writes and when, what a reader
re-reads, what publishing leaves, and a plain upload's record from start to publish or
interruption."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from board_records import progress, record
from sample_data import make_image_list

from trainfeed.ingest import board
from trainfeed.ingest.board import Board, ProgressReporter, record_path
from trainfeed.ingest.board_summary import summarize
from trainfeed.storage import Storage, open_storage
from trainfeed.upload import UploadOptions, upload

SECRET = "hunter2-secret"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def read(storage: Storage, index: int | None = 1) -> dict[str, Any]:
    return dict(json.loads(storage.read_bytes(record_path("public/photos", "f" * 16, index))))


def test_the_reporter_writes_at_once_then_each_change_and_its_end(tmp_path: Path) -> None:
    storage, clock = open_storage(str(tmp_path)), Clock()
    with ProgressReporter(storage, progress(1), clock, interval_s=0.01,
                          heartbeat_s=3600) as reporter:
        assert read(storage)["state"] == "running" and read(storage)["records_done"] == 0
        clock.now += 4
        reporter.add(40, 400)
        deadline = time.monotonic() + 10
        while read(storage)["records_done"] != 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        shown = read(storage)
        assert (shown["records_done"], shown["bytes_done"], shown["shards_done"]) == (40, 400, 1)
        assert shown["records_per_s"] == 10.0  # 40 records in the 4 s since it started
    assert read(storage)["state"] == "done"
    assert not [t for t in threading.enumerate() if t.name == "trainfeed-upload-progress"]
    path = tmp_path / record_path("public/photos", "f" * 16, 1)
    assert path.parent.parent.name == "public~photos"  # one level per dataset


def test_a_failure_is_recorded_once_with_its_reason_redacted(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    reporter = ProgressReporter(storage, progress(2))
    reporter.close(OSError(f"cannot reach s3://key:{SECRET}@host/bucket"))
    reporter.close()  # idempotent: the first outcome stays
    shown = read(storage, 2)
    assert shown["state"] == "failed" and SECRET not in json.dumps(shown)
    assert shown["reason"].startswith("OSError: cannot reach s3://key:***@host")


def test_a_board_that_cannot_be_written_never_fails_the_upload(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trainfeed.ingest.board")
    (tmp_path / "_uploads").write_text("a file where the board's folder goes")
    with ProgressReporter(open_storage(str(tmp_path)), progress(0)):
        pass
    warned = [r for r in caplog.records if "cannot write upload progress" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING", "DEBUG"]  # the start, the end


def test_the_board_rereads_only_what_changed(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    for index in range(3):
        storage.write_atomic(record_path("public/photos", "f" * 16, index),
                             json.dumps(record(index)).encode())
    seen = Board(storage)
    assert len(seen.records()) == 3
    reads: list[str] = []
    original = Storage.read_bytes

    def counted(self: Storage, *parts: str) -> bytes:
        reads.append(parts[0])
        return original(self, *parts)
    Storage.read_bytes = counted  # type: ignore[method-assign]
    try:
        storage.write_atomic(record_path("public/photos", "f" * 16, 1),
                             json.dumps(record(1, done=99)).encode())
        assert sorted(r["records_done"] for r in seen.records()) == [50, 50, 99]
    finally:
        Storage.read_bytes = original  # type: ignore[method-assign]
    assert reads == [record_path("public/photos", "f" * 16, 1)]


def test_a_plain_upload_is_on_the_board_until_published_then_once(tmp_path: Path) -> None:
    listing = make_image_list(tmp_path / "source", 30)
    storage = open_storage(str(tmp_path / "store"))
    seen: list[dict[str, Any]] = []

    def look(_: int) -> None:
        [u] = summarize(Board(storage).records(), time.time())
        seen.append(u)
    upload(str(listing), "photos", storage, UploadOptions(row_group_rows=5, shard_row_groups=2,
                                                          processes=1),
           progress=False, on_shard=look)
    assert [u["state"] for u in seen] == ["running"] * 3
    assert all(u["mode"] == "local" and u["records_total"] == 30 for u in seen)
    files = sorted(p.name for p in (tmp_path / "store" / "_uploads").rglob("*.json"))
    assert files == ["published.json"]
    [u] = summarize(Board(storage).records(), time.time())
    assert (u["state"], u["records_done"], u["shards_done"], u["mode"]) == \
        ("published", 30, 3, "local")


def test_a_plain_upload_that_fails_says_why(tmp_path: Path) -> None:
    listing = make_image_list(tmp_path / "source", 30)
    storage = open_storage(str(tmp_path / "store"))

    def fail(index: int) -> None:
        if index == 1:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        upload(str(listing), "photos", storage, UploadOptions(row_group_rows=5,
                                                              shard_row_groups=2, processes=1),
               progress=False, on_shard=fail)
    [u] = summarize(Board(storage).records(), time.time())
    assert u["state"] == "failed" and u["records_done"] == 20
    assert u["problems"] == ["the upload: failed: interrupted"]


def test_publishing_leaves_one_record_per_dataset(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    storage.write_atomic(record_path("photos", "a" * 16, 0), json.dumps(record(0)).encode())
    storage.write_atomic(record_path("photos", "b" * 16, 1), json.dumps(record(1)).encode())
    storage.write_atomic(record_path("photos", "b" * 16, None) + ".tmp-0a1b",
                         b"half a record of a packer killed while writing it")
    storage.write_atomic(record_path("other", "c" * 16, 0), json.dumps(record(0)).encode())
    board.publish(storage, "photos", "b" * 16 + "tail", 300, 6, 1000, 2, clock=lambda: 1005.0)
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "_uploads").rglob("*"))
    assert left == ["_uploads/other", "_uploads/other/" + "c" * 16,
                    "_uploads/other/" + "c" * 16 + "/slice-00000.json", "_uploads/photos",
                    "_uploads/photos/" + "b" * 16, "_uploads/photos/" + "b" * 16 +
                    "/published.json"]
    shown = json.loads((tmp_path / "_uploads/photos" / ("b" * 16) / "published.json")
                       .read_text())
    assert shown["started_at"] == 990.0 and shown["records_done"] == 300  # slice 1's start
