"""Doors of text that reach a terminal or a log (issue 35 §5): a FAILED reason any job-token
holder sends, an uploads-board record any storage writer drops, a manifest's text. ESC
sequences in them must not retitle the window (`ESC ] 0 ; … BEL`), clear the screen
(`ESC [ 2 J`), return the cursor to print a fake line (`\\r`, `\\n`) or reorder what is read
(bidi overrides): `trainfeed status JOB`, its `--watch`, `status --uploads`, `info` and the
master's log show them as `\\x1b`, `\\r`, `\\u202e` (trainfeed.terminal_text.visible).
"""
from __future__ import annotations

import http.server
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
import unicodedata
from pathlib import Path

import pytest
from board_records import record
from cluster.apiserver import FakeApiServer
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainfeed.cli import log_format, status_uploads, status_watch
from trainfeed.cli.main import main
from trainfeed.ingest.board import record_path
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.security import job_token
from trainfeed.storage import open_storage
from trainfeed.terminal_text import visible
from trainfeed.v1 import master_pb2 as pb

TOKEN = "terminal-doors-token-0123456789abcdef"
JOB = "evil"
# Retitles the window, clears the screen, returns to the line's start to print a fake verdict,
# reverses what follows (bidi override), starts a fake line, and a C1 CSI (0x9b) with DEL.
HOSTILE = ("\x1b]0;pwned\x07\x1b[2J\rall good: 0 failed\u202edoog lla\u2066x\u2069"
           "\nINFO fake line\x9b31m\x7f")
# What the operator must see instead: the same text, each control written out.
SHOWN = ("\\x1b]0;pwned\\x07\\x1b[2J\\rall good: 0 failed\\u202edoog lla\\u2066x\\u2069"
         "\\nINFO fake line\\x9b31m\\x7f")
# Characters that steer a terminal or what it shows: the C0 and C1 controls, DEL, bidi.
STEERING = ({chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7f, 0xa0)}
            | {chr(c) for c in range(0x202a, 0x202f)} | {chr(c) for c in range(0x2066, 0x206a)})


