from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from trainfeed.errors import LeadershipError
from trainfeed.master.stores import (
    STORES,
    MemoryStateStore,
    SavedJob,
    SQLiteStateStore,
    StateStore,
    open_state_store,
)


def exercise(store: StateStore) -> None:
    """Snapshot, journal, a compacting snapshot: what the master does with any store."""
    store.save_snapshot("j", {"version": 1, "epoch": 0})
    store.append("j", [["L", "w", [1, 2]], ["D", 1, "w"]])
    store.append("j", [])  # nothing to write is fine
    store.append("j", [["P", 2, 5]])
    store.save_snapshot("k", {"version": 1, "epoch": 1})
    store.save_snapshot("k", {"version": 1, "epoch": 2})  # drops k's (empty) journal
    store.append("k", [["E", 3]])


EXPECTED = {
    "j": SavedJob({"version": 1, "epoch": 0}, [["L", "w", [1, 2]], ["D", 1, "w"], ["P", 2, 5]]),
    "k": SavedJob({"version": 1, "epoch": 2}, [["E", 3]]),
}


def test_sqlite_snapshots_and_journals_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = open_state_store(f"sqlite:///{path}")
    exercise(store)
    store.close()
    store.close()  # idempotent
    again = open_state_store(str(path))
    assert isinstance(again, SQLiteStateStore)
    assert again.load_jobs() == EXPECTED
    again.save_snapshot("j", {"version": 1, "epoch": 9})
    assert again.load_jobs()["j"] == SavedJob({"version": 1, "epoch": 9}, [])
    again.close()


def test_memory_store_and_unknown_schemes() -> None:
    store = open_state_store("memory://")
    assert isinstance(store, MemoryStateStore)
    exercise(store)
    assert store.load_jobs() == EXPECTED
    with pytest.raises(ValueError, match=r"unknown state store 'redis'.*\['etcd', 'memory'"):
        open_state_store("redis://x")
    with pytest.raises(ValueError) as caught:
        open_state_store("redis://admin:pw-7Hq2@cache:6379")
    assert "pw-7Hq2" not in str(caught.value) and "admin:***@cache" in str(caught.value)
    assert sorted(STORES) == ["etcd", "memory", "sqlite"]


def test_a_state_file_of_trainfeed_0_1_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE jobs (name TEXT PRIMARY KEY, state TEXT)")
        db.execute("INSERT INTO jobs VALUES ('train', ?)", (json.dumps({"epoch": 4}),))
    store = SQLiteStateStore(str(path))
    assert store.load_jobs() == {"train": SavedJob({"epoch": 4}, [])}
    store.close()


def test_only_one_process_holds_a_sqlite_state(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from trainfeed.master.stores import SQLiteStateStore\n"
         f"s = SQLiteStateStore({str(path)!r}); s.acquire('first:1')\n"
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        store = SQLiteStateStore(str(path))
        with pytest.raises(LeadershipError, match=r"held by another master \(first:1\)"):
            store.acquire("second:2", wait_s=0.6)
        holder.kill()  # the kernel drops a dead holder's lock
        holder.wait()
        store.acquire("second:2", wait_s=5)
        store.close()
    finally:
        holder.kill()
        holder.wait()


def test_the_etcd_store_needs_no_client_package() -> None:
    """It speaks to etcd's gateway through http.client (etcd_gateway): neither etcd3gw nor
    requests is imported, even by a master that opens an etcd store."""
    probe = ("import sys, trainfeed.master.stores as s\n"
             "try:\n    s.open_state_store('etcd://127.0.0.1:1/x')\n"
             "except ConnectionError as e:\n    print(type(e).__name__)\n"
             "print(sorted({'etcd3gw', 'requests'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.split() == ["EtcdUnavailableError", "[]"], result.stdout

