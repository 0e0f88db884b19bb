"""The table of doors in docs/security.md, read and checked (issue 35).

Every input the system takes (a gRPC method, a Session message kind, an HTTP path, a file read
from storage, a flag or variable, a text shown to people) has one row there saying who can send
it, what bounds it, how it is escaped or confined, and which tests show that. This module parses
that table and says what is wrong with it, so that tests/security/test_door_table.py fails when a
door the code serves has no row, a row names a test that does not exist, or a row leaves a
column empty; and so that its checks can be shown failing on a table made up for the purpose.

A row's door cell names the doors it covers as code spans (`trainfeed.v1.Master/OpenJob`,
`SessionMessage.report`, `/status.json`): that is how a door the code serves is found in it. Its
test cell lists pytest node ids (`tests/x.py::test_y`, a parametrized id's base name, or
`tests/x.py::TestCase::runTest`), separated by `<br>` or commas, or `TODO` where no test shows
the door yet.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECURITY_DOC = REPO / "docs" / "security.md"
HEADING = "## Doors"
COLUMNS = ("door", "kind", "who can send it", "bound", "escaped or confined how", "test")
# k8s: an object the master reads back from the Kubernetes API (the decoder autoscaler).
KINDS = ("grpc", "session", "http", "file", "cli/env", "text", "k8s")
TODO = "TODO"
_CODE = re.compile(r"`([^`]+)`")
_SEPARATOR = re.compile(r"<br\s*/?>|,")


@dataclass(frozen=True)
class Row:
    """One door of the table, its cells stripped; `line` is its line in the document."""

    door: str
    kind: str
    who: str
    bound: str
    confined: str
    tests: str
    line: int

    @property
    def keys(self) -> tuple[str, ...]:
        """The doors this row covers: the code spans of its door cell."""
        return tuple(_CODE.findall(self.door))

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The pytest node ids of its test cell (none for `TODO`)."""
        ids = (part.strip().strip("`").strip() for part in _SEPARATOR.split(self.tests))
        return tuple(i for i in ids if i and i != TODO)

    @property
    def todo(self) -> bool:
        return self.tests.strip().strip("`") == TODO


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse(text: str) -> list[Row]:
    """The rows of the first table after the `## Doors` heading of `text`.

    Raises:
        ValueError: no such heading, no table under it, or a table whose header is not COLUMNS
            or whose row has another number of cells (what to fix is in the message).
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADING)
    except StopIteration:
        raise ValueError(f"no {HEADING!r} heading: the table of doors goes under it") from None
    table = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("|"):
            table.append((number, line))
        elif table:
            break
    if len(table) < 2:
        raise ValueError(f"no table under {HEADING!r} (line {start + 1})")
    header = tuple(c.lower() for c in _cells(table[0][1]))
    if header != COLUMNS:
        raise ValueError(f"line {table[0][0]}: the doors' columns must be {COLUMNS}, got {header}")
    rows = []
    for number, line in table[2:]:
        cells = _cells(line)
        if len(cells) != len(COLUMNS):
            raise ValueError(f"line {number}: {len(cells)} cells, expected {len(COLUMNS)} "
                             f"(a '|' inside a cell must be written as another character)")
        rows.append(Row(*cells, line=number))
    return rows


def read_rows(path: Path = SECURITY_DOC) -> list[Row]:
    return parse(path.read_text(encoding="utf-8"))


def missing_doors(rows: Iterable[Row], required: Iterable[str]) -> list[str]:
    """The required doors no row covers, in the order given."""
    covered = {key for row in rows for key in row.keys}
    return [door for door in required if door not in covered]


def _defined_names(path: Path) -> dict[str, set[str] | None]:
    """Top-level names of a test module -> the method names of a class (None for others)."""
    names: dict[str, set[str] | None] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            names[node.name] = {n.name for n in node.body
                                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        elif isinstance(node, ast.Assign):  # TestMachine = Machine.TestCase
            names.update({t.id: None for t in node.targets if isinstance(t, ast.Name)})
    return names


def node_id_problem(node_id: str, root: Path = REPO) -> str | None:
    """None if `node_id` names a test that exists under `root`, else what is wrong with it."""
    file, _, rest = node_id.partition("::")
    parts = [re.sub(r"\[.*\]$", "", p) for p in rest.split("::")] if rest else []
    if not file.startswith("tests/") or not file.endswith(".py") or not parts:
        return f"{node_id!r} is not a node id of the form tests/…py::test_name"
    path = root / file
    if not path.is_file():
        return f"{node_id!r}: no file {file}"
    names = _defined_names(path)
    if parts[0] not in names:
        return f"{node_id!r}: {file} defines no {parts[0]}"
    methods = names[parts[0]]
    if len(parts) > 1 and methods is not None and parts[1] not in methods:
        return f"{node_id!r}: class {parts[0]} of {file} has no {parts[1]}"
    return None


def problems(rows: Iterable[Row], required: Iterable[str], root: Path = REPO) -> list[str]:
    """Everything wrong with the table but its TODOs: doors without a row, unknown kinds,
    empty cells, test cells that are empty and node ids that name no test."""
    rows = list(rows)
    found = [f"no row for {door}" for door in missing_doors(rows, required)]
    for row in rows:
        where = f"line {row.line} ({row.door})"
        if row.kind not in KINDS:
            found.append(f"{where}: kind {row.kind!r} is none of {KINDS}")
        for column, cell in (("who can send it", row.who), ("bound", row.bound),
                             ("escaped or confined how", row.confined)):
            if not cell:
                found.append(f"{where}: empty {column!r}")
        if not row.todo and not row.node_ids:
            found.append(f"{where}: no test (name one, or write {TODO})")
        found += [f"{where}: {p}" for i in row.node_ids if (p := node_id_problem(i, root))]
    return found


def todo_rows(rows: Iterable[Row]) -> list[str]:
    """The doors whose test cell says TODO, as `line N: door`."""
    return [f"line {row.line}: {row.door}" for row in rows if row.todo]
