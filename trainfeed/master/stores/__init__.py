"""Where the master keeps job state so that a restarted master resumes every job.

One small interface (base.StateStore) and several backends, looked up by URL scheme in
:data:`STORES`:

- `sqlite:///path/state.db` or a plain path: an embedded SQLite file (the default);
- `etcd://host:port[/prefix][?ttl=S]`: etcd, for a master that fails over to a standby (the
  `etcd` extra, imported only when such a store is opened);
- `memory://`: nothing survives a restart (tests, throwaway runs).

See base.py for the snapshot-plus-journal form of a job and the leadership rules.
"""
from __future__ import annotations

from collections.abc import Callable

from trainfeed import settings
from trainfeed.master.stores.base import ACQUIRE_POLL_S, SavedJob, StateStore
from trainfeed.master.stores.memory import MemoryStateStore
from trainfeed.master.stores.sqlite import SQLiteStateStore
from trainfeed.redaction import redact_url

__all__ = [
    "ACQUIRE_POLL_S",
    "DEFAULT_STATE_PATH",
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


def _sqlite(url: str) -> StateStore:
    # sqlite:///abs/path has the path "/abs/path"; sqlite://rel/path has "rel/path".
    return SQLiteStateStore(url.partition("://")[2])


def _memory(url: str) -> StateStore:
    return MemoryStateStore()


def _etcd(url: str) -> StateStore:
    from trainfeed.master.stores.etcd import EtcdStateStore  # needs the etcd extra

    return EtcdStateStore(url)


#: URL scheme -> opener of the store it names.
STORES: dict[str, Callable[[str], StateStore]] = {
    "etcd": _etcd,
    "memory": _memory,
    "sqlite": _sqlite,
}


def open_state_store(url: str | None = None) -> StateStore:
    """Opens the store named by `url` (default: `$TRAINFEED_STATE`, else ./trainfeed-master.db).

    Raises:
        ValueError: an unknown scheme, naming the ones there are.
    """
    url = url or settings.STATE.get()
    scheme, sep, _ = url.partition("://")
    if not sep:
        return SQLiteStateStore(url)
    opener = STORES.get(scheme)
    if opener is None:
        raise ValueError(f"unknown state store {scheme!r} in {redact_url(url)!r}; "
                         f"expected one of {sorted(STORES)}")
    return opener(url)
