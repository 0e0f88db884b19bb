"""The suite's own rules, checked on its source (issue 27 §6):

- optional frameworks go through tests/optional.py:`require`, which fails under CI=true instead
  of skipping; a direct `pytest.importorskip` would skip silently in CI;
- a fixture is defined once (in the nearest shared conftest.py), not copied into each module,
  unless its copies mean different things and are listed in ALLOWED_DUPLICATES with why.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: Fixture names defined in more than one module on purpose: same name, different data.
ALLOWED_DUPLICATES = {
    "storage": "per-module datasets of different sizes/row groups (integration/conftest.py: 100 "
               "records in 10s; reader modules: 8-row groups, 24 'pets', 250-row groups, builtin)",
    "dataset": "each module uploads its own record count and row-group size, and returns a "
               "different tuple (storage, manifest[, source])",
    "master": "each module starts the master with its own options (--lease-timeout, rows)",
    "table": "different PostgreSQL tables (columns and rows) per module",
    "state_url": "etcd with a fixed prefix vs parametrised sqlite/etcd (test_chaos)",
    "source": "a JPEG list for GlusterFS vs one encoded JPEG per sampling",
    "photos": "different photo sizes and counts per module (ROI vs jitter)",
    "no_cluster": "test_kube.py also sets HOME and drops KUBERNETES_SERVICE_PORT; "
                  "test_status_command.py drops TRAINFEED_STORAGE",
}


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture"
            and isinstance(target.value, ast.Name) and target.value.id == "pytest")


def fixture_definitions(paths: list[Path]) -> dict[str, list[str]]:
    """Fixture name -> "file:line" of each `@pytest.fixture` definition (not in string literals)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    _is_fixture(d) for d in node.decorator_list):
                found[node.name].append(f"{path.relative_to(TESTS)}:{node.lineno}")
    return found


def importorskip_calls(paths: list[Path]) -> list[str]:
    calls = []
    for path in paths:
        if path == TESTS / "optional.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "importorskip":
                calls.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    return calls


def test_optional_imports_go_through_require() -> None:
    calls = importorskip_calls(_modules())
    assert not calls, (
        f"pytest.importorskip at {calls} skips silently under CI=true: use "
        "`from optional import require` and `require(module)` instead")


def test_each_fixture_is_defined_once() -> None:
    copies = {name: where for name, where in fixture_definitions(_modules()).items()
              if len(where) > 1 and name not in ALLOWED_DUPLICATES}
    assert not copies, (
        f"fixtures defined in several modules: {copies}. Define each once in the nearest shared "
        "conftest.py, rename copies that mean different things, or list the name in "
        "tests/test_suite_hygiene.py:ALLOWED_DUPLICATES with the reason")


def test_allowed_duplicates_are_still_duplicated() -> None:
    """An allow-list entry with one definition left hides nothing and should go."""
    definitions = fixture_definitions(_modules())
    stale = [name for name in ALLOWED_DUPLICATES if len(definitions.get(name, [])) < 2]
    assert not stale, f"remove {stale} from ALLOWED_DUPLICATES: defined once now"
