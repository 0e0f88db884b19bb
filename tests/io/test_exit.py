"""A process that exits with a pass still open (a reader never closed, an epoch abandoned
mid-way) stops and joins its prefetch threads before the interpreter finalizes: a daemon thread
killed inside a native read makes C++ code call std::terminate, and a training script that had
finished aborts with SIGABRT ("terminate called without an active exception")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, threading, sys

def report():  # registered before trainfeed's hook, so it runs after it (atexit is LIFO)
    alive = [t.name for t in threading.enumerate()
             if t.name.startswith("trainfeed-") and t.is_alive()]
    print("ALIVE", alive, flush=True)

atexit.register(report)

from trainfeed import LocalSource, dist

reader = dist.reader("flowers", source=LocalSource(storage=sys.argv[1], prefetch_partitions=2))
batches = reader.column_batches(4)
next(batches)  # the pass stays open: its producer waits for credits, or reads ahead
print("READ", flush=True)
"""


def test_an_open_pass_is_stopped_before_the_interpreter_exits(storage: str) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT, storage], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "READ" in result.stdout
    [alive] = [line for line in result.stdout.splitlines() if line.startswith("ALIVE")]
    assert alive == "ALIVE []", (alive, result.stderr[-2000:])
