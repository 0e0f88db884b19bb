"""benchmarks/upload_throughput.py --compare PATH runs each trainfeed method with a second
checkout too, next to this one's in every pass, the other first in odd passes (issue 30 §2:
main and a branch measured under the same load), and each with its own tree's trainfeed."""
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
def test_compare_runs_the_other_checkouts_upload_interleaved(tmp_path: Path) -> None:
    other = tmp_path / "other-tree"
    other.mkdir()
    (other / "trainfeed").symlink_to(ROOT / "trainfeed")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/upload_throughput.py"), "--images", "8",
         "--passes", "2", "--methods", "cp", "upload", "--root", str(tmp_path / "data"),
         "--compare", str(other), "--json", str(tmp_path / "out.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=170,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((tmp_path / "out.json").read_text())
    order = [(r["pass"], r["method"]) for r in written["rows"]]
    assert order == [(0, "cp"), (0, "upload"), (0, "upload@other-tree"),
                     (1, "cp"), (1, "upload@other-tree"), (1, "upload")]
    trees = {r["method"]: r["tree"] for r in written["rows"]}
    assert trees["upload"] == str(ROOT) and trees["upload@other-tree"] == str(other)
    summary = {s["method"]: s for s in written["summary"]}
    other_tree = summary["upload@other-tree"]  # a ratio from fair passes only (fairness.py)
    assert (other_tree["vs_cp"] or 1) > 0 and len(other_tree["vs_cp_passes"]) == 2
    assert summary["upload@other-tree"]["cpu_seconds"] > 0
    # User-space CPU apart (the kernel's share moves most on a shared machine).
    assert 0 < summary["upload"]["user_ms_per_image"] * 8 / 1000 <= summary["upload"][
        "cpu_seconds"] + 0.01
    assert "| user ms/image |" in result.stdout.strip().splitlines()[1]  # (0: warm or cold)
