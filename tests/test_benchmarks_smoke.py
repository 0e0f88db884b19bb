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


# ~25 s on a loaded machine (16 small images generated, shrunk, uploaded twice, 2 windows of a
# few seconds). FFCV is hidden (CI does not install it: pyproject's ffcv-peer extra), so this is
# the path a fresh clone takes: the FFCV side is skipped, loudly, and the trainfeed side runs.
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ffcv_small_runs_without_ffcv_and_says_so(tmp_path: Path) -> None:
    hidden = tmp_path / "hide"
    (hidden / "ffcv").mkdir(parents=True)
    (hidden / "ffcv" / "__init__.py").write_text(
        "raise ImportError('hidden by tests/test_benchmarks_smoke.py')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/ffcv_small.py"), "run",
         "--images-in-dataset", "16", "--images", "32", "--warmup", "1", "--passes", "1",
         "--max-wait", "0", "--data", str(tmp_path / "data"),
         "--storage", str(tmp_path / "storage"), "--out", str(tmp_path / "out.jsonl")],
        cwd=ROOT, capture_output=True, text=True, timeout=170, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FFCV cannot be imported (hidden by" in result.stderr, result.stderr[-3000:]
    assert "SKIPPED" in result.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "trainfeed.cli.main", "upload", "--help"], cwd=ROOT,
        capture_output=True, text=True, timeout=60, env=env).stdout
    standin = "--max-side" not in help_text  # the real option once upload has it
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    header = records[0]["header"]
    assert header["methods_run"] == ["trainfeed-256", "trainfeed-256-rst", "trainfeed-256-raw"]
    assert "ffcv" in header["skipped"]
    rows = [r for r in records if "method" in r]
    assert sorted(r["method"] for r in rows) == ["trainfeed-256", "trainfeed-256-raw",
                                                 "trainfeed-256-rst"]
    assert all(r["images"] >= 32 and r["rate"] > 0 and r["standin"] == standin for r in rows)
    sizes = {d["method"]: d for d in header["datasets"]}
    assert sizes["(the photos)"]["files"] == 16
    # At most 256 px on the longer side, re-encoded at q90: smaller than the ~83 KB photos.
    assert 0 < sizes["trainfeed-256"]["bytes"] < sizes["(the photos)"]["bytes"]
    # The raw row stores pixels (3 bytes each), the JPEG rows JPEGs (--no-raw at 256 px).
    assert sizes["trainfeed-256-raw"]["bytes"] > 3 * sizes["trainfeed-256"]["bytes"]
    assert "--no-raw" in sizes["trainfeed-256"]["what"]
    lines = result.stdout.splitlines()
    assert any(line.startswith("| ffcv | skipped, FFCV cannot be imported") for line in lines)
    label = "trainfeed-256 (stand-in)" if standin else "trainfeed-256"
    assert any(line.startswith(f"| {label} | ") for line in lines), result.stdout
    assert any(line.startswith("| trainfeed-256 | ") and "trainfeed upload" in line
               for line in lines), result.stdout


# ~20 s on a loaded machine: a master, 6 real readers in 2 processes, a 10 s window in which
# 240 records at 60 records/s make two whole epochs (issue 28's real-reader measurement, small).
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_readers_prints_its_table_and_every_epoch_exactly_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/real_readers.py"), "--readers", "6",
         "--processes", "2", "--window", "10", "--records", "240", "--partitions", "24",
         "--rate", "10", "--storage", str(tmp_path / "storage"),
         "--json", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=220,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    # Its temporary folder (the reader processes' results) is gone with it.
    assert not list(tmp_path.glob("trainfeed-real-readers-*"))
    lines = result.stdout.splitlines()
    assert any(line.startswith("| readers | window | master CPU |") for line in lines), \
        result.stdout
    assert any(line.startswith("| 6 | 10 s |") and line.endswith("| yes |") for line in lines), \
        result.stdout
    assert "exactly once: yes" in lines, result.stdout
    written = json.loads((tmp_path / "out.json").read_text())
    complete = [e for e in written["epochs"] if e["complete"]]
    assert complete, written["epochs"]  # at least one whole epoch, each record once
    assert all(e["delivered"] == e["distinct"] == 240 for e in complete), complete
    assert all(e["duplicated"] == 0 for e in written["epochs"])
    # (Grants come as GetTasks calls, or asked on the Session streams: no call then.)
    assert written["calls_per_s"].get("GetTasks", 0) + written["stream_messages_per_s"].get(
        "grants", 0) > 0 and written["master_cores"] > 0
    assert not written["errors"] and not written["stuck"]


