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


def test_ruff_passes_on_the_tree() -> None:
    result = run("ruff", "check", "trainfeed", "tests", "benchmarks", "proto")
    assert result.returncode == 0, result.stdout + result.stderr
