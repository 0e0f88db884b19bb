"""The status page's app (trainfeed.master.serve.status_page) called as WSGI: the token by header or
login cookie, job tokens limited to their job, the login form, no secret in what it renders, and
everything escaped."""
from __future__ import annotations

import io
import json
from collections.abc import Iterable
from html.parser import HTMLParser
from typing import Any

import pytest
from board_records import record

from trainfeed.ingest.board_summary import summarize
from trainfeed.master.serve.status import eta
from trainfeed.master.serve.status_page import (
    COOKIE,
    MAX_FORM_BYTES,
    MAX_REFRESH_S,
    MAX_SESSIONS_PER_JOB,
    REFRESH_S,
    Access,
    StatusApp,
    refresh_of,
    render,
)
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


@pytest.mark.parametrize("query, expected", [
    ("refresh=7", 7), ("refresh=0", 0), ("refresh=99999", MAX_REFRESH_S), ("", REFRESH_S),
    ("refresh=%C2%B2", REFRESH_S), ("refresh=" + "9" * 5000, REFRESH_S),
    ("refresh=-1", REFRESH_S), ("refresh=+3", REFRESH_S), ("refresh=%D9%A3", REFRESH_S),
    ("&".join(["a=1"] * 100), REFRESH_S)])
def test_refresh_takes_ascii_digits_clamped_to_an_hour(query: str, expected: int) -> None:
    """f44c545 checked str.isdigit and then int() failed: 500 for `²` and 5,000 digits."""
    assert refresh_of(query) == expected
    status, _, page = Client(token=None).call(f"/status?{query}")
    assert status.startswith("200")
    assert (f'content="{expected}"' in page) if expected else "http-equiv" not in page


@pytest.mark.parametrize("length, status", [
    (None, "411"), ("-1", "400"), ("x", "400"), ("²", "400"), (str(MAX_FORM_BYTES + 1), "413"),
    ("9" * 50, "413")])
def test_a_login_form_without_a_small_length_is_refused_unread(length: str | None,
                                                               status: str) -> None:
    app = StatusApp(snapshot, Access(TOKEN), fallback)
    environ = {"PATH_INFO": "/login", "REQUEST_METHOD": "POST", "wsgi.input": Unreadable(),
               **({"CONTENT_LENGTH": length} if length is not None else {})}
    got: dict[str, str] = {}
    app(environ, lambda s, h: got.setdefault("status", s))
    assert got["status"].startswith(status)


class Unreadable(io.RawIOBase):
    def read(self, size: int | None = -1) -> bytes:
        raise AssertionError(f"the body was read ({size})")


def test_a_form_of_many_fields_is_not_an_error() -> None:
    status, _, _ = Client().call("/login", "POST", "token=x" + "&" * 100)
    assert status.startswith("401")


def test_a_job_token_logging_in_without_end_drops_only_its_own_sessions() -> None:
    access = Access(TOKEN)
    operator = access.login(TOKEN)
    other = access.login(job_token(TOKEN, "quiet"))
    noisy = [access.login(job_token(TOKEN, "noisy")) for _ in range(1000)]

    def scope(sid: str | None) -> str | None:
        return access.scope_of_request({"HTTP_COOKIE": f"{COOKIE}={sid}"})
    assert scope(operator) == "" and scope(other) == "quiet"
    assert [scope(s) for s in noisy[-MAX_SESSIONS_PER_JOB:]] == ["noisy"] * MAX_SESSIONS_PER_JOB
    assert scope(noisy[-MAX_SESSIONS_PER_JOB - 1]) is None
    operators = [access.login(TOKEN) for _ in range(1000)]
    assert scope(other) == "quiet" and scope(operators[-1]) == ""