def steering(text: str, lines: bool = True) -> set[str]:
    """The characters of `text` that steer a terminal (line ends allowed when `lines`)."""
    return {c for c in text if c in STEERING or unicodedata.category(c) in ("Cc", "Cf")} - (
        {"\n"} if lines else set())


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """`trainfeed ARGS` as its own process, as an operator runs it (stdout a pipe), outside any
    cluster, with `token` as $TRAINFEED_TOKEN."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBERNETES_SERVICE_HOST", "TRAINFEED_TOKEN", "TRAINFEED_TOKEN_FILE")}
    env["KUBECONFIG"] = "/nonexistent-kubeconfig"
    if token is not None:
        env["TRAINFEED_TOKEN"] = token
    done = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", *args],
                          capture_output=True, timeout=120, env=env)
    # Decoded by hand: text=True would turn a raw "\r" into "\n" and hide it.
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode())


@pytest.mark.integration
@pytest.mark.slow
def test_a_failed_reason_reaches_status_watch_and_the_log_only_escaped(storage: str) -> None:
    """A job-token holder reports a partition FAILED with a hostile reason; the operator's
    `trainfeed status`, one frame of `--watch` (pipe and terminal) and the master's log show
    it escaped, with no control character of it."""
    with MasterProcess(storage, token=TOKEN, extra_args=["--max-failures", "1"]) as master:
        with MasterClient(master.address, give_up_s=10, token=job_token(TOKEN, JOB)) as client:
            worker = client.open_job(JOB, "flowers", seed=0).worker_id
            task = client.get_tasks(JOB, worker, 0, max_tasks=1, wait_ms=0).tasks[0]
            client.report(JOB, worker, [pb.TaskReport(
                epoch=0, partition=task.partition, outcome=pb.TaskReport.FAILED,
                lease=task.lease, reason=HOSTILE)])
            assert HOSTILE in client.job_status(JOB).failed_reasons[0]  # stored as sent
        status = cli("status", JOB, "--master", master.address, "--interval", "0",
                     token=TOKEN)
        url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore[union-attr]
        watched = cli("status", JOB, "--master", master.address, "--watch", "--status-url", url,
                      "--count", "1", token=TOKEN)
        screen = io.StringIO()
        status_watch.watch(lambda: status_watch.fetch(url, TOKEN), JOB, 0, screen, tty=True,
                           count=1)
        master.stop()
    assert status.returncode == 0, status.stderr
    assert f"failed      partition {task.partition}: {SHOWN}" in status.stdout, status.stdout
    assert watched.returncode == 0, watched.stderr
    assert f"partition {task.partition}: {SHOWN}" in watched.stdout, watched.stdout
    frame = screen.getvalue()
    assert frame.startswith(status_watch.REDRAW) and SHOWN in frame, frame
    log = "".join(master.log)
    assert SHOWN in log, log
    for out in (status.stdout, status.stderr, watched.stdout, watched.stderr,
                frame[len(status_watch.REDRAW):], log):
        assert not steering(out), sorted(steering(out))


def hostile_board(root: Path) -> None:
    """Two slice records of an upload, as any writer of the storage can drop them: one failed,
    one running, every text field hostile. (A record in a made-up state is left unread by the
    board: board.well_formed.)"""
    now = time.time()
    for index, state in ((0, "failed"), (1, "running")):
        fields = record(index, state=state, at=now, dataset=f"photos{HOSTILE}",
                        fingerprint=f"{'f' * 16}{HOSTILE}", host=f"node{HOSTILE}",
                        reason=f"OSError: {HOSTILE}")
        path = root / record_path("photos", "f" * 16, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fields))


def test_a_board_record_reaches_status_uploads_only_escaped(tmp_path: Path) -> None:
    hostile_board(tmp_path)
    shown = cli("status", "--uploads", "--storage", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"upload      photos{SHOWN} (3 slices, fingerprint {'f' * 16}{SHOWN})" in out, out
    assert f"  problem   slice 0: failed: OSError: {SHOWN}" in out, out
    assert f"on node{SHOWN}, " in out, out
    assert not steering(out + shown.stderr), sorted(steering(out))
    # The same on a terminal (--watch): the redraw is the only control sequence written.
    read = status_uploads.read(open_storage(str(tmp_path)))
    screen = io.StringIO()
    status_watch.watch(lambda: {"uploads": read()}, None, 0, screen, tty=True, count=1)
    frame = screen.getvalue()
    assert frame.startswith(status_watch.REDRAW) and SHOWN in frame
    assert not steering(frame[len(status_watch.REDRAW):])


def test_a_manifests_text_reaches_info_and_ls_only_escaped(storage: str) -> None:
    """A manifest is any storage writer's: `trainfeed info` and `ls` show its text escaped."""
    path = Path(storage) / "flowers" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["source"] = f"list{HOSTILE}"
    manifest["created_at"] = f"today{HOSTILE}"
    path.write_text(json.dumps(manifest))
    info = cli("info", "flowers", "--storage", storage)
    listed = cli("ls", "--storage", storage)
    assert info.returncode == listed.returncode == 0, info.stderr + listed.stderr
    assert f"from list{SHOWN}, today{SHOWN})" in info.stdout, info.stdout
    assert listed.stdout.rstrip("\n").endswith(f"\ttoday{SHOWN}"), listed.stdout
    assert listed.stdout.count("\t") == 5  # the columns' own tabs, and only those
    for out in (info.stdout.replace("\t", " "), listed.stdout.replace("\t", " ")):
        assert not steering(out), sorted(steering(out))


def test_every_text_of_a_status_snapshot_is_escaped_in_the_watch_view() -> None:
    """A master (or whatever answers at --status-url) chooses every string of /status.json:
    job and dataset, readers' names and flags, refusals, a broken sync group."""
    job = {"job": f"j{HOSTILE}", "dataset": f"d{HOSTILE}", "num_records": 20, "epoch": 0,
           "done": 0, "failed": 1, "num_partitions": 2, "progress": 0.5, "todo": 1,
           "pending": 0, "records_per_s": 0.0, "sparkline": [], "input_bound": 0.0,
           "workers_alive": 1, "reports_refused": 1,
           "readers": [{"worker": f"w{HOSTILE}", "records_per_s": 1.0, "input_bound": 0.5,
                        "leases_held": 1, "last_contact_s": 2.0, "flags": [HOSTILE]}],
           "sync_group": {"world_size": 2, "batch_size": 8, "broken": HOSTILE},
           "failed_partitions": [{"epoch": 0, "partition": 1, "reason": HOSTILE}],
           "refusals": [{"count": 1, "worker": f"w{HOSTILE}", "why": HOSTILE}]}
    lines = status_watch.render({"jobs": [job]}, f"j{HOSTILE}")
    text = "\n".join(lines)
    # job and dataset, the broken group, reader and flags, the lost partition, refusal and why
    assert len(lines) == 10 and text.count(SHOWN) == 8, lines
    assert not any("\n" in line for line in lines)
    assert not steering(text)
    missing = status_watch.render({"jobs": [job]}, "other")  # names the jobs it has
    assert SHOWN in missing[0] and not steering(missing[0], lines=False)


