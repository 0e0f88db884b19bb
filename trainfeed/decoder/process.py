"""A `trainfeed decoder` as a local child process: for tests and benchmarks.

It runs exactly as the command would; this only starts it (on a free port unless one is given),
waits for its "listening" line, and stops it (TERM, then KILL), so that nothing outlives the
caller. The token travels in the child's environment, never on its command line.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from trainfeed import settings
from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV

__all__ = ["DecoderProcess"]

_LISTENING = re.compile(r"listening on (\S+):(\d+)")


class DecoderProcess:
    """A decoder serving `storage` on 127.0.0.1:`port` (0: a free one, read back into `port`
    and `address`). `token` None: --insecure. `prefix`: argv before Python's (e.g.
    `taskset -c 1`). `master`: registers with that master (`--master`). A context manager;
    `stop()` and `kill()` are idempotent."""

    def __init__(self, storage: str, token: str | None = None, port: int = 0,
                 threads: int | None = None, prefix: Sequence[str] = (),
                 start_timeout_s: float = 30, master: str | None = None):
        args = [*prefix, sys.executable, "-m", "trainfeed.cli.main", "decoder", "--listen",
                f"127.0.0.1:{port}", "--storage", storage]
        if master is not None:  # registered with it (issue 37)
            args += ["--master", master]
        if threads is not None:
            args += ["--threads", str(threads)]
        # (Not this process's master either: a decoder registers only with the one named.)
        env = {k: v for k, v in os.environ.items()
               if k not in (TOKEN_ENV, TOKEN_FILE_ENV, settings.MASTER.name)}
        if token is None:
            args.append("--insecure")
        else:
            env[TOKEN_ENV] = token
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.log: list[str] = []
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
                    found.append(int(match.group(2)))
                    return
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not found:
            self.stop()
            raise RuntimeError(f"decoder did not start within {timeout_s:g} s; its output:\n"
                               + "".join(self.log[-40:]))
        return found[0]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def kill(self) -> None:
        """SIGKILL: the decoder dies as on a node loss."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> DecoderProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


