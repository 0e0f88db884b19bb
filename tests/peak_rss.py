"""Run a command in a child process and measure its peak resident memory from outside."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_mb: float  # the child's peak RSS (its ru_maxrss, with any children it waited for)


# A small launcher between the test and the command: Linux carries a process's peak RSS across
# exec (signal->maxrss), and subprocess starts children with vfork, so a command started straight
# from a large pytest process reports pytest's own peak (989 MB was seen for every bomb test in
# one run). A child that the small launcher forks starts from the launcher's few MB instead.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def run_measured(command: Sequence[str], env: Mapping[str, str] | None = None,
                 timeout: float = 300.0, cwd: str | None = None) -> Measured:
    """Runs `command` to its end (killed after `timeout` s) and returns its output and peak RSS,
    the command's own ru_maxrss as its launcher's os.wait4 saw it (see _LAUNCHER)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        child = subprocess.Popen([sys.executable, "-c", _LAUNCHER, peak.name, *command],
                                 stdout=out, stderr=err, cwd=cwd, start_new_session=True,
                                 env=dict(env) if env is not None else None)
        try:
            returncode = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            returncode = child.wait()
        out.seek(0)
        err.seek(0)
        kib = peak.read().strip()
        return Measured(returncode, out.read().decode(errors="replace"),
                        err.read().decode(errors="replace"), int(kib) / 1024 if kib else 0.0)
