"""The master's HTTP doors (issue 35): `/login`, `/status`, `/status.json`, `/logout` and
`/metrics` on its metrics port, attacked as anyone who can reach that port would, against a real
master process. Each bound is trainfeed.master.serve.metrics' or
trainfeed.master.serve.status_page's."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from contextlib import closing
from html.parser import HTMLParser
from typing import Any

import pytest
from board_records import record
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from integration.test_borrowed_identities import exactly_once, honest_pass
from prometheus_client import CollectorRegistry
from security.http_attacks import (
    MIB,
    closed_by_peer,
    hold,
    login_head,
    proc_status,
    request,
    scrape,
    send_big_body,
    status_of,
)

from trainfeed.ingest.board import record_path
from trainfeed.master.serve.metrics import (
    IDLE_CHECK_S,
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    MetricsServer,
)
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.serve.status_page import (
    MAX_FORM_BYTES,
    MAX_REFRESH_S,
    MAX_SESSIONS_PER_JOB,
    PATHS,
    REFRESH_S,
    Access,
    StatusApp,
)
from trainfeed.security import job_token

pytestmark = pytest.mark.integration
TOKEN = "http-doors-token-0123456789abcdef"
EVIL = '"><meta http-equiv="refresh" content="0;url=https://evil.example/login">'
# The bound: the master grows by less than this under each attack.
RSS_BOUND = 50 * 1000 * 1000
# Idle connections are closed between IDLE_TIMEOUT_S and IDLE_TIMEOUT_S + IDLE_CHECK_S after
# their last byte; the margin is for a busy machine.
CLOSED_WITHIN_S = IDLE_TIMEOUT_S + IDLE_CHECK_S + 30


def metrics_port(master: MasterProcess) -> int:
    assert master.metrics_port is not None
    return master.metrics_port


class PeakRss:
    """Samples a process's RSS every 20 ms while the block runs."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, proc_status(self.pid, "VmRSS"))

    def __enter__(self) -> PeakRss:
        self.peak = proc_status(self.pid, "VmRSS")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("length, expected", [
    ("-1", 400), ("-4096", 400), ("+12", 400), ("1e3", 400), ("４", 400), (None, 411),
    (str(MAX_FORM_BYTES + 1), 413), (str(400 * MIB), 413), ("9" * 40, 413)])
def test_a_login_whose_length_is_not_a_small_number_is_refused_before_its_body(
        storage: str, length: str | None, expected: int) -> None:
    """f44c545 read a negative length as read(-1): until the client hung up."""
    with MasterProcess(storage) as master:
        port = metrics_port(master)
        assert status_of(request(port, login_head(length) + b"token=x",
                                 timeout_s=20)) == expected
        scrape(port)


def test_a_300_mib_login_body_leaves_the_master_small_and_serving(storage: str) -> None:
    """The issue: one 300 MiB body took the master from 66 to 368 MB. With its length said the
    master answers 413 before reading it; chunked, it stops at MAX_FORM_BYTES."""
    with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master:
        port = metrics_port(master)
        scrape(port)
        with honest_pass(master) as (_, got):
            before = proc_status(master.proc.pid, "VmRSS")
            with PeakRss(master.proc.pid) as rss:
                answers = [send_big_body(port, 300 * MIB, chunked=chunked)
                           for chunked in (False, True)]
                scrape(port)
        grown = rss.peak - before
        print(f"300 MiB login bodies: {answers}; master RSS {before / 1e6:.0f} MB, "
              f"peak +{grown / 1e6:.1f} MB")
        assert [status for _, status in answers] == [413, 413], answers
        assert grown < RSS_BOUND
        exactly_once(got)


def test_held_connections_announcing_huge_lengths_hold_neither_memory_nor_a_thread(
        storage: str) -> None:
    """The issue: two held 400 MiB bodies took the master to 881 MB; a large length with no
    body held a thread each, for ever."""
    with MasterProcess(storage) as master:
        port, pid = metrics_port(master), master.proc.pid
        scrape(port)
        threads, before = proc_status(pid, "Threads"), proc_status(pid, "VmRSS")
        huge = hold(port, 2, login_head(400 * MIB))
        waiting = hold(port, 8, login_head(MAX_FORM_BYTES))  # a body that never comes
        try:
            scrape(port)
            assert proc_status(pid, "Threads") <= threads + 2
            for sock in huge:  # refused at once, the body unread
                assert status_of(sock.recv(4096)) == 413
            assert all(closed_by_peer(sock, CLOSED_WITHIN_S) for sock in huge + waiting)
            assert proc_status(pid, "VmRSS") - before < RSS_BOUND
            scrape(port)
        finally:
            for sock in huge + waiting:
                sock.close()


