"""`trainfeed status JOB --watch` against a real master whose job a reader read (issue 29): plain
lines on a pipe (no control characters), a redraw in place on a terminal, the token sent."""
from __future__ import annotations

import io
import re

import pytest

from trainfeed import MasterSource, dist
from trainfeed.cli import status_watch
from trainfeed.cli.main import main
from trainfeed.errors import AuthenticationError, MasterUnavailableError
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.serve.server import DEFAULT_METRICS_PORT

pytestmark = pytest.mark.integration

TOKEN = "watch-test-token-0123456789abcdef"


def test_watch_prints_the_status_page_as_lines(storage: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent-kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    with MasterProcess(storage, token=TOKEN) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, "watched"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(10)) == 100
            url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore
            assert main(["status", "watched", "--master", master.address, "--watch",
                         "--status-url", url, "--interval", "0.1", "--count", "2"]) == 0
            out = capsys.readouterr().out
            screen = io.StringIO()
            status_watch.watch(lambda: status_watch.fetch(url, TOKEN), "watched", 0.1, screen,
                               tty=True, count=2)
            with pytest.raises(AuthenticationError, match="TRAINFEED_TOKEN"):
                status_watch.fetch(url, None)
        finally:
            reader.close()
    assert "\x1b" not in out
    blocks = [line for line in out.splitlines() if " job " in line]
    assert len(blocks) == 2  # two refreshes, each a block of lines
    assert re.search(r"^\d\d:\d\d:\d\d epoch       0: 10/10 partitions \(100%\)", out, re.M), out
    assert re.search(r"^\d\d:\d\d:\d\d input-bound \d+%", out, re.M), out
    assert re.search(r"^\d\d:\d\d:\d\d \S+:\d+-[0-9a-f]{16} ", out, re.M), out  # the reader
    assert screen.getvalue().count(status_watch.REDRAW) == 2


def _read_job(master: MasterProcess, job: str) -> None:
    reader = dist.reader("flowers", source=MasterSource(master.address, job))
    try:
        assert sum(len(b["_id"]) for b in reader.column_batches(10)) == 100
    finally:
        reader.close()


def test_watch_finds_the_metrics_port_the_master_names(
        storage: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 papercut 3: without --status-url, --watch reads the master's own metrics port
    (a free one here, not the default 9090), which JobStatus names."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent-kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    with MasterProcess(storage, token=TOKEN, metrics_port=0) as master:
        assert master.metrics_port not in (None, DEFAULT_METRICS_PORT)
        _read_job(master, "watched")
        assert main(["status", "watched", "--master", master.address, "--watch",
                     "--interval", "0.1", "--count", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\d\d:\d\d:\d\d epoch       0: 10/10 partitions \(100%\)", out, re.M), out


def test_watch_of_a_master_without_metrics_says_so_and_shows_the_counts(
        storage: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--metrics-port none`: no /status.json to watch; the command says why and what to do,
    then shows the gRPC counts once (as `status` without --watch)."""
    monkeypatch.setenv("KUBECONFIG", "/nonexistent-kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    with MasterProcess(storage, token=TOKEN, metrics_port=None) as master:
        _read_job(master, "watched")
        assert main(["status", "watched", "--master", master.address, "--watch",
                     "--interval", "0.1", "--count", "1"]) == 0
    captured = capsys.readouterr()
    assert "exports no metrics (started with --metrics-port none)" in captured.err, captured.err
    assert "--metrics-port PORT" in captured.err
    assert "10/10" in captured.out, captured.out


def test_a_metrics_port_out_of_range_is_refused_naming_it() -> None:
    assert status_watch.status_url("127.0.0.1:50051", 0) is None
    assert status_watch.status_url("[::1]:50051", 9100) == "http://[::1]:9100/status.json"
    with pytest.raises(MasterUnavailableError, match="names metrics port 70000"):
        status_watch.status_url("127.0.0.1:50051", 70000)
