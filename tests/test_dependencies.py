"""Every import is declared: deptry on the package, and on the tests and benchmarks.

A user's `pip install trainfeed` gets only what pyproject.toml declares. An import that works on a
developer's machine because something was installed by hand (simplejpeg once was: every published
decode figure was 4-6x what a user got) must fail here, in CI's fresh virtual environment.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from machine_load import hang_bound

ROOT = Path(__file__).resolve().parent.parent

# tests/ and benchmarks/ import each other's modules by file name (pytest's rootdir insertion,
# a script's own folder), so each folder is a root of its own for deptry.
SCRIPT_ROOTS = ("tests", "tests/integration", "tests/ingest", "tests/lease", "tests/master",
                "tests/reader", "tests/security", "benchmarks")


def deptry(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deptry", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=hang_bound(300))


def test_the_package_imports_only_what_it_declares() -> None:
    """Missing (DEP001), unused (DEP002), transitive (DEP003) and test-only (DEP004) imports in
    trainfeed/ against the core dependencies and the user-facing extras."""
    result = deptry("trainfeed")
    assert result.returncode == 0, result.stdout + result.stderr


def test_tests_and_benchmarks_import_only_what_is_declared() -> None:
    """Every extra counts here (the test and bench extras included); "unused" is the package
    run's business, since the tests use the package's dependencies through it."""
    result = deptry(*SCRIPT_ROOTS, "--optional-dependencies-dev-groups", "",
                    "--exclude", r"(^|/)\.?venv/", "--known-first-party", "trainfeed",
                    "--ignore", "DEP002")
    assert result.returncode == 0, result.stdout + result.stderr


def test_deptry_catches_an_undeclared_import(tmp_path: Path) -> None:
    """The check can fail: a package importing a module nobody declared is refused."""
    package = tmp_path / "pkg"
    package.mkdir()
    # six: installed here only as another package's dependency (transitive, DEP003);
    # not_a_declared_module: installed nowhere (missing, DEP001).
    (package / "__init__.py").write_text("import numpy\nimport simplejpeg\nimport six\n"
                                         "import not_a_declared_module\n")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "pkg"
        version = "0"
        dependencies = ["numpy", "simplejpeg"]
        """))
    result = deptry("pkg", "--no-ansi", cwd=tmp_path)
    assert result.returncode != 0
    report = result.stdout + result.stderr
    assert "DEP003 'six'" in report, report
    assert "DEP001 'not_a_declared_module'" in report, report
