"""The etcd benchmarks run end to end at their smallest settings against a real etcd:
benchmarks/etcd_ceiling.py, and master_load.py's etcd row with etcd's own counters (read from
its /metrics), which docs/figures/etcdjournal.md quotes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


def run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.timeout(120)
def test_etcd_ceiling_prints_a_row_per_batch_size(etcd_url: str, tmp_path: Path) -> None:
    result = run(["benchmarks/etcd_ceiling.py", "--etcd", urlsplit(etcd_url).netloc,
                  "--calls", "1", "3", "--seconds", "0.3",
                  "--json", str(tmp_path / "out.json")], 100)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "3"], result.stdout
    written = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [r["calls_per_txn"] for r in written] == [1, 3]
    assert all(r["txns"] > 0 and r["calls_per_s"] == pytest.approx(
        r["txns_per_s"] * r["calls_per_txn"]) for r in written)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_master_load_reports_etcds_txns_for_an_etcd_row(etcd_url: str, tmp_path: Path) -> None:
    result = run(["benchmarks/master_load.py", "--backends", "etcd", "--partitions", "20",
                  "--workers", "4", "--clients", "1", "--duration", "1", "--no-baseline",
                  "--etcd", urlsplit(etcd_url).netloc, "--storage", str(tmp_path / "storage"),
                  "--state-dir", str(tmp_path / "state"), "--json", str(tmp_path / "out.json")],
                 220)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"etcd: [\d,]+ txns/s, [\d.]+ calls per txn, WAL fsync [\d.]+ ms",
                     result.stderr), result.stderr[-3000:]
    row = json.loads((tmp_path / "out.json").read_text())["results"][0]
    assert row["backend"] == "etcd" and row["round_trips"] > 0
    assert row["etcd_per_s"]["txns"] > 0 and row["etcd_per_s"]["puts"] > 0