def test_idle_connections_are_closed_and_the_master_still_answers(storage: str) -> None:
    """Twice MAX_CONNECTIONS connections that send nothing: no thread each, the extra ones wait
    in the kernel's queue, every one is closed after the idle timeout, and /metrics answers."""
    with MasterProcess(storage) as master:
        port, pid = metrics_port(master), master.proc.pid
        scrape(port)
        threads = proc_status(pid, "Threads")
        idle = hold(port, 2 * MAX_CONNECTIONS)
        try:
            time.sleep(0.5)  # accepted, those the cap lets in
            assert proc_status(pid, "Threads") <= threads + 2
            scrape(port)  # waits at most until idle connections are closed
            assert closed_by_peer(idle[0], CLOSED_WITHIN_S)
            assert closed_by_peer(idle[-1], 2 * CLOSED_WITHIN_S)
        finally:
            for sock in idle:
                sock.close()


def bearer(port: int, path: str, headers: dict[str, str] | None = None
           ) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}",
                                                 **(headers or {})})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A master with a token over a storage whose uploads board holds a hostile record."""
    storage = tmp_path_factory.mktemp("storage")
    hostile = {**record(0), "host": EVIL, "reason": EVIL}
    path = storage / record_path("public/photos", hostile["fingerprint"], 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(hostile))
    # A slice index of text is no packer's record: the board leaves it unread (board.well_formed)
    odd = {**record(1), "index": EVIL}
    (storage / record_path("public/photos", odd["fingerprint"], 1)).write_text(json.dumps(odd))
    with MasterProcess(str(storage), token=TOKEN) as master:
        yield master


@pytest.mark.parametrize("given, expected", [
    ("²", REFRESH_S), ("9" * 5000, REFRESH_S), ("-1", REFRESH_S), ("+5", REFRESH_S),
    ("1e3", REFRESH_S), (" 7", REFRESH_S), ("٣", REFRESH_S), ("7", 7),
    ("99999", MAX_REFRESH_S), ("0", 0)])
def test_refresh_takes_ascii_digits_within_an_hour(secured: MasterProcess, given: str,
                                                   expected: int) -> None:
    """f44c545: `?refresh=²` and 5,000 digits gave a 500 and a traceback."""
    status, _, page = bearer(metrics_port(secured), "/status?refresh="
                             + urllib.parse.quote(given))
    assert status == 200
    refresh = f'<meta http-equiv="refresh" content="{expected}">'
    assert (refresh in page) if expected else ('http-equiv="refresh"' not in page)
    assert "Traceback" not in "".join(secured.log)


def login(connection: http.client.HTTPConnection, token: str) -> str:
    body = urllib.parse.urlencode({"token": token})
    connection.request("POST", "/login", body=body, headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 303, answer.status
    return answer.getheader("Set-Cookie", "").split(";")[0]


def test_a_thousand_job_logins_do_not_log_the_operator_out(secured: MasterProcess) -> None:
    """f44c545 kept 1,000 sessions for every token together, oldest dropped: a job token's
    logins dropped the operator's. Now each job's pool drops its own oldest only."""
    port = metrics_port(secured)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        operator = login(connection, TOKEN)
        jobs = [login(connection, job_token(TOKEN, "noisy")) for _ in range(1000)]
        other = login(connection, job_token(TOKEN, "quiet"))
    finally:
        connection.close()
    for cookie, expected in ((operator, 200), (other, 200), (jobs[-1], 200),
                             (jobs[-MAX_SESSIONS_PER_JOB - 1], 303), (jobs[0], 303)):
        with closing(http.client.HTTPConnection("127.0.0.1", port, timeout=60)) as c:
            c.request("GET", "/status.json" if expected == 200 else "/status",
                      headers={"Cookie": cookie})
            assert c.getresponse().status == expected, cookie


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text between tags."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_an_uploads_board_record_reaches_the_page_as_text(secured: MasterProcess) -> None:
    """f44c545 wrote a record's slice index unescaped into an attribute and a table cell: a
    storage writer's `<meta http-equiv="refresh">` sent the operator elsewhere. Now a record's
    fields are checked for their type when read (an index of text is left out), and every text
    shown goes through the page's one escaping choke point."""
    status, _, page = bearer(metrics_port(secured), "/status?refresh=0")
    assert status == 200 and 'class="uploads"' in page
    parsed = Elements()
    parsed.feed(page)
    assert not any(tag == "meta" and ("http-equiv", "refresh") in attrs
                   for tag, attrs in parsed.tags), "a refresh the record injected"
    assert not any("evil" in (value or "") or "evil" in name
                   for _, attrs in parsed.tags for name, value in attrs)
    assert [attrs for tag, attrs in parsed.tags if tag == "tr" and ("data-slice", "0") in attrs]
    assert sum(EVIL in text for text in parsed.text) >= 2  # the host and the reason, as text


