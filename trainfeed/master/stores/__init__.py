"""Where the master keeps job state so that a restarted master resumes every job.

One small interface (base.StateStore) and several backends, looked up by URL scheme in
:data:`STORES`:

- `sqlite:///path/state.db` or a plain path: an embedded SQLite file (the default);
- `etcd://host:port[/prefix][?ttl=S]`: etcd, for a master that fails over to a standby (its
  client is the `etcd` extra, imported only when such a store is opened);
- `memory://`: nothing survives a restart (tests, throwaway runs).

See base.py for the snapshot-plus-journal form of a job and the leadership rules.
"""
from __future__ import annotations

from trainfeed import settings
from trainfeed.master.stores.base import ACQUIRE_POLL_S, SavedJob, StateStore
from trainfeed.master.stores.etcd import EtcdStateStore
from trainfeed.master.stores.memory import MemoryStateStore
from trainfeed.master.stores.sqlite import SQLiteStateStore
from trainfeed.redaction import redact_url

__all__ = [
    "ACQUIRE_POLL_S",
    "DEFAULT_STATE_PATH",
    "EtcdStateStore",
    "STATE_ENV",
    "STORES",
    "MemoryStateStore",
    "SQLiteStateStore",
    "SavedJob",
    "StateStore",
    "open_state_store",
]

DEFAULT_STATE_PATH = settings.STATE.default
STATE_ENV = settings.STATE.name


#: URL scheme -> the store class behind it.
STORES: dict[str, type[StateStore]] = {
    "etcd": EtcdStateStore,
    "memory": MemoryStateStore,
    "sqlite": SQLiteStateStore,
}


def open_state_store(url: str | None = None) -> StateStore:
    """Opens the store named by `url` (default: `$TRAINFEED_STATE`, else ./trainfeed-master.db).

    Raises:
        ValueError: an unknown scheme, naming the ones there are.
    """
    url = url or settings.STATE.get()
    scheme = url.partition("://")[0] if "://" in url else "sqlite"  # a plain path: SQLite
    store = STORES.get(scheme)
    if store is None:
        raise ValueError(f"unknown state store {scheme!r} in {redact_url(url)!r}; "
                         f"expected one of {sorted(STORES)}")
    return store.from_url(url)
