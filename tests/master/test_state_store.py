from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.master.state_store import (
    MemoryStateStore,
    SQLiteStateStore,
    open_state_store,
)


def test_sqlite_snapshots_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = open_state_store(f"sqlite:///{path}")
    store.save_job("j", {"version": 1, "epoch": 0})
    store.save_job("j", {"version": 1, "epoch": 3})
    store.save_job("k", {"version": 1, "epoch": 1})
    store.close()
    store.close()  # idempotent
    again = open_state_store(str(path))
    assert isinstance(again, SQLiteStateStore)
    assert again.load_jobs() == {"j": {"version": 1, "epoch": 3}, "k": {"version": 1, "epoch": 1}}
    again.close()


def test_memory_store_and_unknown_schemes() -> None:
    store = open_state_store("memory://")
    assert isinstance(store, MemoryStateStore)
    store.save_job("j", {"a": 1})
    assert store.load_jobs() == {"j": {"a": 1}}
    with pytest.raises(ValueError, match=r"unknown state store 'redis'.*\['memory', 'sqlite'\]"):
        open_state_store("redis://x")