# -- any request at all ------------------------------------------------------------------------
METHODS = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "G\x7fT"])
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
QUERY = st.one_of(TEXT.map(urllib.parse.quote), st.sampled_from(
    ["refresh=%C2%B2", "refresh=" + "9" * 5000, "refresh=-1", "refresh=0", "a=" * 200]))
HEADER_VALUE = st.one_of(st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                 max_size=60), st.sampled_from(
    ["-1", "Bearer ", f"Bearer {TOKEN}", f"Bearer {TOKEN}x", "trainfeed_status=x; a=\"",
     "0" * 300]))
HEADERS = st.dictionaries(st.sampled_from(
    ["Authorization", "Cookie", "Content-Type", "X-Forwarded-For", "Expect", "Accept",
     "Content-Length"]), HEADER_VALUE, max_size=4)
# A chunked body is framed below; these codings the server does not know.
CODINGS = st.sampled_from([None, "chunked", "gzip", "gzip, chunked", "identity", "x"])


@pytest.fixture(scope="module")
def app_server() -> Any:
    """The master's HTTP server and app in this process, with a stand-in for its state (the
    property test sends hundreds of requests: a process per example would be minutes)."""
    def snapshot(job: str | None) -> dict[str, Any]:
        return {"generated_at": 0.0, "sparkline_step_s": 10.0, "jobs": []}
    registry = CollectorRegistry()
    with MetricsServer(registry, "127.0.0.1", 0,
                       wrap=lambda app: StatusApp(snapshot, Access(TOKEN), app)) as server:
        yield server


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(method="GET", path="/status", query="refresh=%C2%B2",
         headers={"Authorization": f"Bearer {TOKEN}"}, body=b"", coding=None)
@example(method="GET", path="/status", query="refresh=" + "9" * 5000,
         headers={"Authorization": f"Bearer {TOKEN}"}, body=b"", coding=None)
@example(method="POST", path="/login", query="", headers={"Content-Length": "-1"},
         body=b"token=x", coding=None)
@given(method=METHODS, path=st.one_of(st.sampled_from(PATHS), TEXT.map(
    lambda t: "/" + urllib.parse.quote(t))), query=QUERY, headers=HEADERS,
    body=st.one_of(st.binary(max_size=MAX_FORM_BYTES), st.sampled_from(
        [b"token=" + b"&" * 100, b"token=%ff%fe", b"a=1;" * 1000])), coding=CODINGS)
def test_no_request_gets_a_5xx_or_a_traceback(app_server: MetricsServer, method: str,
                                              path: str, query: str,
                                              headers: dict[str, str], body: bytes,
                                              coding: str | None,
                                              caplog: pytest.LogCaptureFixture) -> None:
    head = [f"{method} {path}{'?' + query if query else ''} HTTP/1.1", "Host: 127.0.0.1"]
    if headers.get("Content-Length", "x").isdigit():  # no request waiting for its body
        headers["Content-Length"] = str(len(body))
    if coding is not None:
        headers.pop("Content-Length", None)
        headers["Transfer-Encoding"] = coding
        if coding == "chunked":
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    head += [f"{k}: {v}" for k, v in headers.items()]
    if "Content-Length" not in headers and coding is None:
        head.append(f"Content-Length: {len(body)}")
    raw = ("\r\n".join(head) + "\r\nConnection: close\r\n\r\n").encode() + body
    with caplog.at_level("WARNING"):
        answer = request(app_server.port, raw, timeout_s=CLOSED_WITHIN_S)
    status = status_of(answer)
    # 501 is HTTP's answer to a transfer coding the server does not know (RFC 9112 6.1).
    unknown_coding = status == 501 and "Transfer-Encoding" in headers
    assert status is not None and (status < 500 or unknown_coding), answer[:300]
    assert len(answer) < 64 * 1024 + MAX_HEADER_BYTES
    assert b"Traceback" not in answer
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_every_path_answered_is_in_paths(app_server: MetricsServer) -> None:
    """PATHS (the door table's list) names every path the app answers itself: any other path
    gets the Prometheus exporter, which answers them all alike."""
    def get(path: str) -> tuple[int | None, bytes]:
        answer = request(app_server.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: "
                         "close\r\n\r\n".encode(), timeout_s=30)
        return status_of(answer), answer.split(b"\r\n\r\n", 1)[1]
    exporter = get("/no-such-page")
    assert get("/metrics") == exporter
    assert all(get(path) != exporter for path in PATHS if path != "/metrics")


def test_the_http_server_refuses_a_second_server_on_its_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(Exception, match=f"--metrics-port {port}: cannot listen"):
            MetricsServer(CollectorRegistry(), "127.0.0.1", port)

