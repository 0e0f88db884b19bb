"""benchmarks/upload_throughput.py runs end to end at its smallest settings (its figures are
quoted in docs/benchmarks.md, "Ingest (upload)": the script must not rot between the runs that
refresh them)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_upload_throughput_prints_its_table_and_writes_its_json(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/upload_throughput.py"), "--images", "12",
         "--passes", "1", "--methods", "cp", "upload", "restarts", "--root", str(tmp_path),
         "--json", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    # (A line above the table says whether the source was warm in the page cache: --cache.)
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "source warm in the page cache before each run:", result.stdout
    assert lines[1].startswith("| method | s | images/s |"), result.stdout
    assert [line.split("|")[1].strip() for line in lines[3:]] == ["cp", "upload", "restarts"]
    written = json.loads((tmp_path / "out.json").read_text())
    summary = {s["method"]: s for s in written["summary"]}
    assert summary["cp"]["vs_cp"] == 1.0
    # The ratio counts only from a fair pass (benchmarks/fairness.py): a number, or "not
    # comparable (why)" on a loaded machine; every pass's ratio and loads are in the JSON.
    upload = summary["upload"]
    assert (upload["vs_cp"] is not None and upload["vs_cp"] > 0) or \
        upload["vs_cp_text"].startswith("not comparable ("), upload
    assert upload["vs_cp_passes"][0]["ratio"] > 0
    assert 0 < upload["vs_cp_passes"][0]["sides"][1]["cores_busy"] <= (os.cpu_count() or 1) + 0.2
    assert summary["upload"]["cpu_seconds"] > 0  # the packers' CPU is counted (forked children)
    assert written["images"] == 12 and len(written["rows"]) == 3
