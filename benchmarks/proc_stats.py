"""Small measuring helpers shared by the benchmark scripts (run as `python benchmarks/X.py`, so
this folder is on sys.path)."""
from __future__ import annotations

import os
import urllib.request


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process, from /proc (10 ms resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rpc_counts(url: str | None) -> dict[str, float]:
    """trainfeed_rpc_duration_seconds_count by method, from the master's metrics."""
    if url is None:
        return {}
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("trainfeed_rpc_duration_seconds_count{"):
            method = line.split('method="', 1)[1].split('"', 1)[0].rsplit("/", 1)[-1]
            counts[method] = float(line.rsplit(" ", 1)[1])
    return counts
