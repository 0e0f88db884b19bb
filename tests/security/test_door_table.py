"""docs/security.md lists every door (issue 35): each gRPC method the master serves, each kind
of Session message and each HTTP path has a row, every row fills its columns and names tests
that exist, and no row is left without a test."""
from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from door_table import REPO, missing_doors, problems, read_rows, todo_rows
from grpc_health.v1 import health_pb2

from trainfeed.master.serve.status_page import PATHS
from trainfeed.v1 import master_pb2

SERVER = REPO / "trainfeed" / "master" / "serve" / "server.py"
# Where the descriptor of each service the master may register lives.
DESCRIPTORS: dict[str, ModuleType] = {"Master": master_pb2, "Health": health_pb2}


def served_services(source: str) -> list[str]:
    """Services the server registers (`add_<Name>Servicer_to_server` calls), by name."""
    return re.findall(r"\badd_(\w+)Servicer_to_server\(", source)


def grpc_methods() -> list[str]:
    """`package.Service/Method` of every method of every service the master registers."""
    methods = []
    for name in served_services(SERVER.read_text(encoding="utf-8")):
        assert name in DESCRIPTORS, (
            f"the master registers service {name!r}, which this test does not know: add its "
            f"generated module to DESCRIPTORS so its methods need rows in docs/security.md")
        service = DESCRIPTORS[name].DESCRIPTOR.services_by_name[name]
        methods += [f"{service.full_name}/{m.name}" for m in service.methods]
    return methods


def session_kinds() -> list[str]:
    """`SessionMessage.<field>` of every field a reader's Session message may carry (the proto
    declares no oneof: each field is a kind of its own, `seq` included)."""
    return [f"SessionMessage.{f.name}" for f in master_pb2.SessionMessage.DESCRIPTOR.fields]


def required_doors() -> list[str]:
    return grpc_methods() + session_kinds() + list(PATHS)


def test_the_master_serves_the_master_and_health_services() -> None:
    """The list the table is checked against is the real one (not empty by a broken regex)."""
    assert served_services(SERVER.read_text(encoding="utf-8")) == ["Master", "Health"]
    assert "trainfeed.v1.Master/Session" in grpc_methods()
    assert "grpc.health.v1.Health/Check" in grpc_methods()


@pytest.mark.parametrize("doors", [grpc_methods, session_kinds, lambda: list(PATHS)],
                         ids=["grpc-methods", "session-kinds", "http-paths"])
def test_every_served_door_has_a_row(doors: object) -> None:
    assert callable(doors)
    missing = missing_doors(read_rows(), doors())
    assert not missing, (f"docs/security.md's table of doors has no row for {missing}: add one "
                         f"per door (who can send it, its bound, how it is escaped, its test)")


def test_every_row_fills_its_columns_and_names_tests_that_exist() -> None:
    found = problems(read_rows(), required_doors())
    assert not found, "docs/security.md's table of doors:\n" + "\n".join(found)


def test_every_door_has_a_test() -> None:
    todo = todo_rows(read_rows())
    assert not todo, f"{len(todo)} door(s) without a test:\n" + "\n".join(todo)


HERE = "tests/security/test_door_table.py"
BROKEN = f"""\
# Security

## Doors

| door | kind | who can send it | bound | escaped or confined how | test |
|---|---|---|---|---|---|
| `trainfeed.v1.Master/OpenJob` | grpc | anyone | 4 MiB | ok | {HERE}::test_every_door_has_a_test |
| `SessionMessage.open` | session | a token holder |  | checked | {HERE}::test_no_such_test |
| `/status` | http | anyone | 4 KiB | escaped | TODO |
| `/login` | web | anyone | 4 KiB | escaped | tests/nowhere.py::test_x |

## Next
"""


def test_the_checker_names_what_is_missing_or_wrong(tmp_path: Path) -> None:
    """The checks can fail: a made-up table missing a method, a kind and a path, with an empty
    cell, an unknown kind and two tests that do not exist, is refused naming each."""
    doc = tmp_path / "security.md"
    doc.write_text(BROKEN, encoding="utf-8")
    rows = read_rows(doc)
    required = ["trainfeed.v1.Master/OpenJob", "trainfeed.v1.Master/Report",
                "SessionMessage.open", "SessionMessage.get_tasks", "/status", "/metrics"]
    assert missing_doors(rows, required) == [
        "trainfeed.v1.Master/Report", "SessionMessage.get_tasks", "/metrics"]
    found = "\n".join(problems(rows, required))
    for expected in ("no row for trainfeed.v1.Master/Report", "no row for /metrics",
                     "no row for SessionMessage.get_tasks", "empty 'bound'",
                     "kind 'web'", "defines no test_no_such_test", "no file tests/nowhere.py"):
        assert expected in found, found
    assert "test_every_door_has_a_test" not in found  # a test that exists is not named
    assert todo_rows(rows) == ["line 9: `/status`"]


@pytest.mark.parametrize("door", ["trainfeed.v1.Master/Session", "grpc.health.v1.Health/Watch",
                                  "SessionMessage.get_tasks", "/login"])
def test_dropping_a_row_of_the_real_table_is_caught(door: str) -> None:
    kept = [row for row in read_rows() if door not in row.keys]
    assert missing_doors(kept, required_doors()) == [door]
