"""An upload in several processes keeps within the memory docs/architecture.md states (issue 30 §2).

Measured from outside: the proportional set size (PSS: shared pages split between the processes
sharing them, so forked packers are not counted twice) of the upload's whole process tree,
sampled every 20 ms from /proc, at its peak, minus the same for an upload of two small files
(the interpreters, their imports and forks: what every upload costs whatever its data)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
PROCESSES = 2
# What docs/architecture.md states per packing process, and for the files read ahead (shared).
PER_PROCESS_MIB = 170
RECORD_BYTES = 3 << 19  # 1.5 MiB per file: 3 shards of 64 MiB for 120 files


def tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, ()))
    return found


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                match = re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M)
        except OSError:
            continue
        if match:
            total += int(match.group(1))
    return total / 1024


def peak_pss(command: list[str]) -> float:
    """The peak PSS of `command`'s process tree, in MiB (it must succeed)."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0.0
    deadline = time.monotonic() + 300
    try:
        while child.poll() is None and time.monotonic() < deadline:
            peak = max(peak, pss_mib(tree(child.pid)))
            time.sleep(0.02)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0, err.decode()
    return peak


def files(folder: Path, count: int, size: int) -> Path:
    (folder / "data").mkdir(parents=True)
    lines = []
    for i in range(count):
        (folder / f"data/{i}.bin").write_bytes(os.urandom(size))
        lines.append(f"data/{i}.bin\tx\n")
    listing = folder / "files.list"
    listing.write_text("".join(lines))
    return listing


def upload_command(listing: Path, storage: Path) -> list[str]:
    return [sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing), "--dataset", "d",
            "--storage", str(storage), "--no-progress", "--processes", str(PROCESSES)]


def test_the_docs_state_the_bound() -> None:
    text = " ".join(ARCHITECTURE.read_text(encoding="utf-8").split())
    assert f"about {PER_PROCESS_MIB} MiB per packing process" in text


@pytest.mark.slow
def test_a_parallel_upload_stays_within_the_stated_bound(tmp_path: Path) -> None:
    big = files(tmp_path / "big", 120, RECORD_BYTES)
    small = files(tmp_path / "small", 2, 1000)
    base = peak_pss(upload_command(small, tmp_path / "s1"))
    peak = peak_pss(upload_command(big, tmp_path / "s2"))
    shards = list((tmp_path / "s2/d").rglob("shard-*.parquet"))
    assert len(shards) == 3  # several shards, packed by both processes
    stated = PROCESSES * PER_PROCESS_MIB + 2 * RECORD_BYTES / 2**20
    print(f"upload of 120 x 1.5 MiB on {PROCESSES} processes: peak PSS {peak:.0f} MiB, "
          f"{base:.0f} MiB for 2 small files: +{peak - base:.0f} MiB (stated: at most "
          f"{stated:.0f})")
    assert peak - base <= stated
