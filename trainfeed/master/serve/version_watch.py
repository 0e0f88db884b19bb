"""Newer versions of the datasets a master's jobs read (issue 38, "an append a running job never
sees").

A job reads the version of its dataset it was created on until it ends, also when its readers
restart under the same job name (trainfeed.formats.manifest, "Versions"): after `trainfeed upload
--append`, a job kept reading version 1 without a word, and a job restarted under its old name
never got the new records. So the master re-reads the current manifest of every dataset its jobs
read, at most every VERSION_CHECK_S, and when a newer version than a job's is published:

- logs it once per job and newer version (a warning naming both versions and how to move);
- `/status.json` (`newer_version`), the status page and `trainfeed status --watch` show it.

How to move: a new job name (TRAINFEED_JOB or job=...): its readers read the newest version from
its first epoch. Following the newest version inside a running job (at its next epoch) would
change the job's partition plan under its ledger, journal and readers' checkpoints; it is not
offered (the notice says so by naming only the way that works).

Reads run on a thread (`asyncio.to_thread`), never on the event loop that serves the readers;
storage refuses non-regular files unopened (trainfeed.storage), so a FIFO put in place of a
manifest fails the read at once instead of waiting for a writer. A read that fails is logged
at debug level and tried again at the next check: a dataset being re-uploaded is not an error of
the job. Thread-safe.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainfeed.formats.manifest import read_manifest
from trainfeed.master.core.jobs import Job
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)

# A dataset's current manifest is re-read at most this often (seconds): an append shows within
# this, and a master of many jobs of one dataset reads it once per period.
VERSION_CHECK_S = 10.0
# ...and at most this share of the time: a storage where a read of every manifest takes 4 s is
# read every 20 s, not every 10.
VERSION_READ_SHARE = 0.2


@dataclass(frozen=True)
class Pinned:
    """A job and the version of its dataset it reads."""

    job: str
    dataset: str
    version: int


@dataclass(frozen=True)
class NewerVersion:
    """The newest published version of a job's dataset, when newer than the job's."""

    version: int
    num_records: int

    def notice(self, pinned: Pinned) -> str:
        """What the master logs and the page shows: both versions, and how to move."""
        return (f"job {pinned.job!r} reads version {pinned.version} of dataset "
                f"{pinned.dataset!r}; version {self.version} ({self.num_records:,} records) is "
                f"published. A job reads the version it was created on until it ends, also when "
                f"its readers restart under the same job name: to read version {self.version}, "
                f"start the readers under a new job name (TRAINFEED_JOB or job=...)")


def pinned(jobs: Iterable[Job]) -> list[Pinned]:
    """Each job with the dataset version it reads."""
    return [Pinned(job.name, job.manifest.name, job.manifest.dataset_version) for job in jobs]


class VersionWatch:
    """The newest version of each dataset read (see the module's docstring)."""

    def __init__(self, storage: Storage):
        self._storage = storage
        self._lock = threading.Lock()
        self._newest: dict[str, NewerVersion] = {}  # dataset -> its current version
        self._logged: dict[str, int] = {}  # job -> the newest version logged for it

    def read(self, datasets: Iterable[str]) -> None:
        """Re-reads the current manifest of each of `datasets` (blocking: call it on a thread);
        forgets the datasets not named."""
        newest: dict[str, NewerVersion] = {}
        for name in sorted(set(datasets)):
            try:
                manifest = read_manifest(self._storage, name)
            except Exception as e:  # unpublished, being rewritten, unreadable: try again later
                logger.debug("dataset %r: cannot read its current manifest: %s: %s", name,
                             type(e).__name__, e)
                with self._lock:
                    known = self._newest.get(name)
                if known is not None:
                    newest[name] = known
                continue
            newest[name] = NewerVersion(manifest.dataset_version, manifest.num_records)
        with self._lock:
            self._newest = newest

    def newer(self, pinned: Pinned) -> NewerVersion | None:
        """The dataset's newest version if newer than the one `pinned` reads, else None."""
        with self._lock:
            found = self._newest.get(pinned.dataset)
        return found if found is not None and found.version > pinned.version else None

    def log_new(self, jobs: Iterable[Pinned]) -> list[str]:
        """Logs (a warning) each job's newer version the first time it is seen; returns what
        was logged. Forgets the jobs not named."""
        said = []
        jobs = list(jobs)
        for pinned in jobs:
            found = self.newer(pinned)
            if found is None or self._logged.get(pinned.job, 0) >= found.version:
                continue
            self._logged[pinned.job] = found.version
            said.append(found.notice(pinned))
            logger.warning("%s", said[-1])
        names = {p.job for p in jobs}
        self._logged = {job: v for job, v in self._logged.items() if job in names}
        return said


async def watch_versions(watch: VersionWatch, jobs: Callable[[], list[Pinned]],
                         stop: asyncio.Event, check_s: float = VERSION_CHECK_S) -> None:
    """Until `stop`: reads the current versions of the datasets `jobs()` (called on the loop)
    read, on a thread, then logs the newer ones; every `check_s` at least, and so that reads
    take at most VERSION_READ_SHARE of the time."""
    while not stop.is_set():
        pinned = jobs()
        started = time.monotonic()
        if pinned:
            try:
                await asyncio.to_thread(watch.read, [p.dataset for p in pinned])
                watch.log_new(jobs())
            except Exception:  # the watch must outlive one bad read
                logger.exception("checking the datasets' versions failed")
        took = time.monotonic() - started
        await asyncio.sleep(max(check_s, took / VERSION_READ_SHARE))
