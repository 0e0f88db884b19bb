"""A benchmark stopped by SIGTERM or SIGINT stops the servers it started and removes their data
(benchmarks/stop_cleanly.py). Before, `pack_throughput.py --rows 1000000` stopped by SIGTERM
left its private PostgreSQL running with 7.9 GB in a temp folder.

The benchmark runs for real, in a subprocess whose TMPDIR is the test's own folder, so every
temp folder it makes (its work folder, the PostgreSQL cluster's) is seen, and is signalled once
its PostgreSQL says "ready" in postmaster.pid."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "pack_throughput.py"
START_TIMEOUT_S = 120.0


def _ready_postmaster(tmp: Path) -> int | None:
    """The PID of the benchmark's postmaster once it is ready for connections, else None."""
    for pid_file in tmp.glob("trainfeed-pg-*/data/postmaster.pid"):
        try:
            lines = pid_file.read_text().splitlines()
        except OSError:
            continue
        # postmaster.pid: line 1 the PID, line 8 the status ("ready" once it accepts work).
        if len(lines) >= 8 and lines[7].strip() == "ready":
            return int(lines[0])
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, its orphan not yet reaped by init) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by the postgres user
        pass
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether `pid` has ended within `seconds`: a stopped postmaster's exit, and its
    backends', lag the benchmark's own by a moment when the machine is loaded."""
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_benchmark_leaves_no_server_and_no_data(signum: int) -> None:
    # Not under pytest's tmp_path (mode 0700 up the tree): as root, the benchmark hands the
    # cluster's folder to the postgres user, who must be able to reach it.
    tmp = Path(tempfile.mkdtemp(prefix="tf-stop-"))
    os.chmod(tmp, 0o755)
    try:
        _stop_and_check(tmp, signum)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_and_check(tmp: Path, signum: int) -> None:
    proc = subprocess.Popen([sys.executable, str(BENCHMARK), "--source", "postgresql",
                             "--rows", "20000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    postmaster: int | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while postmaster is None:
            assert proc.poll() is None, f"the benchmark ended first: {proc.communicate()[0]}"
            assert time.monotonic() < deadline, "its PostgreSQL was not ready within 120 s"
            time.sleep(0.1)
            postmaster = _ready_postmaster(tmp)
        assert _alive(postmaster)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    try:
        assert _gone_within(postmaster, 5.0), (
            f"PostgreSQL (pid {postmaster}) outlived the benchmark by 5 s")
    finally:
        if _alive(postmaster):  # the test's own leak: its backends follow the postmaster
            os.kill(postmaster, signal.SIGKILL)
    assert list(tmp.iterdir()) == [], "temp data left behind"
    assert proc.returncode != 0, output  # stopped, not finished
    assert f"{signal.Signals(signum).name}: stopping the servers" in output
