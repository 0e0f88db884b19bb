"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml), as .ci/run does, so
`python3 -m pytest -q` alone catches a broken reference too: a page naming a module that is gone,
a docstring griffe cannot parse, a link to a missing page, anchor or repository file."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from machine_load import hang_bound
from optional import require

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the site whose mkdocs.yml is in `root`, into `site`."""
    require("mkdocs")
    require("mkdocstrings_handlers.python")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=root, capture_output=True, text=True,
                          timeout=hang_bound(300))


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    reference = (tmp_path / "site" / "api" / "errors" / "index.html").read_text()
    assert "TrainfeedError" in reference  # the reference was rendered, not left empty
    usage = (tmp_path / "site" / "api" / "cli" / "index.html").read_text()
    assert "trainfeed upload" in usage and "--jpeg-restarts" in usage  # the parser's help


@pytest.mark.slow
def test_a_broken_reference_fails_the_build(tmp_path: Path) -> None:
    """The check can fail: a page referencing a module that does not exist, in a copy of the
    site's configuration, stops the build."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n::: trainfeed.no_such_module\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config[:config.index("\nhooks:")] + "\n" + config[config.index("\nplugins:"):]
    config = config[:config.index("\nnav:")] + "\n"  # one page, no hook, no nav
    config = config.replace("paths: [.]", f"paths: [{ROOT}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "trainfeed.no_such_module" in result.stderr, result.stderr[-3000:]
