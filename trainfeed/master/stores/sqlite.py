"""`sqlite:///path` (or a plain path): job state in an embedded SQLite file, the default (e.g. on
a Kubernetes PersistentVolume)."""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from trainfeed.master.stores.base import SavedJob, wait_for_leadership

__all__ = ["SQLiteStateStore"]


class SQLiteStateStore:
    """Snapshots and journals in one SQLite file in WAL mode: an append is one small commit.

    Leadership is an exclusive `flock` on `<path>.lock`: released by the kernel when the
    process dies, so a restarted master takes over at once. (Locks on network file systems vary:
    on NFS or GlusterFS run one master per state file, e.g. a Deployment with one replica.)
    """

    def __init__(self, path: str):
        self.path = path
        self.url = f"sqlite:///{os.path.abspath(path)}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._lock = threading.Lock()
        self._lock_file: int | None = None
        self._db: sqlite3.Connection | None = sqlite3.connect(path, check_same_thread=False,
                                                              isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash (the master's failure mode); only a power
        # loss can drop the last commits, and FULL would fsync on every lease.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS snapshots (job TEXT PRIMARY KEY, "
                         "state TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS journal (id INTEGER PRIMARY KEY "
                         "AUTOINCREMENT, job TEXT NOT NULL, ops TEXT NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS journal_job ON journal (job, id)")
        self._migrate_whole_snapshots()

    @classmethod
    def from_url(cls, url: str) -> SQLiteStateStore:
        """`sqlite:///abs/path` (the path "/abs/path"), `sqlite://rel/path`, or a plain path."""
        return cls(url.partition("://")[2] if "://" in url else url)

    def _migrate_whole_snapshots(self) -> None:
        """State files of trainfeed 0.1 kept one whole snapshot per job in `jobs`."""
        db = self._conn()
        if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='jobs'").fetchone():
            with _transaction(db):
                db.execute("INSERT OR IGNORE INTO snapshots (job, state) "
                           "SELECT name, state FROM jobs")
                db.execute("DROP TABLE jobs")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"state store {self.path} is closed")
        return self._db

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        if self._lock_file is not None:
            return
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)

        def try_lock() -> str | None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                return os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"

        try:
            wait_for_leadership(
                try_lock, wait_s,
                refusal=lambda holder: (f"state {self.path} is held by another master "
                                        f"({holder}); only one master may serve a state file"),
                waiting=lambda holder: (f"state {self.path} is held by another master "
                                        f"({holder}); waiting for it"))
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode(), 0)
        self._lock_file = fd

    def leading(self) -> bool:
        return self._lock_file is not None  # a flock lasts as long as the process

    def load_jobs(self) -> dict[str, SavedJob]:
        with self._lock:
            db = self._conn()
            jobs = {job: SavedJob(json.loads(state))
                    for job, state in db.execute("SELECT job, state FROM snapshots")}
            for job, ops in db.execute("SELECT job, ops FROM journal ORDER BY id"):
                if job in jobs:
                    jobs[job].journal.extend(json.loads(ops))
        return jobs

    def append(self, job: str, ops: Sequence[Any]) -> None:
        if not ops:
            return
        text = json.dumps(list(ops), separators=(",", ":"))
        with self._lock:
            self._conn().execute("INSERT INTO journal (job, ops) VALUES (?, ?)", (job, text))

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        rows = [(job, json.dumps(list(ops), separators=(",", ":")))
                for job, ops in ops_by_job.items() if ops]
        if not rows:
            return
        with self._lock:
            db = self._conn()
            with _transaction(db):
                db.executemany("INSERT INTO journal (job, ops) VALUES (?, ?)", rows)

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        text = json.dumps(snapshot, separators=(",", ":"))
        with self._lock:
            db = self._conn()
            with _transaction(db):
                db.execute("INSERT OR REPLACE INTO snapshots (job, state) VALUES (?, ?)",
                           (job, text))
                db.execute("DELETE FROM journal WHERE job = ?", (job,))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_file is not None:
                os.close(self._lock_file)  # releases the flock
                self._lock_file = None


class _transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK on an exception (autocommit connections)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
