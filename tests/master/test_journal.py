"""The journal writer (trainfeed.master.serve.journal): group commit off the event loop, a call
acknowledged only once its ops are durable, a store error failing the calls it holds, and ops
reaching the store in order, never skipped, never twice."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from trainfeed.errors import LeadershipError, StateStoreError
from trainfeed.master.serve.journal import JournalWriter
from trainfeed.master.stores import MemoryStateStore, SQLiteStateStore


class GatedStore(MemoryStateStore):
    """A memory store whose commits wait for a gate, fail on demand, and are counted."""

    url = "gated://"

    def __init__(self) -> None:
        super().__init__()
        for job in ("j", "k"):  # (a store lists the jobs that have a snapshot)
            self.save_snapshot(job, {"version": 1})
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None
        self.batches: list[dict[str, list[Any]]] = []
        self.threads: set[str] = set()

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        self.threads.add(threading.current_thread().name)
        self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        self.batches.append({job: list(ops) for job, ops in ops_by_job.items()})
        super().append_batch(ops_by_job)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_calls_of_one_tick_share_one_commit_made_off_the_event_loop() -> None:
    store = GatedStore()

    async def main() -> None:
        writer = JournalWriter(store)
        writer.start(asyncio.get_running_loop())
        store.gate.clear()  # the first commit blocks: the next 50 calls pile up behind it
        first = asyncio.create_task(writer.write("j", [["D", 0, "w"]]))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(writer.write("j" if i % 2 else "k", [["D", i, "w"]]))
                for i in range(1, 51)]
        await asyncio.sleep(0.05)
        assert not first.done() and not any(t.done() for t in rest)  # not acknowledged yet
        store.gate.set()
        await asyncio.gather(first, *rest)
        writer.close()
    run(main())
    assert len(store.batches) == 2  # one commit for the first call, one for the 50 others
    assert store.threads == {"journal-writer"}
    saved = store.load_jobs()
    assert [op[1] for op in saved["j"].journal] == [0, *range(1, 51, 2)]
    assert [op[1] for op in saved["k"].journal] == list(range(2, 51, 2))


def test_a_store_error_fails_the_calls_it_held_and_the_ops_are_retried_in_order() -> None:
    store = GatedStore()

    async def main() -> None:
        writer = JournalWriter(store)
        writer.start(asyncio.get_running_loop())
        store.fail = OSError("disk full")
        with pytest.raises(StateStoreError, match=r"state store gated:// failed: disk full.*"
                                                  r"retry the call"):
            await writer.write("j", [["D", 1, "w"]])
        store.fail = None
        await writer.write("j", [["D", 2, "w"]])  # acknowledged: 1 went first
        writer.close()
    run(main())
    assert [op[1] for op in store.load_jobs()["j"].journal] == [1, 2]


def test_lost_leadership_fails_every_later_write_and_tells_the_server() -> None:
    store = GatedStore()
    told: list[bool] = []

    async def main() -> None:
        writer = JournalWriter(store, on_leadership_lost=lambda: told.append(True))
        writer.start(asyncio.get_running_loop())
        store.fail = LeadershipError("state gated://: another master took over")
        with pytest.raises(LeadershipError, match="another master"):
            await writer.write("j", [["D", 1, "w"]])
        with pytest.raises(LeadershipError, match="lost the leadership"):
            await writer.write("j", [["D", 2, "w"]])
        await asyncio.sleep(0.01)
        writer.close()
    run(main())
    assert told == [True]


def test_a_snapshot_keeps_its_place_in_the_order(tmp_path: Path) -> None:
    store = SQLiteStateStore(str(tmp_path / "state.db"))

    async def main() -> None:
        writer = JournalWriter(store)
        writer.start(asyncio.get_running_loop())
        await asyncio.gather(
            writer.write("j", [["D", 1, "w"]]),
            writer.write("j", [["D", 2, "w"]], snapshot={"version": 1, "upto": 2}),
            writer.write("j", [["D", 3, "w"]]))
        writer.close()
        writer.close()  # idempotent
    run(main())
    saved = store.load_jobs()["j"]
    assert saved.snapshot == {"version": 1, "upto": 2}
    assert saved.journal == [["D", 3, "w"]]
    store.close()
