"""The layers of the house, checked by import-linter (`[tool.importlinter]` in pyproject.toml):
no import cycles, the reader never imports the master, the master never imports the reader, the
worker neither, the master's core no I/O (grpc, asyncio, HTTP, the journal writer, a store)
and nothing of the wire (trainfeed.v1: it speaks its own types),
ingest no reader, lease or master, SQL sources nothing of the read side, and the foundations
(formats, storage, settings, planning) nothing above them.

The contracts pass on the tree; and on a copy of the package with one deliberately bad module
added, they fail, naming the broken rule, so the check is known to be able to fail."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# import-linter ships only a console script; this runs the same entry point with this Python.
LINT_IMPORTS = ("import sys; from importlinter.cli import lint_imports_command; "
                "sys.exit(lint_imports_command())")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the `trainfeed` package under `root`, with `root`'s pyproject.toml."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo",
         "--config", str(root / "pyproject.toml")],
        cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, capture_output=True, text=True,
        timeout=300)


def copy_with(tmp_path: Path, module: str, source: str) -> Path:
    """A copy of the package and its configuration, plus `module` holding `source`."""
    shutil.copytree(ROOT / "trainfeed", tmp_path / "trainfeed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / (module.replace(".", "/") + ".py")).write_text(source)
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout
    assert re.search(r"Contracts: \d+ kept, 0 broken", result.stdout), result.stdout


def test_a_reader_module_importing_the_master_is_caught(tmp_path: Path) -> None:
    root = copy_with(tmp_path, "trainfeed.reader.layer_probe",
                     "from trainfeed.master.core.ledger import Ledger\n")
    result = lint_imports(root)
    assert result.returncode != 0
    assert "The reader never imports the master BROKEN" in result.stdout, result.stdout
    assert "trainfeed.reader.layer_probe -> trainfeed.master.core.ledger" in result.stdout


def test_an_import_cycle_between_packages_is_caught(tmp_path: Path) -> None:
    # trainfeed.io imports trainfeed.sql (a SQL bucket's rows); sql importing io
    # back closes a circle that no forbidden-import rule covers: only the acyclic one can fail.
    root = copy_with(tmp_path, "trainfeed.sql.layer_probe",
                     "from trainfeed.io.partition_reader import PartitionReader\n")
    result = lint_imports(root)
    assert result.returncode != 0
    assert "No import cycles between the packages and modules of trainfeed, at any depth " \
           "BROKEN" in result.stdout, result.stdout
    assert "The reader never imports the master KEPT" in result.stdout


CORE = "The master's core does no I/O: no gRPC, event loop, HTTP server, journal writer or store"
WIRE = "The master's core speaks its own types: it imports nothing of the wire (trainfeed.v1)"
INGEST = "Ingest writes datasets: it imports no reader, lease or master"
SQL = "SQL sources sit under the read side: they import no reader, io, lease, master or ingest"
DECODER = "The decode service serves the read side and is never imported by it, nor by the master"
# One bad module per new contract (issue 36): the contract it breaks, and the import line that
# the report must name.
PROBES = [
    ("trainfeed.master.core.layer_probe", "import asyncio\n",
     CORE,
     "trainfeed.master.core.layer_probe -> asyncio"),
    ("trainfeed.master.core.layer_probe", "import grpc\n",
     CORE,
     "trainfeed.master.core.layer_probe -> grpc"),
    ("trainfeed.master.core.layer_probe", "from trainfeed.master.stores import StateStore\n",
     CORE,
     "trainfeed.master.core.layer_probe -> trainfeed.master.stores"),
    ("trainfeed.master.core.layer_probe", "from trainfeed.v1 import master_pb2 as pb\n",
     WIRE,
     "trainfeed.master.core.layer_probe -> trainfeed.v1.master_pb2"),
    ("trainfeed.ingest.layer_probe", "from trainfeed.lease.book import LeaseBook\n",
     INGEST,
     "trainfeed.ingest.layer_probe -> trainfeed.lease.book"),
    ("trainfeed.sql.layer_probe", "from trainfeed.reader.checks import check_int\n",
     SQL,
     "trainfeed.sql.layer_probe -> trainfeed.reader.checks"),
    # issue 37: the read side reaches decode workers through trainfeed.decode.remote only.
    ("trainfeed.reader.layer_probe", "from trainfeed.decoder.work import Datasets\n",
     DECODER,
     "trainfeed.reader.layer_probe -> trainfeed.decoder.work"),
]


@pytest.mark.parametrize(("module", "source", "contract", "chain"), PROBES,
                         ids=[f"{m.split('.')[-2]}:{s.split()[-1]}" for m, s, _, _ in PROBES])
def test_each_new_contract_can_fail(tmp_path: Path, module: str, source: str, contract: str,
                                    chain: str) -> None:
    result = lint_imports(copy_with(tmp_path, module, source))
    assert result.returncode != 0
    # import-linter wraps a long contract name at 80 columns: compare without the line breaks.
    report = " ".join(result.stdout.split())
    assert f"{contract} BROKEN" in report, result.stdout
    assert chain in result.stdout, result.stdout
    assert "The reader never imports the master KEPT" in result.stdout
