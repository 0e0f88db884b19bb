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

#: Fixtures defined in more than one module on purpose: name -> {module: why its copy differs}.
#: A name may have one definition that is not listed (the shared one, in a conftest.py); every
#: other definition must be listed here with what makes its data different, so a new copy of a
#: shared fixture fails test_each_fixture_is_defined_once instead of hiding behind the name.
ALLOWED_DUPLICATES: dict[str, dict[str, str]] = {
    # Shared: tests/conftest.py, "flowers" (100 JPEGs) in row groups of 8.
    "storage": {
        "integration/conftest.py": "row groups of 10: the master plans 10 partitions of 10, "
                                   "which the integration tests count",
        "reader/test_label_ids.py": "version 1 of 'ds': 4-pixel images of boat, cat and dog, "
                                    "to append a label to",
        "reader/test_pipeline.py": "120 records whose source images the tests decode to compare",
        "reader/test_resume.py": "module-scoped: 100 JPEGs plus a packed dataset, with a map "
                                 "from each image's sha256 to its record id",
        "reader/test_small_dataset_partitions.py": "the issue's 2,000 records in 8 row groups",
        "reader/test_sync.py": "500 text records in row groups of 20, module-scoped",
        "reader/test_torch_device.py": "24 'pets' of 40x40 pixels, to crop and resize",
        "reader/test_transforms.py": "64 records",
    },
    "dataset": {
        "integration/test_master_stalls.py": "N records in row groups of ROWS; (storage, source)",
        "integration/test_multiprocess.py": "38 partitions of 8 rows; (storage, source)",
        "integration/test_sliced_partitions.py": "3 row groups of 200, sliced into 64 "
                                                 "partitions; (storage, source)",
    },
    "master": {
        "integration/test_cut_short_pass.py": "a master with its defaults",
        "integration/test_master_watch.py": "8 one-record partitions, --lease-timeout 1",
        "integration/test_push_watch.py": "64 records in row groups of 8, the defaults",
        "integration/test_no_silent_waits.py": "--lease-timeout 12",
        "integration/test_sync_groups.py": "over the module's text rows, --lease-timeout LEASE_S",
        "reader/test_resume.py": "module-scoped, over the module's storage tuple",
    },
    "table": {
        "integration/test_sql_postgres.py": "ids, names with NULLs, scores, awkward column names",
        "integration/test_sql_secrets.py": "200 (id, value) rows",
    },
    "state_url": {
        "integration/test_chaos.py": "parametrised: SQLite or etcd with a fresh prefix",
        "master/stores/test_etcd.py": "etcd with the module's prefix and a 2 s TTL",
    },
    "source": {
        "integration/test_glusterfs_roundtrip.py": "a JPEG list on disk",
        "preprocess/test_madlib_fidelity.py": "parametrised table source: Arrow, Parquet, SQLite",
    },
    "photos": {
        "decode/test_decode_roi.py": "40 photos of assorted sizes, for region decodes",
        "decode/test_jitter.py": "24 photos of 160 rows, for colour jitter",
    },
    "no_cluster": {
        "cluster/test_kube.py": "also sets HOME and drops KUBERNETES_SERVICE_PORT",
        "integration/test_status_command.py": "also drops TRAINFEED_STORAGE",
    },
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


def unlisted_copies(definitions: dict[str, list[str]],
                    allowed: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Name -> definitions of fixtures defined more than once whose copies are not all listed
    in `allowed` (one unlisted definition is the shared one)."""
    copies = {}
    for name, where in definitions.items():
        unlisted = [w for w in where if w.split(":")[0] not in allowed.get(name, {})]
        if len(where) > 1 and len(unlisted) > 1:
            copies[name] = unlisted
    return copies


def test_each_fixture_is_defined_once() -> None:
    copies = unlisted_copies(fixture_definitions(_modules()), ALLOWED_DUPLICATES)
    assert not copies, (
        f"fixtures defined in several modules: {copies}. Define each once in the nearest shared "
        "conftest.py, give copies that mean different things their own names, or list the "
        "module in tests/test_suite_hygiene.py:ALLOWED_DUPLICATES with what differs")


def test_a_new_copy_of_a_listed_fixture_is_caught() -> None:
    """The check can fail: a listed name copied into one more module is reported."""
    definitions = {"storage": ["conftest.py:1", "reader/test_pipeline.py:2", "reader/test_x.py:3"]}
    assert unlisted_copies(definitions, ALLOWED_DUPLICATES) == {
        "storage": ["conftest.py:1", "reader/test_x.py:3"]}
    assert unlisted_copies({"storage": ["conftest.py:1", "reader/test_pipeline.py:2"]},
                           ALLOWED_DUPLICATES) == {}


def test_allowed_duplicates_are_still_duplicated() -> None:
    """An allow-list entry whose module no longer defines the fixture hides nothing: remove it."""
    definitions = fixture_definitions(_modules())
    stale = [f"{name} in {module}" for name, modules in ALLOWED_DUPLICATES.items()
             for module in modules
             if module not in {w.split(":")[0] for w in definitions.get(name, [])}]
    assert not stale, f"remove {stale} from ALLOWED_DUPLICATES: no longer defined there"
