"""The master's decoder scaling (issue 37): `trainfeed master --scale-decoders JOB`.

Every STEP_S, on the master's event loop, it takes the figures the master already has: the job's
trainers' input-bound shares (the reader board, from the stats their messages carry) and the busy
share of each decoder registered with this master (trainfeed.master.serve.decoder_streams), and
hands them to the job's DecoderAutoscaler, whose Kubernetes calls run on a thread (they block).
The decision goes to the status page, /status.json and the metrics (`servicer.decoder_scalers`).

The decoders registered with a master serve all its jobs: their busy share is the pool's. A master
made by `trainfeed submit` serves one job, whose decoders register with it.

No silent waits: an API that cannot be reached is a decision (`api-error`, logged by the
autoscaler); a cluster that cannot even be connected to (no kubeconfig, no ServiceAccount) is
logged with the time of the next try, every CONNECT_RETRY_S.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from trainfeed.errors import ClusterError
from trainfeed.master.core.decoder_scaling import trainer_shares
from trainfeed.master.core.decoders import DecoderRegistry
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.serve.decoder_autoscaler import STEP_S, DecoderAutoscaler

logger = logging.getLogger(__name__)

CONNECT_RETRY_S = 60.0


class Scaled(Protocol):
    """What the loop needs of the servicer."""

    decoder_scalers: dict[str, DecoderAutoscaler]

    @property
    def reader_stats(self) -> ReaderBoard: ...


async def scale_decoders(servicer: Scaled, registry: DecoderRegistry, job: str,
                         stop: asyncio.Event,
                         make: Callable[[str], DecoderAutoscaler] = DecoderAutoscaler.in_cluster,
                         step_s: float = STEP_S) -> None:
    """Steps `job`'s autoscaler every `step_s` until `stop`."""
    scaler = await _connect(job, stop, make)
    if scaler is None:
        return
    servicer.decoder_scalers[job] = scaler
    try:
        while not stop.is_set():
            now = time.time()
            trainers = {job: trainer_shares(servicer.reader_stats.views(job, now))}
            busy = [d.busy for d in registry.listing()]
            await asyncio.to_thread(scaler.step, time.monotonic(), trainers, busy)
            await _sleep(stop, step_s)
    finally:
        servicer.decoder_scalers.pop(job, None)
        await asyncio.to_thread(scaler.close)


async def _connect(job: str, stop: asyncio.Event, make: Callable[[str], DecoderAutoscaler]
                   ) -> DecoderAutoscaler | None:
    """The job's autoscaler, retried (and said) while the cluster cannot be connected to."""
    while not stop.is_set():
        try:
            return await asyncio.to_thread(make, job)
        except ClusterError as e:
            until = time.strftime("%H:%M:%S", time.localtime(time.time() + CONNECT_RETRY_S))
            logger.error("the decoders of job %s are not scaled: %s; trying again at %s",
                         job, e, until)
            await _sleep(stop, CONNECT_RETRY_S)
    return None


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
