"""Shards packed by several processes, results handed back in shard order.

Reading, checksumming, encoding and hashing a shard hold a core each (Arrow's encoder, zlib's
CRC-32 and SHA-256 run with the GIL held in this path), so one process cannot use a machine's
cores; shards are independent (trainfeed.ingest.plan), so processes pack whole shards and write
them themselves: no record crosses a pipe, only each shard's task and progress record.

Processes are forked from the caller when it runs no other thread (the CLI: no import to repeat,
and their CPU time is the caller's children's), else from a fork server that imported the
packer once (never a fork of a process with threads running, as a library caller's may have).
Storage that lives in one process's memory (`memory://`) is packed in the calling process.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from trainfeed.ingest.pack import SCRATCH, PackTask, pack_shard
from trainfeed.ingest.progress import ShardProgress

logger = logging.getLogger(__name__)

# Shards queued per process beyond the one it packs: enough that a process never waits for the
# caller to hand it work, few enough that an interrupted upload leaves little half-done.
QUEUED_PER_PROCESS = 1


class Packers:
    """Packs tasks on up to `processes` processes, handing back results in task order.

    A context manager: entering starts the processes and queues the first shards (before the
    caller starts threads of its own, such as a progress bar's); leaving early (an error, an
    interrupt) cancels the shards not started and waits for those being packed: they finish,
    each atomically, and a re-run skips them."""

    def __init__(self, tasks: Sequence[PackTask], processes: int):
        self.tasks = list(tasks)
        self.processes = min(processes, len(self.tasks))
        self._pool: ProcessPoolExecutor | None = None
        self._pending: deque[Future[ShardProgress]] = deque()
        self._queue = iter(self.tasks)

    def __enter__(self) -> Packers:
        in_memory = any(t.folder.url.startswith("memory://") for t in self.tasks[:1])
        if self.processes > 1 and not in_memory:
            # Forked children share the caller's heap until they write to it: without this,
            # their garbage collector walks (and so copies) every object inherited.
            gc.freeze()
            self._pool = ProcessPoolExecutor(self.processes, mp_context=_start_method())
            for task in self._queue:
                self._pending.append(self._pool.submit(pack_shard, task))
                if len(self._pending) >= self.processes * (1 + QUEUED_PER_PROCESS):
                    break
        return self

    def results(self) -> Iterator[ShardProgress]:
        """Each task's progress, in task order, as they finish."""
        if self._pool is None:
            for task in self._queue:
                yield pack_shard(task)
            return
        while self._pending:
            done = self._pending.popleft().result()
            following = next(self._queue, None)
            if following is not None:
                self._pending.append(self._pool.submit(pack_shard, following))
            yield done

    def __exit__(self, *exc: object) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        SCRATCH.release()  # the buffers of shards packed in this process (trainfeed.ingest.pack)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            gc.unfreeze()


def _start_method() -> multiprocessing.context.BaseContext:
    """`fork` where only this thread runs, else `forkserver` (see the module docstring)."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["trainfeed.ingest.pack"])
    return context
