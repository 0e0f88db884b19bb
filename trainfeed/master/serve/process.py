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

from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV

_LISTENING = re.compile(r"listening on \S+:(\d+)")
_METRICS = re.compile(r"metrics on http://\S+:(\d+)/metrics")
# The token travels to the child in its environment (not its command line, which ps shows).
_TOKEN_VARIABLES = (TOKEN_ENV, TOKEN_FILE_ENV)


class MasterProcess:
    """A `trainfeed master` child process. Context manager; `stop()` is idempotent.

    Args:
        token: the token every call must carry; None (the default) runs it `--insecure`, unless
            `extra_args` name a `--token-file`. The caller's own TRAINFEED_TOKEN[_FILE] are
            not passed on, so a developer's shell cannot change what a test starts.
        metrics_port: where to export Prometheus metrics: 0 (the default) a free port, read
            back into `metrics_port` / `metrics_url`; None exports none.
    """

    def __init__(self, storage: str, state: str = "memory://", extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, port: int = 0, start_timeout_s: float = 30,
                 token: str | None = None, metrics_port: int | None = 0):
        auth = ["--insecure"] if token is None and not any(
            a.startswith("--token-file") for a in extra_args) else []
        self.args = [sys.executable, "-m", "trainfeed.cli.main", "master", "--host", "127.0.0.1",
                     "--port", str(port), "--storage", storage, "--state", state,
                     "--metrics-port", "none" if metrics_port is None else str(metrics_port),
                     "--exit-with-parent", *auth, *extra_args]
        child_env = {k: v for k, v in os.environ.items() if k not in _TOKEN_VARIABLES}
        if token is not None:
            child_env[TOKEN_ENV] = token
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**child_env, **(env or {})})
        self.log: list[str] = []
        self._drain: threading.Thread | None = None
        self.port = self._wait_ready(start_timeout_s)
        self.address = f"127.0.0.1:{self.port}"
        ready = next((m for m in map(_METRICS.search, self.log) if m), None)
        self.metrics_port: int | None = int(ready.group(1)) if ready else None
        self.metrics_url = (f"http://127.0.0.1:{self.metrics_port}/metrics"
                            if self.metrics_port is not None else None)
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
        """TERM, then KILL after `timeout_s`; once it returns, `log` holds all the output."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._drain is not None:
            self._drain.join(5)

    def __enter__(self) -> MasterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
