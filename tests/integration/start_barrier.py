"""A start barrier for processes a test starts together (issue 38).

Processes started at the same moment can be scheduled seconds apart on a loaded machine: beside
stress-ng one reader read a whole epoch before the other read its first batch, and ranks ended
their imports more than a lease timeout apart. Each child touches its `ready` file at the point
that must be reached together (holding a first batch, about to build its reader) and waits for
the shared `go` file; the test touches `go` once every child is ready.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

#: A child's own bound on its wait: the test's bound ends the wait sooner; this one ends an orphan.
GO_TIMEOUT_S = 600


def wait_for_go(ready: Path, go: Path) -> None:
    """In the child: says it is ready, then waits for the test's go."""
    ready.touch()
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit(f"{Path(sys.argv[0]).name}: {go} did not appear within {GO_TIMEOUT_S} s")
        time.sleep(0.01)


def release_when_ready(procs: list[subprocess.Popen[bytes]], flags: list[Path], go: Path,
                       timeout_s: float) -> None:
    """In the test: touches `go` once every child's flag exists; kills them all if one exits
    first or `timeout_s` (scaled to the load) passes."""
    # Here, not at the top: the children import this module from tests/integration alone.
    from machine_load import hang_bound

    try:
        deadline = time.monotonic() + hang_bound(timeout_s)
        while not all(flag.exists() for flag in flags):
            for p in procs:
                assert p.poll() is None, f"a child exited with {p.returncode} before it was ready"
            assert time.monotonic() < deadline, "the children were not all ready in time"
            time.sleep(0.01)
        go.touch()
    except BaseException:
        for p in procs:
            p.kill()
        raise
