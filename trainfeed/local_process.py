"""A trainfeed server command (`trainfeed master`, `trainfeed decoder`) as a local child process,
for the demo, tests and benchmarks.

The child runs exactly as the command would; this only starts it, waits for its "listening on
HOST:PORT" line (reading the port it picked), keeps draining its output so that it never blocks
on a full pipe, and stops it (TERM, then KILL), so that nothing outlives the caller. Tokens
travel in the child's environment (`child_environment`), never on its command line, which `ps`
shows. trainfeed.master.serve.process and trainfeed.decoder.process build on it: a neutral
module, because the master and the decoder may not import each other.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Sequence
from typing import TypeVar

from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV

__all__ = ["LocalServerProcess", "child_environment"]

_LISTENING = re.compile(r"listening on \S+:(\d+)")
_SelfT = TypeVar("_SelfT", bound="LocalServerProcess")


def child_environment(token: str | None) -> dict[str, str]:
    """This process's environment without its TRAINFEED_TOKEN[_FILE] (so that a developer's
    shell cannot change what a test starts), with `token` as TRAINFEED_TOKEN when given."""
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    if token is not None:
        env[TOKEN_ENV] = token
    return env


class LocalServerProcess:
    """The server command `args`, started with `env`; ready once it printed its listening line
    (within `start_timeout_s`, else RuntimeError with its output). `port` and `address`
    (127.0.0.1:port) are where it listens, `log` its output lines so far. A context manager;
    `stop()` and `kill()` are idempotent."""

    what = "server"  # the error's name for it

    def __init__(self, args: Sequence[str], env: dict[str, str], start_timeout_s: float):
        self.args = list(args)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self.log: list[str] = []
        self._drain: threading.Thread | None = None
        self.port = self._wait_ready(start_timeout_s)
        self.address = f"127.0.0.1:{self.port}"
        self._drain = threading.Thread(target=self._pump, daemon=True)
        self._drain.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, timeout_s: float) -> int:
        found: list[int] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.log.append(line)
                match = _LISTENING.search(line)
                if match:
                    found.append(int(match.group(1)))
                    return
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self.stop()
            raise RuntimeError(f"{self.what} did not start within {timeout_s:g} s; its output:\n"
                               + "".join(self.log[-40:]))
        return found[0]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def kill(self) -> None:
        """SIGKILL: it dies as on a node loss."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 10) -> None:
        """TERM, then KILL after `timeout_s`; once it returns, `log` holds all the output."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._drain is not None:
            self._drain.join(5)

    def __enter__(self: _SelfT) -> _SelfT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
