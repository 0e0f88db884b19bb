"""Where the master keeps job state so that a restarted master resumes every job.

One small interface, several backends, looked up by URL scheme:
- `sqlite:///path/state.db` or a plain path: an embedded SQLite file (the default, e.g. on a
  Kubernetes PersistentVolume);
- `memory://`: nothing survives a restart (tests, throwaway runs).

A job's state is a JSON snapshot saved before the master answers the call that changed it.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from typing import Any, Protocol

DEFAULT_STATE_PATH = "trainfeed-master.db"
STATE_ENV = "TRAINFEED_STATE"


class StateStore(Protocol):
    """Durable job snapshots. Implementations are safe to call from one thread at a time."""

    def load_jobs(self) -> dict[str, dict[str, Any]]:
        """Every saved job's latest snapshot, by job name."""
        ...

    def save_job(self, job: str, state: dict[str, Any]) -> None:
        """Durably replaces the snapshot of `job` before returning."""
        ...

    def close(self) -> None:
        """Releases the store; safe to call twice."""
        ...


class MemoryStateStore:
    """Keeps snapshots in this process only."""

    def __init__(self) -> None:
        self._jobs: dict[str, str] = {}

    def load_jobs(self) -> dict[str, dict[str, Any]]:
        return {job: json.loads(state) for job, state in self._jobs.items()}

    def save_job(self, job: str, state: dict[str, Any]) -> None:
        self._jobs[job] = json.dumps(state)

    def close(self) -> None:
        pass


class SQLiteStateStore:
    """Snapshots in one SQLite file, in WAL mode: a commit is one append, readers never block."""

    def __init__(self, path: str):
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = sqlite3.connect(path, check_same_thread=False,
                                                              isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (the master's failure mode); only a power
        # loss can drop the last commits, and FULL would fsync on every lease.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS jobs (name TEXT PRIMARY KEY, state TEXT)")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"state store {self.path} is closed")
        return self._db

    def load_jobs(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            rows = self._conn().execute("SELECT name, state FROM jobs").fetchall()
        return {name: json.loads(state) for name, state in rows}

    def save_job(self, job: str, state: dict[str, Any]) -> None:
        text = json.dumps(state, separators=(",", ":"))
        with self._lock:
            self._conn().execute("INSERT OR REPLACE INTO jobs (name, state) VALUES (?, ?)",
                                 (job, text))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


STORES = {"sqlite": SQLiteStateStore, "memory": MemoryStateStore}


def open_state_store(url: str | None = None) -> StateStore:
    """Opens the store named by `url` (default: `$TRAINFEED_STATE`, else ./trainfeed-master.db)."""
    url = url or os.environ.get(STATE_ENV) or DEFAULT_STATE_PATH
    scheme, sep, rest = url.partition("://")
    if not sep:
        return SQLiteStateStore(url)
    if scheme not in STORES:
        raise ValueError(f"unknown state store {scheme!r} in {url!r}; "
                         f"expected one of {sorted(STORES)}")
    if scheme == "memory":
        return MemoryStateStore()
    # sqlite:///abs/path has rest "/abs/path"; sqlite://rel/path has "rel/path".
    return SQLiteStateStore(rest)
