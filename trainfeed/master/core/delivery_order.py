"""One job, one delivery order: the sampling options every reader of a job must share.

A partition handed from one reader to another (an expired lease, work stealing, a restore) is
counted in delivery order: `skip_records` and checkpoint positions say how many records of it,
*in the order its reader delivers them*, a trainer already had. That order depends on the
reader's seed, shuffle buffer, resampling and synchronous batch size, so readers of one job that
differ in them deliver some records twice and never others, or wait for ever (issue 26: a reader
with resample="uniform" next to plain ones hung silently). So OpenJob carries the options
(a DeliveryOrder); the job keeps its first reader's, and a reader whose options differ is
refused while the job is read in the other order (`conflict`).

Pure: no clock, socket or gRPC state.
"""
from __future__ import annotations

import hashlib

from trainfeed.master.core.messages import DeliveryOrder


def describe(order: DeliveryOrder) -> str:
    """The options as a reader passes them: `seed=0, shuffle_buffer=256, resample='uniform'`."""
    parts = [f"seed={order.seed}", f"shuffle_buffer={order.shuffle_buffer}",
             f"resample={order.resample or 'None'}"]
    if order.sync_batch_size:
        parts.append(f"sync=True with batch_size={order.sync_batch_size}")
    return ", ".join(parts)


def same(a: DeliveryOrder, b: DeliveryOrder) -> bool:
    return a == b


def other_job_name(job: str, order: DeliveryOrder) -> str:
    """A job name for readers of `order`: the same options always suggest the same name, so
    that readers told to move there meet."""
    digest = hashlib.sha256(_canonical(order)).hexdigest()[:6]
    return f"{job[:40]}-{digest}"


def _canonical(order: DeliveryOrder) -> bytes:
    """The options as bytes, one form per options: the wire's own encoding of them (fields 1,
    2 and 4 varints, 3 a string; zeros left out), so that a master suggests the name earlier
    releases suggested for the same options (tests/master/test_sync_group.py pins it)."""
    out = bytearray()
    for number, value in ((1, order.seed), (2, order.shuffle_buffer), (3, order.resample),
                          (4, order.sync_batch_size)):
        if isinstance(value, str):
            if value:
                data = value.encode()
                out += _varint(number << 3 | 2) + _varint(len(data)) + data
        elif value:
            out += _varint(number << 3) + _varint(value)
    return bytes(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def conflict(job: str, theirs: DeliveryOrder, ours: DeliveryOrder, held_by: str) -> str:
    """The refusal of a reader with options `ours` in a job read with `theirs` (by `held_by`)."""
    return (f"job {job!r} is read with {describe(theirs)} (by {held_by}); this reader asks for "
            f"{describe(ours)}. Readers of one job deliver in one order (a partition passed "
            f"between them is counted in that order), so these cannot share it: give this "
            f"reader its own job, e.g. TRAINFEED_JOB={other_job_name(job, ours)} (or "
            f"job=...), or use the same seed and sampling options as the others")
