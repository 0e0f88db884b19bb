"""Starting a master as a separate local process: the demo, benchmarks and tests use this.

The master runs exactly as `trainfeed master` would; trainfeed.local_process spawns it on a free
port, waits for its "listening" line, and stops it (TERM, then KILL) so that nothing outlives
the caller. The token travels to the child in its environment (not its command line, which ps
shows).
"""
from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from trainfeed.local_process import LocalServerProcess, child_environment

_METRICS = re.compile(r"metrics on http://\S+:(\d+)/metrics")


class MasterProcess(LocalServerProcess):
    """A `trainfeed master` child process. Context manager; `stop()` and `kill()` are
    idempotent.

    Args:
        token: the token every call must carry; None (the default) runs it `--insecure`, unless
            `extra_args` name a `--token-file`. The caller's own TRAINFEED_TOKEN[_FILE] are
            not passed on, so a developer's shell cannot change what a test starts.
        metrics_port: where to export Prometheus metrics: 0 (the default) a free port, read
            back into `metrics_port` / `metrics_url`; None exports none.
    """

    what = "master"

    def __init__(self, storage: str, state: str = "memory://", extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, port: int = 0, start_timeout_s: float = 30,
                 token: str | None = None, metrics_port: int | None = 0):
        auth = ["--insecure"] if token is None and not any(
            a.startswith("--token-file") for a in extra_args) else []
        args = [sys.executable, "-m", "trainfeed.cli.main", "master", "--host", "127.0.0.1",
                "--port", str(port), "--storage", storage, "--state", state,
                "--metrics-port", "none" if metrics_port is None else str(metrics_port),
                "--exit-with-parent", *auth, *extra_args]
        super().__init__(args, {**child_environment(token), **(env or {})}, start_timeout_s)
        ready = next((m for m in map(_METRICS.search, self.log) if m), None)
        self.metrics_port: int | None = int(ready.group(1)) if ready else None
        self.metrics_url = (f"http://127.0.0.1:{self.metrics_port}/metrics"
                            if self.metrics_port is not None else None)
