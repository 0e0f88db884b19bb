"""The uploads on the master's status page: `UploadWatch` reads the storage's board at most
every refresh period whatever the page views, says (redacted) when it cannot; the page and
/status.json show every upload to the master's token and a job token its own dataset's only,
escaped."""
from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from trainfeed.ingest.board import record_path
from trainfeed.master.serve import status
from trainfeed.master.serve.status import UploadWatch
from trainfeed.master.serve.status_page import Access, StatusApp, render
from trainfeed.security import job_token
from trainfeed.storage import Storage, open_storage

TOKEN = "status-uploads-token-0123456789abcdef"


def snapshot(job: str | None) -> dict[str, Any]:
    """Jobs a (dataset "other") and b (dataset "<b>ds</b>"), or `job` alone."""
    return {"generated_at": 0.0, "sparkline_step_s": 10.0, "jobs": [
        {"job": name, "dataset": dataset, "num_records": 10, "workers_alive": 0,
         "records_per_s": 0.0, "sparkline": [], "input_bound": 0.0, "reports_refused": 0,
         "epoch": 0, "num_partitions": 1, "done": 0, "failed": 0, "todo": 1, "pending": 0,
         "progress": 0.0, "readers": [], "sync_group": None, "failed_partitions": [],
         "refusals": [], "label_histogram": {}}
        for name, dataset in (("a", "other"), ("b", "<b>ds</b>")) if job in (None, name)]}


def call(app: StatusApp, path: str, token: str) -> str:
    path, _, query = path.partition("?")
    environ = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": "GET",
               "HTTP_AUTHORIZATION": f"Bearer {token}", "wsgi.input": io.BytesIO()}
    got: list[str] = []
    body = b"".join(app(environ, lambda status, headers: got.append(status))).decode()
    assert got[0].startswith("200"), (got, body)
    return body


def fallback(environ: dict[str, Any], start: Any) -> Iterable[bytes]:
    raise AssertionError("not a status path")


def write(storage: Storage, dataset: str, index: int, **kw: Any) -> None:
    body = {"dataset": dataset, "fingerprint": "f" * 16, "index": index, "slices": 2,
            "state": "running", "records_done": 10, "records_total": 20, "upload_records": 40,
            "upload_shards": 4, "updated_at": 1000.0, "started_at": 990.0,
            "records_per_s": 1.0, "host": "pod-1", **kw}
    storage.write_atomic(record_path(dataset, "f" * 16, index), json.dumps(body).encode())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_reads_the_board_at_most_every_refresh_period(tmp_path: Path) -> None:
    storage, clock = open_storage(str(tmp_path)), Clock()
    watch = UploadWatch(storage, refresh_s=5.0, clock=clock)
    assert watch() == {"uploads": [], "uploads_error": None}
    write(storage, "photos", 0)
    clock.now += 4.9
    assert watch()["uploads"] == []  # the last look, 4.9 s old
    clock.now += 0.2
    [upload] = watch()["uploads"]
    assert upload["dataset"] == "photos" and upload["records_done"] == 10


def test_a_slow_board_is_read_less_often(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    storage, clock = open_storage(str(tmp_path)), Clock()
    watch = UploadWatch(storage, refresh_s=5.0, clock=clock)
    ticks = iter([100.0, 103.0, 200.0, 200.1])  # the first look takes 3 s, the next 0.1 s
    monkeypatch.setattr(status.time, "monotonic", lambda: next(ticks))
    assert watch()["uploads"] == []
    write(storage, "photos", 0)
    clock.now += 14.9  # 3 s / UPLOADS_READ_SHARE (0.2): 15 s between looks
    assert watch()["uploads"] == []
    clock.now += 0.2
    assert len(watch()["uploads"]) == 1


def test_a_board_that_cannot_be_read_is_said_without_the_secret(tmp_path: Path) -> None:
    class Broken(Storage):
        @property
        def fs(self) -> Any:
            raise OSError("cannot reach https://user:hunter2@s3.example/bucket")
    watch = UploadWatch(Broken(str(tmp_path)))
    answer = watch()
    assert answer["uploads"] == [] and "hunter2" not in answer["uploads_error"]
    assert "cannot read the uploads board: OSError" in answer["uploads_error"]


def uploads(storage: Storage) -> UploadWatch:
    write(storage, "<b>ds</b>", 0, state="failed", reason="<script>alert(1)</script>")
    write(storage, "<b>ds</b>", 1)
    write(storage, "other", 0)
    return UploadWatch(storage)


def test_the_masters_token_sees_every_upload_a_job_token_its_datasets(tmp_path: Path) -> None:
    app = StatusApp(snapshot, Access(TOKEN), fallback, uploads=uploads(open_storage(
        str(tmp_path))))
    body = call(app, "/status.json", TOKEN)
    assert [u["dataset"] for u in json.loads(body)["uploads"]] == ["<b>ds</b>", "other"]
    [mine] = json.loads(call(app, "/status.json", job_token(TOKEN, "b")))["uploads"]
    assert mine["dataset"] == "<b>ds</b>" and mine["state"] == "failed"
    page = call(app, "/status?refresh=0", TOKEN)
    assert '<section class="uploads" id="uploads">' in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'data-dataset="&lt;b&gt;ds&lt;/b&gt;" data-state="failed"' in page
    assert '<tr class="slice flagged" data-slice="0" data-state="failed"' in page


def test_a_page_without_an_uploads_source_has_no_uploads_section() -> None:
    page = render({"generated_at": 0.0, "sparkline_step_s": 10.0, "jobs": []})
    assert 'id="uploads"' not in page
    page = render({"generated_at": 0.0, "sparkline_step_s": 10.0, "jobs": [], "uploads": [],
                   "uploads_error": None})
    assert "None in progress" in page
