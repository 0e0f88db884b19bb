"""Type hints and lint are part of the build: mypy on the package, ruff on the whole tree."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_mypy_passes_on_the_package() -> None:
    result = run("mypy", "trainfeed")
    assert result.returncode == 0, result.stdout + result.stderr


# `mypy --strict` holds on these (issue 36): the pure and low layers every reader runs. The rest
# of lease/ is strict too but for the two files below, which are being split (Load and the
# reader's meter leave them); add each here once it is clean rather than widening the list.
STRICT_PACKAGES = ("trainfeed/planning", "trainfeed/io", "trainfeed/decode")
STRICT_LEASE_EXCEPT = ("session.py", "reader_stats.py")


def strict_paths() -> list[str]:
    """The paths held to `--strict`: the packages above and every lease/ module but the two."""
    lease = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "trainfeed/lease").glob("*.py")
                   if p.name not in STRICT_LEASE_EXCEPT)
    return [*STRICT_PACKAGES, *lease]


@pytest.mark.slow
def test_mypy_strict_passes_on_the_typed_layers() -> None:
    """--follow-imports=silent: the modules these import are read for their types but their own
    errors are not reported (they are not held to --strict yet); ~12 s with a cold cache on the
    shared 2-core machine, under 1 s warm (.mypy_cache, git-ignored)."""
    paths = strict_paths()
    assert "trainfeed/lease/book.py" in paths and "trainfeed/lease/session.py" not in paths
    result = run("mypy", "--strict", "--follow-imports=silent", *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_passes_on_the_tree() -> None:
    result = run("ruff", "check", "trainfeed", "tests", "benchmarks", "proto")
    assert result.returncode == 0, result.stdout + result.stderr
