"""Mutation testing of the pure core: each module against its own tests, one table.

    python tools/mutation.py                      # every module below
    python tools/mutation.py master/core/ledger.py   # one module (the path under trainfeed/)
    python tools/mutation.py --jobs 2 --survivors reader/resample.py

Why one module at a time: mutmut 3 runs, for each mutant, the tests that executed the mutated
function. With every module and every test in one run, a ledger mutant could be "killed" by an
integration test that happens to touch the ledger, which says nothing about the ledger's own
tests; and one run over everything is too long to repeat after each test change.

How: for each module, the repository's `trainfeed/`, `tests/` and `pyproject.toml` are copied
into `build/mutation/<module>/` (build/ is git-ignored); the copy's `[tool.mutmut]` table is the
repository's with `only_mutate` narrowed to the module and the test selection narrowed to the
module's tests (MODULES below); `mutmut run` runs there, from a fresh `mutants/` folder, so a
stale result never leaks into the table. mutmut puts `mutants/` first on `sys.path` and fails its
"forced fail" check if the tests import an unmutated copy (such as an editable install of another
checkout), so the figures are those of this checkout's code.

Columns: mutants generated; killed (a test failed) + timeout (the mutant hung the tests, e.g. a
loop that no longer ends: caught too); survived (everything else: the tests passed, or no test
ran the mutated code); score = (killed + timeout) / mutants. Surviving mutants are listed with
`--survivors`; read one with `cd build/mutation/<module> && mutmut show <name>`.

Only one small module runs in CI (`.ci/run`: preprocess/buffers.py with `--fail-under 90`, so
that the tool itself cannot stop working unnoticed); the others take minutes each. Run it before
resolving an issue that touches these modules and put the table in the note (docs/testing.md has
the latest).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "mutation"

# The ledger's own tests, and the fencing tokens' (pure ledgers too).
LEDGER_TESTS = ("tests/master/test_ledger*.py", "tests/master/test_fencing.py")
# Module (under trainfeed/) -> its own tests (globs under the repository root). The reader
# pipeline tests are resample.py's only end-to-end user, so they count as its tests too.
MODULES: dict[str, tuple[str, ...]] = {
    "master/core/ledger.py": ("tests/master/test_ledger*.py",),
    # The ledger's parts (issue 36 split its class by concern): the ledger's tests are theirs.
    **{f"master/core/ledger_{part}.py": LEDGER_TESTS
       for part in ("state", "fencing", "resume", "saved")},
    "master/core/stealing.py": ("tests/master/test_stealing.py",),
    "formats/listfile.py": ("tests/formats/test_listfile*.py",),
    "preprocess/buffers.py": ("tests/preprocess/test_buffer*.py",),
    "reader/resample.py": ("tests/reader/test_resample*.py", "tests/reader/test_pipeline.py"),
    # Pure too, configured for the next issue that touches them (not yet measured to 90 %).
    "planning/partitions.py": ("tests/planning/test_partitions.py",),
    "reader/position.py": ("tests/reader/test_reader_state.py", "tests/reader/test_position.py"),
    # The reader's lease book (issue 36): its own tests, and the sync quotas it keeps.
    "lease/book.py": ("tests/lease/test_lease_book*.py", "tests/lease/test_sync_cut.py",
                      "tests/master/test_sync_quota.py"),
    # The master's coordinator (issue 36), held to 90 % (docs/testing.md). Its two Hypothesis
    # machines (test_coordinator_model.py, ~20 s a run) run for every mutant they cover; the
    # table's figure is measured without them (`--tests`, the command in docs/testing.md).
    "master/core/coordinator.py": ("tests/master/test_coordinator*.py",
                                   "tests/master/test_fencing.py",
                                   "tests/master/test_sync_group.py",
                                   "tests/master/test_admission_holdings.py"),
    # Its progress within partitions (lease/progress.py), driven through the book as well.
    "lease/progress.py": ("tests/lease/test_lease_progress.py", "tests/lease/test_lease_book*.py",
                          "tests/lease/test_sync_cut.py", "tests/master/test_sync_quota.py"),
}
# What a bare `python tools/mutation.py` measures: the modules held to 90 % (docs/testing.md).
DEFAULT = ("master/core/ledger.py", "master/core/ledger_state.py", "master/core/ledger_fencing.py",
           "master/core/ledger_resume.py", "master/core/ledger_saved.py", "formats/listfile.py",
           "preprocess/buffers.py", "reader/resample.py", "master/core/coordinator.py")
KILLED = {1, 3}  # mutmut's exit codes for "a test failed" (3: pytest internal error)
TIMEOUT = {36, 24, -24, 152, 255}  # mutmut's exit codes for a timeout (36, or SIGXCPU)


@dataclass(frozen=True)
class Score:
    module: str
    mutants: int
    killed: int
    timeout: int
    survivors: tuple[str, ...]
    seconds: float

    @property
    def caught(self) -> int:
        return self.killed + self.timeout

    @property
    def score(self) -> float:
        return 100.0 * self.caught / self.mutants if self.mutants else 0.0


def test_paths(module: str, patterns: tuple[str, ...] | None = None) -> list[str]:
    """The module's test files that exist now (a glob may match none yet); `patterns` instead
    of MODULES' when given."""
    patterns = MODULES[module] if patterns is None else patterns
    return sorted({p for pattern in patterns for p in glob.glob(pattern, root_dir=ROOT)})


