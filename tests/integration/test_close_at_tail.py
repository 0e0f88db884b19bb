"""Closing a reader whose producer sits in the epoch tail's GetTasks long-poll (issue 28).

The long-poll waits server-side up to trainfeed.lease.tasks.LONG_POLL_MS for partitions others
hold; a close (or an abandoned pass) must not wait for it to come back: the session cancels the
call in flight and the producer ends quietly."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from trainfeed import BatchOptions, MasterSource, PipelineOptions, dist
from trainfeed.lease.tasks import LONG_POLL_MS
from trainfeed.master.serve.process import MasterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timing]
# Well under one long-poll, with room for a loaded host (the close also hands leases back).
CLOSE_WITHIN_S = 1.0


@pytest.fixture
def master(storage: str) -> Iterator[MasterProcess]:
    # B's trainer stops before taking its last batch's successor, so its last partition is
    # never acknowledged: its producer waits lease_timeout/3 (1 s) for that, then long-polls.
    with MasterProcess(storage, extra_args=["--lease-timeout", "3"]) as m:
        yield m


@pytest.mark.timeout(120)
def test_abandoning_a_pass_in_a_tail_long_poll_does_not_wait_for_it(
        master: MasterProcess) -> None:
    """A holds one partition (its trainer took a batch and stopped); B read the other nine and
    its producer long-polls for A's. B's trainer then stops: abandoning the pass (closing its
    batches, as a trainer that breaks out of its loop does) and closing B return well within a
    long-poll."""
    assert LONG_POLL_MS / 1000 > 2 * CLOSE_WITHIN_S
    a = dist.reader("flowers",
                    source=MasterSource(master.address, job="tail", prefetch_partitions=1),
                    pipeline=PipelineOptions(batch=BatchOptions(size=5)))
    b = dist.reader("flowers", source=MasterSource(master.address, job="tail"),
                    pipeline=PipelineOptions(batch=BatchOptions(size=5)))
    got: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    took: list[float] = []

    def read_b() -> None:
        batches = b()
        try:
            for batch in batches:
                got.extend(int(i) for i in batch["_id"])
                if len(got) >= 90:
                    stop.wait(30)
                    break
        except BaseException as e:  # the test asserts there is none
            errors.append(e)
        finally:
            started = time.monotonic()
            batches.close()  # type: ignore[attr-defined]
            b.close()
            took.append(time.monotonic() - started)

    try:
        a_pass = iter(a())  # kept: a pass dropped is abandoned, and hands its leases back
        taken = [int(i) for i in next(a_pass)["_id"]]
        b_pass = threading.Thread(target=read_b, daemon=True)
        b_pass.start()
        deadline = time.monotonic() + 60
        while len(got) < 90 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(got) == 90, (len(got), taken)
        time.sleep(2.0)  # B's producer is now in a long-poll for A's partition
        stop.set()
        b_pass.join(30)
        assert not b_pass.is_alive() and not errors, errors
        assert took[0] < CLOSE_WITHIN_S, f"close took {took[0]:.2f} s (long-poll {LONG_POLL_MS} ms)"
        assert len(set(got)) == len(got) and not set(got) & set(taken)
    finally:
        a.close()
        b.close()