def test_a_board_record_renders_as_text_not_markup() -> None:
    """f44c545 wrote a record's slice index raw into an attribute and a cell."""
    evil = '"><meta http-equiv="refresh" content="0;url=https://evil.example">'
    hostile = {**record(0), "index": evil, "host": evil, "reason": evil, "dataset": evil}
    data = {**snapshot(None), "uploads": summarize([hostile], now=1005.0), "uploads_error": evil}

    class Tags(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.found.append((tag, attrs))
    tags = Tags()
    tags.feed(render(data, refresh_s=0))
    assert not any(tag == "meta" and ("http-equiv", "refresh") in attrs
                   for tag, attrs in tags.found)
    assert not any("evil" in name for _, attrs in tags.found for name, _ in attrs)


def job_in(state: str, name: str, **more: Any) -> dict[str, Any]:
    """One job of a snapshot, in `state` (trainfeed.master.serve.status.job_state)."""
    [job] = snapshot(None)["jobs"][:1]
    return {**job, "job": name, "state": state, "records_left": 0, "eta_s": 0.0,
            "newer_version": None, **more}


def test_running_jobs_come_first_and_finished_ones_are_folded() -> None:
    """f44c545 listed jobs by name: a finished job 'a' above the running 'b', which fell below
    the fold, and its synchronous group in red as broken."""
    finished_group = {"world_size": 2, "batch_size": 5, "ranks": {"0": "w0", "1": "w1"},
                      "broken": None, "finished": "the synchronous group of world size 2 "
                                                  "finished: every rank went quiet"}
    data = {**snapshot(None), "jobs": [
        job_in("finished", "a", sync_group=finished_group),
        job_in("running", "b", records_left=40, eta_s=8.0),
        job_in("finished", "c")]}
    page = render(data, refresh_s=0)
    running, _, folded = page.partition('<details class="finished-jobs"')
    assert "Job b" in running and "Job a" not in running and "Job c" not in running
    assert "<summary>2 finished job(s)</summary>" in folded
    assert folded.index("Job a") < folded.index("Job c")
    section_a = folded[folded.index('id="job-a"'):folded.index('id="job-c"')]
    assert "broken" not in section_a and '<b class="finished">finished</b>' in section_a
    assert 'data-state="finished"' in section_a and "<script" not in page


@pytest.mark.parametrize("left, eta_s, shown", [
    (1234, 75.0, 'records left <b class="records-left">1,234</b> · to the end of the epoch '
                 '<b class="eta">1:15</b> at 5 records/s'),
    (1234, None, '<b class="eta">—</b> (no records read lately)'),
    (0, 0.0, '<b class="eta">0:00</b></p>')])
def test_records_left_and_the_time_to_the_epochs_end_are_shown(
        left: int, eta_s: float | None, shown: str) -> None:
    data = {**snapshot(None), "jobs": [job_in("running", "a", records_left=left, eta_s=eta_s)]}
    page = render(data, refresh_s=0)
    assert shown in page
    assert f'data-records-left="{left}"' in page


def test_a_newer_version_notice_is_shown_escaped() -> None:
    notice = "job 'a' reads version 1 of dataset '<b>ds</b>'; version 2 is published"
    data = {**snapshot(None), "jobs": [job_in("running", "a", newer_version={
        "version": 2, "num_records": 30, "notice": notice})]}
    page = render(data, refresh_s=0)
    assert '<p class="newer-version" data-version="2"><b>newer data</b> job &#39;a&#39; reads ' \
           'version 1 of dataset &#39;&lt;b&gt;ds&lt;/b&gt;&#39;' in page


@pytest.mark.parametrize("left, rate, expected", [
    (0, 0.0, 0.0), (100, 0.0, None), (100, 20.0, 5.0), (100, float("nan"), None),
    (100, float("inf"), None), (100, 5e-324, None), (100, -3.0, None)])
def test_the_time_to_the_epochs_end_needs_a_finite_rate(left: int, rate: float,
                                                         expected: float | None) -> None:
    """The rate comes from what readers report: none that makes the page fail to render."""
    assert eta(left, rate) == expected
    page = render({**snapshot(None), "jobs": [job_in("running", "a", records_left=left,
                                                     eta_s=eta(left, rate))]}, refresh_s=0)
    assert "records left" in page


def test_the_decoders_and_a_scaling_decision_are_shown_escaped() -> None:
    """Issue 37: the registered decoders (master's token only: the snapshot leaves them out for
    a job token) and a job's last scaling decision, whose detail is the API server's text."""
    evil = '<script>alert(1)</script>'
    scaling = {"job": "a", "deployment": "a-decoders", "bounds": "1:8", "cooldown_s": 60.0,
               "decision": {"at": 0.0, "action": "hold", "before": 2, "replicas": 2,
                            "reason": "api-error", "detail": evil, "decoders_busy": 0.9,
                            "input_bound": 0.4}}
    data = {**snapshot(None), "jobs": [job_in("running", "a", decoder_scaling=scaling)],
            "decoders": [{"address": "10.0.0.7:50052", "busy": 0.9, "slots": 4},
                         {"address": evil, "busy": 0.1, "slots": 2}]}
    page = render(data, refresh_s=0)
    assert "<script" not in page
    assert '<b class="scaling-action">hold</b> 2 → <b class="decoders-size">2</b> (api-error: ' \
           '&lt;script&gt;' in page
    assert "decoders busy 90% · input-bound 40%" in page
    assert '<h2>Decoders <b>2</b></h2>' in page and "<td>10.0.0.7:50052</td><td>90%</td>" in page
    no_decoders = render({**snapshot(None), "decoders": []}, refresh_s=0)
    assert 'id="decoders"' not in no_decoders and "decoder-scaling" not in no_decoders
