"""The status page's app (trainfeed.master.status_page) called as WSGI: the token by header or
login cookie, job tokens limited to their job, the login form, no secret in what it renders, and
everything escaped."""
from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

import pytest

from trainfeed.master.status_page import COOKIE, Access, StatusApp, render
from trainfeed.security import job_token

TOKEN = "status-unit-token-0123456789abcdef"


def snapshot(job: str | None) -> dict[str, Any]:
    jobs = [{"job": name, "dataset": "<b>ds</b>", "num_records": 10, "workers_alive": 1,
             "records_per_s": 5.0, "sparkline": [1.0, 2.0], "input_bound": 0.25,
             "reports_refused": 0, "epoch": 2, "num_partitions": 4, "done": 1, "failed": 1,
             "todo": 1, "pending": 1, "progress": 0.5, "readers": [], "sync_group": None,
             "failed_partitions": [{"epoch": 2, "partition": 3, "records": 2,
                                    "reason": "<script>alert(1)</script>"}],
             "refusals": [], "label_histogram": {"cat": 3}}
            for name in ("a", "b") if job is None or name == job]
    return {"generated_at": 0.0, "sparkline_step_s": 10.0, "jobs": jobs}


def fallback(environ: dict[str, Any], start: Any) -> Iterable[bytes]:
    start("200 OK", [("Content-Type", "text/plain")])
    return [b"metrics"]


class Client:
    def __init__(self, token: str | None = TOKEN):
        self.app = StatusApp(snapshot, Access(token), fallback)

    def call(self, path: str, method: str = "GET", body: str = "",
             headers: dict[str, str] | None = None) -> tuple[str, dict[str, str], str]:
        path, _, query = path.partition("?")
        environ = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method,
                   "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body.encode()),
                   **{f"HTTP_{k.upper()}": v for k, v in (headers or {}).items()}}
        got: dict[str, Any] = {}

        def start(status: str, headers: list[tuple[str, str]]) -> None:
            got["status"], got["headers"] = status, dict(headers)
        body_out = b"".join(self.app(environ, start)).decode()
        return got["status"], got["headers"], body_out


def test_without_the_token_the_page_sends_to_the_login_form_and_the_json_is_refused() -> None:
    client = Client()
    status, headers, _ = client.call("/status")
    assert status.startswith("303") and headers["Location"] == "/login"
    status, _, body = client.call("/status.json")
    assert status.startswith("401") and "Bearer" in body
    status, _, body = client.call("/status.json", headers={"Authorization": "Bearer wrong"})
    assert status.startswith("401")
    assert client.call("/metrics")[2] == "metrics"  # Prometheus scrapes without a token


def test_the_bearer_token_opens_every_job_and_a_job_token_its_own() -> None:
    client = Client()
    _, _, body = client.call("/status.json", headers={"Authorization": f"Bearer {TOKEN}"})
    assert [j["job"] for j in json.loads(body)["jobs"]] == ["a", "b"]
    _, _, body = client.call("/status.json",
                             headers={"Authorization": f"Bearer {job_token(TOKEN, 'b')}"})
    assert [j["job"] for j in json.loads(body)["jobs"]] == ["b"]


def test_login_sets_a_session_cookie_that_is_not_the_token() -> None:
    client = Client()
    status, _, body = client.call("/login", "POST", "token=wrong")
    assert status.startswith("401") and "not this master" in body
    status, headers, _ = client.call("/login", "POST", f"token={TOKEN}")
    assert status.startswith("303") and headers["Location"] == "/status"
    cookie = headers["Set-Cookie"]
    assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    assert value.startswith(f"{COOKIE}=")
    status, headers, page = client.call("/status", headers={"Cookie": value})
    assert status.startswith("200") and "Job a" in page and "Job b" in page
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert client.call("/status", headers={"Cookie": f"{COOKIE}=forged"})[0].startswith("303")


def test_an_insecure_master_shows_its_page_to_anyone() -> None:
    status, _, page = Client(token=None).call("/status")
    assert status.startswith("200") and "log out" not in page


@pytest.mark.parametrize("refresh, expected", [("", 'content="5"'), ("?refresh=0", None)])
def test_the_page_refreshes_itself_unless_told_not_to(refresh: str, expected: str | None) -> None:
    _, _, page = Client(token=None).call("/status" + refresh)
    assert ('http-equiv="refresh"' in page) == (expected is not None)


def test_everything_shown_is_escaped() -> None:
    page = render(snapshot(None))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>ds</b>" not in page and "&lt;b&gt;ds&lt;/b&gt;" in page
