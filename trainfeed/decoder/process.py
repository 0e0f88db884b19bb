"""A `trainfeed decoder` as a local child process: for tests and benchmarks.

It runs exactly as the command would; trainfeed.local_process starts it (on a free port unless
one is given), waits for its "listening" line, and stops it (TERM, then KILL), so that nothing
outlives the caller. The token travels in the child's environment, never on its command line.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from trainfeed import settings
from trainfeed.local_process import LocalServerProcess, child_environment

__all__ = ["DecoderProcess"]


class DecoderProcess(LocalServerProcess):
    """A decoder serving `storage` on 127.0.0.1:`port` (0: a free one, read back into `port`
    and `address`). `token` None: --insecure. `prefix`: argv before Python's (e.g.
    `taskset -c 1`). `master`: registers with that master (`--master`). `drain_s`: its
    `--drain-s` (the grace its calls in flight get on SIGTERM). A context manager; `stop()`
    and `kill()` are idempotent; `terminate()` sends SIGTERM and returns at once (it drains)."""

    what = "decoder"

    def __init__(self, storage: str, token: str | None = None, port: int = 0,
                 threads: int | None = None, prefix: Sequence[str] = (),
                 start_timeout_s: float = 30, master: str | None = None,
                 drain_s: float | None = None):
        args = [*prefix, sys.executable, "-m", "trainfeed.cli.main", "decoder", "--listen",
                f"127.0.0.1:{port}", "--storage", storage]
        if master is not None:  # registered with it (issue 37)
            args += ["--master", master]
        if drain_s is not None:
            args += ["--drain-s", f"{drain_s:g}"]
        if threads is not None:
            args += ["--threads", str(threads)]
        if token is None:
            args.append("--insecure")
        env = child_environment(token)
        # (Not this process's master either: a decoder registers only with the one named.)
        env.pop(settings.MASTER.name, None)
        super().__init__(args, env, start_timeout_s)

    def terminate(self) -> None:
        """SIGTERM, as Kubernetes stops a pod: the decoder drains (trainfeed.decoder.drain);
        `proc.wait()` for its exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