def mutmut_table(pyproject: str, module: str, tests: list[str]) -> str:
    """The repository's `[tool.mutmut]` table, narrowed to one module and its tests."""
    match = re.search(r"^\[tool\.mutmut\]\n(.*?)(?=^\[|\Z)", pyproject, re.S | re.M)
    if match is None:
        raise SystemExit("pyproject.toml has no [tool.mutmut] table")
    body = match.group(1)
    body = re.sub(r"^only_mutate\s*=\s*\[.*?\]\n", "", body, flags=re.S | re.M)
    body = re.sub(r"^pytest_add_cli_args_test_selection\s*=\s*\[.*?\]\n", "", body,
                  flags=re.S | re.M)
    return ("[tool.mutmut]\n" + body.rstrip() + "\n"
            + f"only_mutate = {json.dumps(['trainfeed/' + module])}\n"
            + f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n")


def prepare(module: str, tests: list[str]) -> Path:
    """A fresh copy of the tree for one module's run; returns its folder."""
    folder = WORK / module.replace("/", "__").removesuffix(".py")
    if folder.exists():
        shutil.rmtree(folder)
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache")
    for name in ("trainfeed", "tests"):
        shutil.copytree(ROOT / name, folder / name, ignore=ignore)
    text = (ROOT / "pyproject.toml").read_text()
    table = mutmut_table(text, module, tests)
    text = re.sub(r"^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", lambda _: table + "\n", text,
                  flags=re.S | re.M)
    (folder / "pyproject.toml").write_text(text)
    return folder


def run(module: str, jobs: int, patterns: tuple[str, ...] | None = None) -> Score:
    tests = test_paths(module, patterns)
    if not tests:
        raise SystemExit(f"{module}: no tests match {list(patterns or MODULES[module])}")
    folder = prepare(module, tests)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutants/ only
    mutmut = Path(sys.executable).with_name("mutmut")
    command = [str(mutmut) if mutmut.exists() else "mutmut", "run", "--max-children", str(jobs)]
    print(f"{module}: mutmut against {' '.join(tests)} (in {folder.relative_to(ROOT)})",
          flush=True)
    start = time.monotonic()
    log = folder / "mutmut.log"  # its progress spinner: a page of control characters
    with open(log, "wb") as out:
        done = subprocess.run(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    meta = folder / "mutants" / "trainfeed" / (module + ".meta")
    if done.returncode != 0 or not meta.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{tail}\n{module}: mutmut failed (exit {done.returncode}); its output "
                         f"is in {log}")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return Score(
        module=module, mutants=len(codes),
        killed=sum(c in KILLED for c in codes.values()),
        timeout=sum(c in TIMEOUT for c in codes.values()),
        survivors=tuple(sorted(k for k, c in codes.items() if c not in KILLED | TIMEOUT)),
        seconds=seconds)


def table(scores: list[Score]) -> str:
    lines = ["| module | mutants | killed + timeout | survived | score |",
             "|---|---:|---:|---:|---:|"]
    for s in scores:
        lines.append(f"| {s.module} | {s.mutants} | {s.caught} | {len(s.survivors)} | "
                     f"{s.score:.1f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE",
                        help=f"paths under trainfeed/, some of {list(MODULES)} (default: "
                             f"{list(DEFAULT)})")
    # One child by default: a shared machine; mutmut's own default is one per core.
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (1)")
    parser.add_argument("--survivors", action="store_true", help="list surviving mutants")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--tests", nargs="+", metavar="GLOB",
                        help="one module's tests instead of those MODULES names (a subset, or "
                             "to leave out a test that fails its clean run)")
    parser.add_argument("--fail-under", type=float, metavar="PERCENT",
                        help="exit 1 if a module scores below PERCENT (CI: the tool still works)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; expected some of {list(MODULES)}")
    if args.tests and len(args.modules) != 1:
        parser.error("--tests names the tests of exactly one MODULE")
    patterns = tuple(args.tests) if args.tests else None
    scores = [run(m, args.jobs, patterns) for m in (args.modules or DEFAULT)]
    print()
    print(table(scores))
    for s in scores:
        print(f"{s.module}: {s.seconds:.0f} s")
        if args.survivors:
            for name in s.survivors:
                print(f"  survived: {name}")
    if args.json:
        args.json.write_text(json.dumps([{
            "module": s.module, "mutants": s.mutants, "killed": s.killed, "timeout": s.timeout,
            "survived": len(s.survivors), "score": round(s.score, 1),
            "survivors": list(s.survivors)} for s in scores], indent=2) + "\n")
    low = [s for s in scores if args.fail_under is not None and s.score < args.fail_under]
    for s in low:
        print(f"{s.module}: {s.score:.1f} % is under --fail-under {args.fail_under:g} %; "
              f"list the survivors with --survivors", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
