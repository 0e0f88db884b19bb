"""One upload of a dataset at a time: a lock where storage can lock, a check where it cannot."""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time

from trainfeed.errors import ConcurrentUploadError
from trainfeed.formats.manifest import MANIFEST_NAME
from trainfeed.ingest.board import BOARD_DIR
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)

# The lock file of a dataset being uploaded, in its folder (local and mounted storage).
LOCK_NAME = ".upload.lock"


class UploadLock:
    """One upload of a dataset at a time, where storage can lock (local and mounted folders:
    a POSIX lock on `<dataset>/.upload.lock`, which NFS and GlusterFS honour too). Two uploads
    of one dataset replace each other's data: in 11 rounds of two concurrent `--overwrite`
    runs, 3 died with a traceback and 2 left a manifest whose shards the other had deleted.
    The second upload now fails at once, naming the first. The lock is the process's: it ends
    with the process, whatever kills it. Object stores have no such lock: `upload` checks
    before publishing that nobody replaced the dataset meanwhile (`check_not_replaced`)."""

    def __init__(self, folder: Storage, dataset: str):
        self.folder = folder
        self.dataset = dataset
        self.fd: int | None = None

    def __enter__(self) -> UploadLock:
        if not self.folder.is_local:
            return self
        os.makedirs(self.folder.root, exist_ok=True)
        path = os.path.join(self.folder.root, LOCK_NAME)
        while self.fd is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise ConcurrentUploadError(
                        f"dataset {self.dataset!r} in {self.folder.url} is being uploaded by "
                        f"another process ({holder or 'which has just started'}); two uploads "
                        f"of one dataset would replace each other's files, so this one wrote "
                        f"nothing. Wait for that upload to end, then run this one again if its "
                        f"content should replace that one's") from None
                logger.debug("cannot lock %s (%s): relying on the check before publishing",
                             path, e)
                return self  # a filesystem without locks
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file as we opened it: lock the new one
                os.close(fd)
                continue
            self.fd = fd
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, (f"pid {os.getpid()} on {socket.gethostname()}, since "
                            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}").encode(),
                  0)
        return self

    def __exit__(self, *exc: object) -> None:
        """Removes the lock file while still holding it (a waiting process then sees another
        inode and retries), and the dataset's folder if this upload left it empty."""
        if self.fd is None:
            return
        try:
            os.remove(os.path.join(self.folder.root, LOCK_NAME))
            os.rmdir(self.folder.root)
        except OSError:
            pass  # the folder holds the dataset: it stays
        finally:
            os.close(self.fd)
            self.fd = None


def check_not_replaced(folder: Storage, dataset: str, previous: str | None) -> None:
    """Raises ConcurrentUploadError if the published dataset is no longer the one this upload
    found when it started: another upload (on storage that cannot lock) replaced it."""
    current = published_fingerprint(folder)
    if current != previous:
        raise ConcurrentUploadError(
            f"dataset {dataset!r} in {folder.url} was replaced by another upload while this one "
            f"ran (its fingerprint went from {(previous or 'none')[:16]} to "
            f"{(current or 'none')[:16]}); this upload published nothing. Run it again if its "
            f"content should replace that one's (it resumes after the shards it wrote)")


def published_fingerprint(folder: Storage) -> str | None:
    """The fingerprint of the dataset published in `folder`, or None."""
    try:
        return json.loads(folder.read_bytes(MANIFEST_NAME)).get("fingerprint")
    except FileNotFoundError:
        return None


# The storage-wide lock every upload holds while it publishes (local and mounted storage), in
# the uploads board's folder (which no dataset name can be: names start with a letter or digit).
PUBLISH_LOCK = f"{BOARD_DIR}/.publish.lock"
# POSIX locks are the process's: uploads in threads of one process exclude each other here.
_PUBLISHING = threading.Lock()


class PublishLock:
    """The whole storage's publish lock: held from the last check of an upload's name to its
    manifest written. Each upload's own lock (`UploadLock`) is its dataset folder's, so `flowers`
    and `flowers/more` lock different files: both pass the check of nested names at their
    start, and the first to publish makes the other's name unsafe (with `flowers/data`, before
    it was reserved, 2 of 8 such pairs printed "published" and left no manifest, and 4 died
    with a FileNotFoundError). Under this lock the second to publish sees the first's manifest,
    and fails naming it (trainfeed.ingest.run._check_still_free).

    Publishing takes milliseconds (two small atomic writes), so a waiter blocks; the lock is
    the process's and ends with it. The file is never removed (a remover would race a waiter
    onto another inode). Object stores have no lock: there the static rule on names
    (trainfeed.names.check_new_dataset_name) still keeps every name out of another dataset's
    own files, and only the nested-name check can race."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self.fd: int | None = None

    def __enter__(self) -> PublishLock:
        _PUBLISHING.acquire()
        if not self.storage.is_local:
            return self
        path = os.path.join(self.storage.root, PUBLISH_LOCK)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            _PUBLISHING.release()
            raise
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
        except OSError as e:
            os.close(fd)
            logger.debug("cannot lock %s (%s): publishing without it", path, e)
            return self  # a filesystem without locks
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.fd is not None:
                os.close(self.fd)  # closing the descriptor releases its lock
                self.fd = None
        finally:
            _PUBLISHING.release()
