"""trainfeed.local_process, which starts the master and the decoder as local child processes:
it reads the port from the child's "listening" line, keeps its output, passes the token only in
its environment, and stops a child that does not come up, quoting what it said."""
from __future__ import annotations

import sys

import pytest

from trainfeed.local_process import LocalServerProcess, child_environment
from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_port_comes_from_the_listening_line_and_the_output_is_kept() -> None:
    code = ("import os, time; print(os.environ.get('TRAINFEED_TOKEN')); "
            "print('x listening on 127.0.0.1:4321 (pid 1)', flush=True); time.sleep(60)")
    with LocalServerProcess(python(code), child_environment("the-token"), 60) as child:
        assert (child.port, child.address) == (4321, "127.0.0.1:4321")
        assert child.pid == child.proc.pid
    assert child.proc.returncode is not None  # stopped on leaving the block
    assert "".join(child.log).splitlines() == [
        "the-token", "x listening on 127.0.0.1:4321 (pid 1)"]
    assert "the-token" not in " ".join(child.args)
    child.kill()  # idempotent, as is stop()
    child.stop()


def test_a_child_that_never_listens_is_stopped_and_its_output_quoted() -> None:
    # (It exits: its output ends, so the wait ends then, however loaded the machine.)
    code = "print('no storage here')"
    with pytest.raises(RuntimeError, match="server did not start within 120 s; its output:\n"
                                           "no storage here"):
        LocalServerProcess(python(code), child_environment(None), 120)


def test_the_callers_token_is_not_passed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "a-developers-token")
    monkeypatch.setenv(TOKEN_FILE_ENV, "token-file")
    assert TOKEN_ENV not in child_environment(None)
    assert TOKEN_FILE_ENV not in child_environment(None)
    assert child_environment("given")[TOKEN_ENV] == "given"
