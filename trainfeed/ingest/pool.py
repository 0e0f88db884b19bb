"""Shards packed by several processes, results handed back in shard order.

Reading, checksumming, encoding and hashing a shard hold a core each (Arrow's encoder, zlib's
CRC-32 and SHA-256 run with the GIL held in this path), so one process cannot use a machine's
cores; shards are independent (trainfeed.ingest.plan), so processes pack whole shards and write
them themselves: no record crosses a pipe, only each shard's task and progress record.

Processes start from a fork server that imported the packer once (`forkserver`: no fork of a
process with threads running, as a library caller's may have); storage that lives in one
process's memory (`memory://`) is packed in the calling process.
"""
from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from trainfeed.ingest.pack import PackTask, pack_shard
from trainfeed.ingest.progress import ShardProgress

logger = logging.getLogger(__name__)

# Shards queued per process beyond the one it packs: enough that a process never waits for the
# caller to hand it work, few enough that an interrupted upload leaves little half-done.
QUEUED_PER_PROCESS = 1


def pack_in_order(tasks: Sequence[PackTask],
                  processes: int) -> Generator[ShardProgress, None, None]:
    """Packs `tasks`, yielding each one's progress in task order, on up to `processes`
    processes. Closing the iterator early (an error, an interrupt) cancels the shards not
    started and waits for those being packed: they finish, each atomically, and a re-run skips
    them."""
    processes = min(processes, len(tasks))
    if processes <= 1 or any(t.folder.url.startswith("memory://") for t in tasks[:1]):
        for task in tasks:
            yield pack_shard(task)
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["trainfeed.ingest.pack"])
    pending: deque[Future[ShardProgress]] = deque()
    queue = iter(tasks)
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        try:
            for task in queue:
                pending.append(pool.submit(pack_shard, task))
                if len(pending) >= processes * (1 + QUEUED_PER_PROCESS):
                    break
            while pending:
                done = pending.popleft().result()
                following = next(queue, None)
                if following is not None:
                    pending.append(pool.submit(pack_shard, following))
                yield done
        finally:
            for future in pending:
                future.cancel()
