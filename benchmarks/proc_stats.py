"""Small measuring helpers shared by the benchmark scripts (run as `python benchmarks/X.py`, so
this folder is on sys.path)."""
from __future__ import annotations

import os


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process, from /proc (10 ms resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
