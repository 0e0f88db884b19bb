"""`trainfeed status JOB --watch` against a real master whose job a reader read (issue 29): plain
lines on a pipe (no control characters), a redraw in place on a terminal, the token sent."""
from __future__ import annotations

import io
import re

import pytest

from trainfeed import MasterSource, dist
from trainfeed.cli import status_watch
from trainfeed.cli.main import main
from trainfeed.errors import AuthenticationError
from trainfeed.master.serve.process import MasterProcess

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
