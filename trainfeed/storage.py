"""Where datasets live: the one module that turns a storage URL into a filesystem.

Any fsspec URL works: a local or mounted folder (this is how a GlusterFS or NFS volume is used),
`s3://bucket/prefix`, `hdfs://…`. Everything else in trainfeed takes a `Storage` and speaks in
paths relative to it, so URL schemes are parsed here and nowhere else.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from trainfeed import settings
from trainfeed.errors import CorruptDatasetError, StorageAccessError
from trainfeed.redaction import redact_url, scrub

# A network filesystem's FUSE client (GlusterFS) can refuse an open() that races the rename
# replacing the file (ESTALE); the file itself is whole, so a short retry is the remedy.
STALE_RETRIES = 5
STALE_PAUSE_S = 0.02
# What a file that is not a regular one is, for the error that refuses it unopened.
_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (opening it would wait for a writer)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))

# The embedded default: a folder in the working directory, so a laptop needs no setup at all.
DEFAULT_STORAGE = settings.STORAGE.default
STORAGE_ENV = settings.STORAGE.name
S3_ENDPOINT_ENV = settings.S3_ENDPOINT.name


def default_storage_url() -> str:
    """`$TRAINFEED_STORAGE`, else `./trainfeed-data`."""
    return settings.STORAGE.get()


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


@dataclass(frozen=True)
class Storage:
    """A storage root (an fsspec URL) plus the non-secret options needed to reach it.

    Options hold only what every process may see (an S3 endpoint, say); credentials come from the
    environment of each process (`AWS_ACCESS_KEY_ID`, …), so the master can pass `options` to
    workers over the wire without leaking secrets.

    Thread-safety: the fsspec filesystem object is shared; fsspec filesystems are safe to use from
    several threads.
    """

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        fs, _ = fsspec.core.url_to_fs(self.url, **self.options)
        return fs

    @cached_property
    def root(self) -> str:
        """The root as a path of `self.fs` (no scheme)."""
        _, path = fsspec.core.url_to_fs(self.url, **self.options)
        return path.rstrip("/")

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def path(self, *parts: str) -> str:
        """The filesystem path of `parts` below the root."""
        return "/".join([self.root, *(p.strip("/") for p in parts if p)])

    def child(self, *parts: str) -> Storage:
        """A Storage rooted at `parts` below this one (the folder of one dataset, say)."""
        return Storage(self.url.rstrip("/") + "/" + "/".join(p.strip("/") for p in parts),
                       self.options)

    def exists(self, *parts: str) -> bool:
        return bool(self.fs.exists(self.path(*parts)))

    @cached_property
    def real_root(self) -> str:
        """The root with every symbolic link resolved (local storage)."""
        return os.path.realpath(self.root)

    def local_file(self, *parts: str) -> str:
        """The real path of file `parts` of a local (or mounted) storage, checked to be safe
        to open: inside the root once symbolic links are resolved, and a regular file.

        Symbolic links are resolved and confined rather than refused: trainfeed writes none,
        but an operator may link a file within the folder, or the folder itself elsewhere (its
        real path is then the root). One that leads out of the root is refused, as a `..` in a
        manifest is. FIFOs, devices, sockets and directories are refused unopened: opening a
        FIFO waits for a writer that never comes, and a device gives endless or harmful bytes.

        Raises:
            FileNotFoundError: no such file.
            CorruptDatasetError: naming the file, outside the root or not a regular file.
        """
        shown = f"{redact_url(self.url)}/{'/'.join(p.strip('/') for p in parts if p)}"
        real = os.path.realpath(self.path(*parts))
        if os.path.commonpath([real, self.real_root]) != self.real_root:
            raise CorruptDatasetError(
                f"{shown} leads out of {redact_url(self.url)} (a symbolic link to {real!r}): "
                f"refused unopened; a dataset's files lie inside its folder")
        check_regular(os.stat(real).st_mode, shown)
        return real

    def read_bytes(self, *parts: str) -> bytes:
        """The whole file. Raises FileNotFoundError, StorageAccessError naming the URL, or
        CorruptDatasetError for a local file that is not a regular one inside the root
        (`local_file`)."""
        if self.is_local:
            return self._stale_retried(lambda: self._read_local(*parts))
        path = self.path(*parts)
        return self._stale_retried(lambda: bytes(self.fs.cat_file(path)))

    def _stale_retried(self, read: Callable[[], bytes]) -> bytes:
        """`read()`, again after a pause while it fails with ESTALE (an NFS or FUSE handle made
        stale by a rename on another host); a PermissionError becomes a StorageAccessError."""
        for attempt in range(STALE_RETRIES + 1):
            try:
                return read()
            except PermissionError as e:
                raise access_error(self.url, e) from e
            except OSError as e:
                if e.errno != errno.ESTALE or attempt == STALE_RETRIES:
                    raise
                time.sleep(STALE_PAUSE_S)
        raise AssertionError("unreachable")

    def _read_local(self, *parts: str) -> bytes:
        """`read_bytes` of a local file: checked (`local_file`), then opened without waiting
        and checked again on the open file, so that a FIFO put in its place between the two
        is refused as well, not waited on."""
        shown = f"{redact_url(self.url)}/{'/'.join(p.strip('/') for p in parts if p)}"
        fd = os.open(self.local_file(*parts), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            check_regular(os.fstat(fd).st_mode, shown)
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)

    def write_atomic(self, relpath: str, data: bytes) -> None:
        """Writes `data` so that readers see either the old file or the whole new one.

        Local (and FUSE-mounted) folders: write a temporary sibling, fsync, then rename over the
        target. Object stores (S3): a single PUT is already atomic.
        """
        target = self.path(relpath)
        if not self.is_local:
            self.fs.pipe_file(target, data)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def options_json(self) -> str:
        return json.dumps(self.options, sort_keys=True)


def check_regular(mode: int, shown: str) -> None:
    """Raises CorruptDatasetError naming `shown` unless `mode` (os.stat's) is a regular
    file's."""
    if stat.S_ISREG(mode):
        return
    kind = next((what for test, what in _FILE_KINDS if test(mode)), "not a regular file")
    raise CorruptDatasetError(f"{shown} is {kind}, not a regular file: refused unopened; a "
                              f"dataset's files are regular files written by `trainfeed upload`")


def access_error(url: str, cause: BaseException) -> StorageAccessError:
    """A StorageAccessError for `url` that says which credentials apply."""
    hint = ("check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and the endpoint) of this process"
            if url.startswith(("s3://", "s3a://")) else "check this process's permissions")
    shown = redact_url(url)
    return StorageAccessError(f"access to {shown} refused ({scrub(str(cause), url)}); {hint}")


def open_storage(url: str | None = None, *, s3_endpoint: str | None = None,
                 options: dict[str, Any] | None = None) -> Storage:
    """Resolves a storage URL (default: `default_storage_url()`) into a Storage.

    Local paths become absolute, so a URL handed to another process on the same machine (or the
    same mount path in another pod) names the same folder. For `s3://` URLs the endpoint comes from
    `s3_endpoint`, else `$TRAINFEED_S3_ENDPOINT`, else `$AWS_ENDPOINT_URL` (non-AWS servers such as
    SeaweedFS, MinIO or Ceph RGW).
    """
    url = url or default_storage_url()
    opts = dict(options or {})
    if _is_local(url):
        local = url[len("file://"):] if url.startswith("file://") else url
        url = os.path.abspath(os.path.expanduser(local))
    elif url.startswith(("s3://", "s3a://")):
        endpoint = (s3_endpoint or settings.S3_ENDPOINT.get()
                    or settings.AWS_ENDPOINT_URL.get())
        if endpoint:
            opts.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    return Storage(url.rstrip("/") or "/", opts)
