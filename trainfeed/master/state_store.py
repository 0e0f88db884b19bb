"""Where the master keeps job state so that a restarted master resumes every job.

One small interface, several backends, looked up by URL scheme:
- `sqlite:///path/state.db` or a plain path: an embedded SQLite file (the default, e.g. on a
  Kubernetes PersistentVolume);
- `etcd://host:port[/prefix]`: etcd, for a master that fails over to a standby;
- `memory://`: nothing survives a restart (tests, throwaway runs).

A job's state is a snapshot plus a journal: every state change (a lease, a report, an expiry, an
epoch rollover) is appended as a small op before the master answers the call that made it, and
every so often the master writes a fresh snapshot, which drops the journal before it. Appending a
few ops costs the same whatever the job's size, where saving the whole ledger per change grew
with the number of partitions (74 round trips/s at 100,000 partitions).

Leadership: two masters serving the same state would hand every task out twice. `acquire` blocks
until this process is the only master of the store (an etcd lease-backed key; an exclusive file
lock beside a SQLite file), and a store that loses it raises LeadershipError on the next write.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainfeed import settings
from trainfeed.errors import LeadershipError

logger = logging.getLogger(__name__)

DEFAULT_STATE_PATH = settings.STATE.default
STATE_ENV = settings.STATE.name
# How often a master waiting for the leadership looks again.
ACQUIRE_POLL_S = 0.5


@dataclass
class SavedJob:
    """What a store holds for one job: the latest snapshot and the ops appended after it."""

    snapshot: dict[str, Any]
    journal: list[Any] = field(default_factory=list)


class StateStore(Protocol):
    """Durable job state. Implementations are called from one thread at a time."""

    url: str

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        """Blocks until `owner` is the only master serving from this store.

        Raises LeadershipError if another master still holds it after `wait_s` seconds
        (None: wait for ever, as a standby master does)."""
        ...

    def leading(self) -> bool:
        """Whether this store still holds the leadership it acquired (an etcd lease can be lost
        without a write noticing; the master polls this and stops)."""
        ...

    def load_jobs(self) -> dict[str, SavedJob]:
        """Every saved job, by name."""
        ...

    def append(self, job: str, ops: Sequence[Any]) -> None:
        """Durably appends JSON-serializable `ops` to the journal of `job` before returning."""
        ...

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        """Atomically replaces the snapshot of `job` and drops its journal (which the snapshot
        includes)."""
        ...

    def close(self) -> None:
        """Releases the store and its leadership; safe to call twice."""
        ...


class MemoryStateStore:
    """Keeps state in this process only (ops are still serialized, to catch what JSON cannot
    hold in tests)."""

    url = "memory://"

    def __init__(self) -> None:
        self._snapshots: dict[str, str] = {}
        self._journals: dict[str, list[str]] = {}

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        pass  # nobody else can see this process's memory

    def leading(self) -> bool:
        return True

    def load_jobs(self) -> dict[str, SavedJob]:
        return {job: SavedJob(json.loads(snapshot),
                              [op for text in self._journals.get(job, [])
                               for op in json.loads(text)])
                for job, snapshot in self._snapshots.items()}

    def append(self, job: str, ops: Sequence[Any]) -> None:
        if ops:
            self._journals.setdefault(job, []).append(json.dumps(list(ops)))

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        self._snapshots[job] = json.dumps(snapshot)
        self._journals.pop(job, None)

    def close(self) -> None:
        pass


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
        deadline = None if wait_s is None else time.monotonic() + wait_s
        logged = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
                if deadline is not None and time.monotonic() >= deadline:
                    os.close(fd)
                    raise LeadershipError(
                        f"state {self.path} is held by another master ({holder}); only one "
                        f"master may serve a state file") from None
                if not logged:
                    logger.warning("state %s is held by another master (%s); waiting for it",
                                   self.path, holder)
                    logged = True
                time.sleep(ACQUIRE_POLL_S)
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


SCHEMES = ("etcd", "memory", "sqlite")


def open_state_store(url: str | None = None) -> StateStore:
    """Opens the store named by `url` (default: `$TRAINFEED_STATE`, else ./trainfeed-master.db)."""
    url = url or settings.STATE.get()
    scheme, sep, rest = url.partition("://")
    if not sep:
        return SQLiteStateStore(url)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown state store {scheme!r} in {url!r}; "
                         f"expected one of {list(SCHEMES)}")
    if scheme == "memory":
        return MemoryStateStore()
    if scheme == "etcd":
        from trainfeed.master.etcd_store import EtcdStateStore  # needs the etcd client
        return EtcdStateStore(url)
    # sqlite:///abs/path has rest "/abs/path"; sqlite://rel/path has "rel/path".
    return SQLiteStateStore(rest)
