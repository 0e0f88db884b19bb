"""Run a command in a child process and measure its peak resident memory from outside."""
from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_mb: float  # the child's peak RSS (its ru_maxrss, with any children it waited for)


def run_measured(command: Sequence[str], env: Mapping[str, str] | None = None,
                 timeout: float = 300.0, cwd: str | None = None) -> Measured:
    """Runs `command` to its end (killed after `timeout` s) and returns its output and peak RSS,
    taken from os.wait4 on that very child: RUSAGE_CHILDREN would be the maximum over every
    child this test process ever waited for."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, cwd=cwd,
                                 env=dict(env) if env is not None else None)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.05)
        child.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
        out.seek(0)
        err.seek(0)
        return Measured(child.returncode, out.read().decode(errors="replace"),
                        err.read().decode(errors="replace"), usage.ru_maxrss / 1024)