class HostileStatusServer(http.server.BaseHTTPRequestHandler):
    """Answers every request with an HTTP error whose reason phrase is hostile."""

    def do_GET(self) -> None:
        self.send_response(500, "\x1b]0;pwned\x07\x1b[2J all good \x9b31m\x7f")  # latin-1
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_an_error_text_from_the_status_url_is_shown_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The reason phrase of whatever answers at --status-url reaches `trainfeed status`'s
    error line (main's), escaped."""
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), HostileStatusServer) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/status.json"
            assert main(["status", "j", "--master", "127.0.0.1:1", "--watch", "--status-url",
                         url, "--count", "1"]) == 2
        finally:
            server.shutdown()
            thread.join(10)
    err = capsys.readouterr().err
    assert f"{url}: HTTP 500 " in err and "\\x1b]0;pwned\\x07\\x1b[2J" in err, err
    assert not steering(err), sorted(steering(err))


@pytest.mark.slow
def test_a_pods_problem_from_the_cluster_is_shown_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A pod's waiting message is a registry's or a kubelet's text: `trainfeed status` prints it
    as a problem line (stdout, one line) and in its error (stderr), escaped."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeApiServer() as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path, namespace="ml")))
        kube.add("pods", "ml", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "evil-workers-0-abcde", "labels": {
                "trainfeed.io/job": "evil", "app.kubernetes.io/component": "workers"}},
            "spec": {"containers": [{"name": "worker", "image": "reg/img:1"}]},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "worker", "image": "reg/img:1", "imageID": "", "ready": False,
                "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff",
                                                         "message": f"denied{HOSTILE}"}}}]}})
        assert main(["status", "evil"]) == 2
    captured = capsys.readouterr()
    assert f"(ImagePullBackOff: denied{SHOWN})" in captured.out, captured.out
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rall good" in captured.err, captured.err
    assert not steering(captured.out) and not steering(captured.err)


def log_record(message: str, *args: object) -> logging.LogRecord:
    try:
        raise RuntimeError(f"disk on fire\n{HOSTILE}")
    except RuntimeError:
        exc_info = sys.exc_info()
    return logging.LogRecord("trainfeed.test", logging.WARNING, __file__, 1, message, args,
                             exc_info)


def test_both_log_formats_show_a_hostile_message_escaped() -> None:
    formatter = log_format.TextFormatter(log_format.TEXT_FORMAT)
    text = formatter.format(log_record("worker failed: %s", HOSTILE))
    first, *traceback = text.split("\n")
    assert first.endswith(f"worker failed: {SHOWN}")  # the message: one line
    assert traceback[0] == "Traceback (most recent call last):"
    # A traceback keeps its line breaks (the exception's own included), nothing else raw.
    assert "RuntimeError: disk on fire" in traceback and SHOWN.split("\\n")[0] in traceback
    assert not steering(text)
    line = log_format.JsonFormatter().format(log_record("worker failed: %s", HOSTILE))
    assert not steering(line, lines=False)  # not even json.dumps' raw DEL, C1 and bidi
    entry = json.loads(line)
    assert entry["message"] == f"worker failed: {HOSTILE}"  # a collector reads what was said
    assert entry["exception"].endswith(f"RuntimeError: disk on fire\n{HOSTILE}")
    plain = log_format.JsonFormatter().format(log_record("job %r: ünï 🙂 %s", "j", "C:\\data"))
    assert json.loads(plain)["message"] == "job 'j': ünï 🙂 C:\\data"
    assert "ünï 🙂" in plain  # printable text is not escaped


# --- the function itself -----------------------------------------------------------------

@pytest.mark.parametrize("char", sorted(STEERING | {"\u200e", "\u200f", "\u061c", "\u2028",
                                                      "\u2029", "\ufeff", "\x00"}))
def test_every_steering_character_is_shown_as_an_escape(char: str) -> None:
    out = visible(f"a{char}b")
    assert out.startswith("a\\") and out.endswith("b") and out.isprintable()
    assert out[1:-1] == repr(char)[1:-1]  # the escape repr() writes


@settings(max_examples=500, deadline=None)
@given(st.text())
@example(HOSTILE)
@example("\ud800 lone surrogate")
def test_no_output_holds_a_control_character(text: str) -> None:
    out = visible(text)
    assert out.isprintable()
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in out)
    assert visible(out) == out  # escaping twice changes nothing
    lines = visible(text, multiline=True)
    assert lines.split("\n") == [visible(part) for part in text.split("\n")]


@given(st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp",
                                                   "Zs")) | st.just(" ")))
@example("ünï 🙂 C:\\data\\x1b · ▁▂▃ …")
def test_printable_text_is_unchanged(text: str) -> None:
    assert visible(text) is text or visible(text) == text
    assert visible(text, multiline=True) == text
