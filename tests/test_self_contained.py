"""A user clones this repository alone: nothing in it may name a folder outside it.

Benchmarks once ran a generator and baseline scripts from a reference folder that sat beside the
repository on the developers' machines, and the docs told readers to look there; every figure
must be reproducible from the clone. What counts as "outside" is read from the machine the test
runs on: the folders beside the repository (by `../NAME` or by absolute path) and the
repository's own absolute path (a clone's location baked into a file), and any absolute path into
a virtual environment (`/…/.venv-ci/bin`: a developer's checkout, which CI's clone elsewhere
would not see as its own path).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def outside_pattern(root: Path) -> re.Pattern[str]:
    """Mentions of the folders beside `root`, and of `root`'s own absolute path."""
    parent = root.parent
    # (Names of one or two characters are left out: a folder `x` beside a clone in /tmp would
    # make every `../x` of an example, such as a job name the master refuses, an offender.)
    siblings = sorted(p.name for p in parent.iterdir()
                      if p.is_dir() and p != root and len(p.name) > 2)
    alternatives = [re.escape(str(root)) + r"\b", r"(?<![\w.$})])/(?:[\w.+-]+/)+\.venv[\w-]*/"]
    if siblings:
        names = "|".join(re.escape(name) for name in siblings)
        alternatives.append(rf"(?:\.\./|{re.escape(str(parent))}/)(?:{names})\b")
    return re.compile("|".join(alternatives))


def tracked_text_files(root: Path = ROOT) -> list[Path]:
    """Every tracked file under `root` but images, Parquet and wheels. Names come NUL-separated
    (`-z`): split on white space, a name with a space in it was never read (a stray file named
    `arm the page cache#`, naming /tmp, was committed and not looked at, 2026-11-30)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    return [root / n for n in names if n and (root / n).is_file()
            and (root / n).suffix not in {".png", ".jpg", ".parquet", ".whl"}]


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    outside = outside_pattern(ROOT)
    offenders = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if outside.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders)


def test_the_check_catches_a_sibling_folder_and_the_clones_own_path(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "refs").mkdir()
    (tmp_path / "x").mkdir()
    outside = outside_pattern(tmp_path / "repo")
    assert outside.search("python ../refs/make_dataset.py")
    assert outside.search(f'GENERATOR = "{tmp_path}/refs/make_dataset.py"')
    assert outside.search(f"cd {tmp_path}/repo && run")
    venv = ".venv" + "-ci"  # spelt apart: this file is itself checked
    assert outside.search(f"export PATH=/home/dev/trainfeed/{venv}/bin:$PATH")
    assert not outside.search("export PATH=$PWD/.venv-ci/bin:$PATH")
    assert not outside.search("python benchmarks/make_dataset.py --out DIR")
    assert not outside.search("see [deploy/k8s](../deploy/k8s)")
    assert not outside.search("a job named `../x` is refused")  # (a sibling `x` is too generic)


def test_a_tracked_file_with_spaces_in_its_name_is_read(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a stray file#").write_text("x\n")
    (tmp_path / "plain.txt").write_text("y\n")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    assert sorted(p.name for p in tracked_text_files(tmp_path)) == ["a stray file#", "plain.txt"]
