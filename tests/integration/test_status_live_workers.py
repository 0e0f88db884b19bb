"""`trainfeed status` shows the real number of live workers (issue 26 §6): 0 for a job nobody
reads any more, where the master's JobStatus said 1.

The count comes from the master (GetJobStatus's `workers`), which reported `max(1, live)`: the
floor belongs to the fair-share arithmetic (trainfeed/master/serve/service.py, `_live_workers`) and
leaked into the status answer, which now counts the live workers themselves."""
from __future__ import annotations

import pytest

from trainfeed import MasterSource, dist
from trainfeed.cli.main import main
from trainfeed.master.serve.process import MasterProcess

pytestmark = pytest.mark.integration

TOKEN = "status-live-workers-token-0123456789"


def test_status_of_a_job_whose_reader_left_shows_no_worker(
        storage: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent-kubeconfig")
    with MasterProcess(storage, token=TOKEN) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, job="resnet"))
        try:
            assert sum(len(b["_id"]) for b in reader.column_batches(10)) == 100
        finally:
            reader.close()  # LeaveJob: the master forgets this worker
        assert main(["status", "resnet", "--master", master.address, "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "partitions  todo 0 · pending 0 · done 10" in out
    assert "workers     0" in out, out
