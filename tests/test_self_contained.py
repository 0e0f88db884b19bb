"""A user clones this repository alone: nothing in it may name a folder outside it.

Benchmarks once ran a generator and baseline scripts from a reference folder users do not have,
and the docs told readers to look there; every figure must be reproducible from the clone.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The reference folder beside the repository on the developers' machines, by any spelling.
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b|\bshared/bench\b|/work/main\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file()
            and (ROOT / n).suffix not in {".png", ".jpg", ".parquet", ".whl"}]


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    offenders = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders)


def test_the_check_would_catch_the_old_generator_path() -> None:
    assert OUTSIDE.search('DEFAULT_GENERATOR = "/work/shared/bench/make_dataset.py"')
    assert OUTSIDE.search("started as in ../shared/SERVICES.md")
    assert not OUTSIDE.search("python benchmarks/make_dataset.py --out /tmp/x")
