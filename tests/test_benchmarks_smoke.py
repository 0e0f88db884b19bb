"""Benchmark scripts run end to end at their smallest settings, as a user runs them: a script
whose figures are quoted in the docs must not rot between the runs that refresh them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# ~3 s on an idle core (16 small images generated, uploaded twice, 4 passes read); the limit
# leaves room for a loaded machine.
@pytest.mark.timeout(90)
def test_restarts_by_size_prints_its_table_and_writes_its_json(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/restarts_by_size.py"), "--sizes", "256",
         "--images", "16", "--passes", "1", "--min-cpu", "0.05", "--data", str(tmp_path / "data"),
         "--storage", str(tmp_path / "storage"), "--json", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=80,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| longer side | mean size (w×h) |"), result.stdout
    row = next(line for line in lines if line.startswith("| 256 px |"))
    plain_ms, restarts_ms, ratio = (float(cell.strip().rstrip("x")) for cell in
                                    row.split("|")[4:7])
    assert plain_ms > 0 and restarts_ms > 0
    assert ratio == pytest.approx(plain_ms / restarts_ms, abs=0.01)
    assert any("crossover" in line or "at every size" in line for line in lines), result.stdout
    written = json.loads((tmp_path / "out.json").read_text())
    # One measurement of each upload, of the same whole passes: every image once per pass.
    rows = sorted(written["rows"], key=lambda r: r["upload"])
    assert [r["upload"] for r in rows] == ["plain", "restarts"]
    assert rows[0]["epochs"] == rows[1]["epochs"] >= 1
    assert all(r["images"] == 16 * r["epochs"] for r in rows)
    assert written["data"]["256"]["long_side"] == 256