# ~10 s: a master, 10 Session streams, 2 s per mode.
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stream_messages_prints_the_cost_per_message_in_both_modes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/stream_messages.py"), "--sessions", "10",
         "--window", "2", "--records", "200", "--partitions", "20",
         "--storage", str(tmp_path / "storage")],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith(("| spread |", "| aligned |"))}
    assert set(rows) == {"spread", "aligned"}, result.stdout
    for row in rows.values():  # some messages arrived, and the master's CPU was measured
        messages_per_s = float(row.split("|")[2])
        assert messages_per_s > 0 and row.rstrip("| ").endswith("ms"), row


# ~20 s on a loaded machine (24 photos generated and uploaded with --max-side 256, then one
# window of each variant, each in a process of its own, a decoder started for the second).
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_decode_in_processes_measures_both_variants_on_the_same_images(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/decode_in_processes.py"), "--make", "24",
         "--workdir", str(tmp_path), "--images", "48", "--warmup", "8", "--rounds", "1",
         "--variants", "threads", "processes:1x1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| variant | images/s median"), result.stdout
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["threads", "processes:1x1"]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    for row in rows.values():
        assert row["images"] >= 48, row  # whole batches of 256 at most: one epoch and more
        assert row["cores_busy"] > 0 and row["cpu_ms_per_image"] > 0, row
    assert rows["threads"]["decoder_cores"] == 0  # no decoder: the trainer decodes
    assert rows["processes:1x1"]["decoder_ms_per_image"] > 0  # the decoder did
    refused = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/decode_in_processes.py"), "--make", "1",
         "--variants", "processes:0x1"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert refused.returncode == 2 and "processes:NxT" in refused.stderr


# ~20 s on an idle core (24 photos made and uploaded, then four short windows, each in a process
# of its own).
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reader_bounds_measures_each_variant_on_the_same_images(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    variants = ["shipped", "one-load-thread", "bare-decode", "no-decode+one-load-thread"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/reader_bounds.py"), "--make", "24",
         "--workdir", str(tmp_path), "--images", "48", "--warmup", "8", "--rounds", "1",
         "--variants", *variants, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| variant | images/s median"), result.stdout
    assert [line.split("|")[1].strip() for line in lines[2:]] == variants
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    for row in rows.values():
        assert row["images"] >= 48, row
        assert row["cores_busy"] > 0 and row["cpu_ms_per_image"] > 0, row
    refused = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/reader_bounds.py"), "--make", "1",
         "--variants", "bare-decode+no-decode"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert refused.returncode == 2 and "exclude each other" in refused.stderr


def test_gather_cost_times_each_step_of_a_shuffled_pass_s_reordering() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gather_cost.py"), "--rows", "8",
         "--partitions", "3", "--value-bytes", "5000", "--repeats", "2", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    steps = ["partition permutation", "window permutation", "values for the decoder"]
    assert list(figures) == [*steps, "all three"]
    assert all(figures[step] > 0 for step in steps)
    assert figures["all three"] == pytest.approx(sum(figures[s] for s in steps), abs=0.002)


def test_wake_latency_times_hand_offs_on_one_core_and_across_two() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/wake_latency.py"), "--trips", "200",
         "--rounds", "1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    cores = len(os.sched_getaffinity(0))
    assert list(figures) == ["one core", "two cores"][:min(2, cores)]
    assert all(us > 0 for us in figures.values())
    table = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/wake_latency.py"), "--trips", "50",
         "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert table.stdout.startswith("| threads on | µs per hand-off (median) |"), table.stdout
