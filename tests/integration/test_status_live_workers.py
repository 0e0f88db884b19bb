"""`trainfeed status` shows the real number of live workers (issue 26 §6): 0 for a job nobody
reads any more, where the master's JobStatus said 1.

The count comes from the master (GetJobStatus's `workers`), which reported `max(1, live)`: the
floor belongs to the fair-share arithmetic (trainfeed/master/serve/service.py, `_live_workers`) and
leaked into the status answer, which now counts the live workers themselves.

Readers alive are one figure (issue 38): the page, /status.json and `trainfeed_workers_alive`
agree, and a reader that exited is alive on none of them."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_master_metrics import scrape, value
from test_status_json import status_of
from test_status_page_browser import REPO, WORKER, wait_paused

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


def test_readers_that_exit_are_alive_on_neither_the_page_nor_the_metrics(
        storage: str) -> None:
    """Issue 38: the page said `readers alive 2` (with `silent` flags) for reader processes that
    had exited 72 s before, counting sessions heard from within three lease timeouts, while the
    dashboard read 0. Now one definition (trainfeed.master.core.liveness: heard from within a lease
    timeout, not left) gives the page's, /status.json's and /metrics' figure: readers killed
    without a word are silent, and alive on none of them, as is a reader that closed."""
    lease_timeout_s = 4.0
    with MasterProcess(storage, extra_args=["--lease-timeout", str(lease_timeout_s)]) as master:
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "gone",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
        procs = [subprocess.Popen([sys.executable, str(WORKER), "--dataset", "flowers",
                                   "--batches", "2"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)
                 for _ in range(2)]
        try:
            for proc in procs:
                wait_paused(proc, 90)
            closed = dist.reader("flowers", source=MasterSource(master.address, "gone"))
            next(iter(closed.column_batches(5)))
            closed.close()  # LeaveJob
            assert alive_figures(master)[1] == 2  # the two paused readers heartbeat
            for proc in procs:
                proc.kill()  # no LeaveJob: their sessions go quiet
                proc.wait(10)
            deadline = time.monotonic() + 30 * lease_timeout_s
            while True:
                job = status_of(master, "gone")
                flags = [r["flags"] for r in job["readers"] if "left" not in r["flags"]]
                if len(flags) == 2 and all("silent" in f for f in flags):
                    break
                assert time.monotonic() < deadline, job["readers"]
                time.sleep(0.2)
            page, metric, page_after = alive_figures(master)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(10)
    # Silent readers (quiet past a lease timeout) are not alive, on the page as on /metrics.
    assert (page, metric, page_after) == (0, 0, 0)


def alive_figures(master: MasterProcess) -> tuple[int, float, int]:
    """The job's readers alive on /status.json, then on /metrics, then on /status.json again:
    the metric was read between the two."""
    before = status_of(master, "gone")["workers_alive"]
    metric = value(scrape(master), "trainfeed_workers_alive", job="gone")
    return before, metric, status_of(master, "gone")["workers_alive"]
