"""The master's watch for newer versions of its jobs' datasets
(trainfeed.master.serve.version_watch, issue 38): after `upload --append` a job pinned to
version 1 is told once per newer version, naming how to move; a FIFO in place of a manifest
fails the read at once, never waits."""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from trainfeed.master.serve.version_watch import Pinned, VersionWatch
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

OPTIONS = UploadOptions(kind="text", columns=("word", "label"), row_group_rows=4, processes=1)


def publish(tmp_path: Path, storage: str, start: int, count: int, append: bool) -> None:
    words = tmp_path / f"words-{start}.list"
    words.write_text("".join(f"w{i}\t{'ab'[i % 2]}\n" for i in range(start, start + count)))
    upload(str(words), "ds", storage, UploadOptions(**{**OPTIONS.__dict__, "append": append}),
           progress=False)


def test_a_newer_version_is_logged_once_per_job_and_version(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    publish(tmp_path, storage, 0, 20, append=False)
    watch = VersionWatch(open_storage(storage))
    jobs = [Pinned("train", "ds", 1), Pinned("other", "ds", 1)]
    watch.read(["ds"])
    assert watch.log_new(jobs) == [] and watch.newer(jobs[0]) is None
    publish(tmp_path, storage, 20, 10, append=True)
    caplog.set_level(logging.WARNING, logger="trainfeed.master.serve.version_watch")
    watch.read(["ds"])
    newer = watch.newer(jobs[0])
    assert newer is not None and (newer.version, newer.num_records) == (2, 30)
    said = watch.log_new(jobs)
    assert len(said) == 2 and "job 'train' reads version 1 of dataset 'ds'; version 2 (30 " \
        "records) is published" in said[0] and "a new job name" in said[0]
    watch.read(["ds"])
    assert watch.log_new(jobs) == []  # once per job and version
    publish(tmp_path, storage, 30, 5, append=True)
    watch.read(["ds"])
    assert len(watch.log_new(jobs[:1])) == 1
    # Its own log only: the uploads above may log warnings of their own (a loaded machine).
    mine = [r for r in caplog.records if r.name == "trainfeed.master.serve.version_watch"]
    assert "version 3 (35 records)" in mine[-1].getMessage()
    assert len(mine) == 3
    assert watch.newer(Pinned("fresh", "ds", 3)) is None  # a job of the newest: nothing to say


def test_a_fifo_in_place_of_the_manifest_fails_the_read_at_once(tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    publish(tmp_path, storage, 0, 20, append=False)
    watch = VersionWatch(open_storage(storage))
    watch.read(["ds"])
    manifest = tmp_path / "storage" / "ds" / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    reading = threading.Thread(target=watch.read, args=(["ds", "missing"],), daemon=True)
    reading.start()
    reading.join(60)  # a read that opened the FIFO would wait here for ever
    try:
        assert not reading.is_alive(), "the watch waited on a FIFO"
    finally:
        if reading.is_alive():  # let it go: open the FIFO for writing once
            with open(manifest, "wb"):
                pass
    assert watch.newer(Pinned("train", "ds", 0)) is not None  # the last answer kept
