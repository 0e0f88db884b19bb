"""benchmarks/reader_threads.py's per-thread context switches (issue 39): read in a process of
its own, since the module wraps `threading.Thread.run` when imported."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# A thread that sleeps 50 times between two snapshots: 50 voluntary switches at least.
PROBE = """
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from reader_threads import thread_switches
start, slept, finish = threading.Event(), threading.Event(), threading.Event()
def sleeper():
    start.wait()
    for _ in range(50):
        time.sleep(0.002)
    slept.set()
    finish.wait()
worker = threading.Thread(target=sleeper)
worker.start()
time.sleep(0.2)
before = thread_switches()
start.set(); slept.wait()
during = thread_switches()
finish.set(); worker.join()
# join() returns before the OS thread has quite exited: its /proc entry goes within moments.
for _ in range(500):
    if worker.native_id not in thread_switches():
        break
    time.sleep(0.01)
print(json.dumps({"before": before[worker.native_id], "during": during[worker.native_id],
                  "ended": thread_switches().get(worker.native_id)}))
"""


def test_thread_switches_counts_a_threads_sleeps_and_only_live_threads() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(BENCHMARKS)], capture_output=True,
                         text=True, timeout=120, check=True)
    seen = json.loads(out.stdout)
    assert seen["during"][0] - seen["before"][0] >= 50  # voluntary: each sleep
    assert seen["during"][1] >= seen["before"][1] >= 0  # involuntary: never fewer
    assert seen["ended"] is None  # /proc/self/task lists live threads only
