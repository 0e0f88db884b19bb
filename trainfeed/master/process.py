"""Starting a master as a separate local process: the demo, benchmarks and tests use this.

The master runs exactly as `trainfeed master` would; this only spawns it on a free port, waits
for its "listening" line, and stops it (TERM, then KILL) so that nothing outlives the caller.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

_LISTENING = re.compile(r"listening on \S+:(\d+)")


class MasterProcess:
    """A `trainfeed master` child process. Context manager; `stop()` is idempotent."""

    def __init__(self, storage: str, state: str = "memory://", extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, port: int = 0, start_timeout_s: float = 30):
        self.args = [sys.executable, "-m", "trainfeed.cli.main", "master", "--host", "127.0.0.1",
                     "--port", str(port), "--storage", storage, "--state", state,
                     "--exit-with-parent", *extra_args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})
        self.log: list[str] = []
        self.port = self._wait_ready(start_timeout_s)
        self.address = f"127.0.0.1:{self.port}"
        # Keep draining its output so the child never blocks on a full pipe.
        self._drain = threading.Thread(target=self._pump, daemon=True)
        self._drain.start()

    def _wait_ready(self, timeout_s: float) -> int:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        result: list[int] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.log.append(line)
                match = _LISTENING.search(line)
                if match:
                    result.append(int(match.group(1)))
                    return
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not result:
            self.stop()
            raise RuntimeError(f"master did not start within {timeout_s:g} s; its output:\n"
                               + "".join(self.log[-40:]))
        return result[0]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)

    def kill(self) -> None:
        """SIGKILL: the master dies as on a node loss."""
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

    def __enter__(self) -> MasterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
