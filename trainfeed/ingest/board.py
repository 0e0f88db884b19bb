"""The uploads board: each packer's live progress, on the storage, for `trainfeed status
--uploads`, the master's status page and the commit's refusals.

Every process packing an upload (an index of a cluster upload, or a plain `trainfeed upload`)
keeps one small JSON record at `_uploads/<dataset>/<fingerprint>/<slice-NNNNN|local>.json` in the
storage root: records done and planned, bytes, records/s, state (running, done, failed with its
reason), rewritten atomically by one thread at most every WRITE_INTERVAL_S and at least every
HEARTBEAT_S, so that a record older than STALE_S means its packer is gone (killed, its node
lost) rather than slow. The commit that publishes the upload replaces its records with one
`published.json` and removes every other record of the dataset (replaced or abandoned uploads,
whose data `remove_stale_data` removes at the same moment).

Why one folder at the storage root, not the upload's staging area: the readers of the board (a
master refreshing its page every few seconds) find every upload of the storage with one listing
of `_uploads/`, whose size is the uploads in progress plus one record per dataset, never with a
listing of every dataset's shards. `_uploads` cannot be a dataset's name (names start with a
letter or digit); a namespaced name `a/b` is kept as `a~b` (`~` is not allowed in names).

Records name no URL and no credential: a failure's reason is redacted before it is written.
trainfeed.ingest.board_summary sums a board's records into uploads.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainfeed.errors import CorruptDatasetError
from trainfeed.ingest.plan import ShardPlan
from trainfeed.redaction import redact_text
from trainfeed.storage import Storage, access_error

logger = logging.getLogger(__name__)

BOARD_DIR = "_uploads"
RECORD_VERSION = 1
PUBLISHED_NAME = "published.json"
# A packer's record is rewritten at most this often (a shard finishing), so that a thousand
# packers cost a storage a few hundred small writes a second at most.
WRITE_INTERVAL_S = 2.0
# ...and at least this often, with or without a shard finished: the heartbeat that tells a slow
# packer (one large shard, --jpeg-restarts) from a dead one.
HEARTBEAT_S = 10.0
# A running record this old is flagged stale: six heartbeats missed, which a loaded packer or a
# storage hiccup does not explain, and a packer killed without a word (SIGKILL, OOM, a lost
# node) does. Clocks of packers and readers are assumed within a few seconds (NTP).
STALE_S = 60.0
# How long the end of a packer waits for a record being written (a storage that hangs).
JOIN_S = 5.0
# A packer's record is well under 2 KiB; anything larger on the board was not written by one
# (any storage writer can drop files there) and is left unread: the master's page reads the
# board, and must not load a file of any size because it lies under _uploads/.
MAX_RECORD_BYTES = 64 * 1024
# The records read in one look at the board: the uploads of a storage are tens, each of up to a
# few hundred slices. Past this many, the rest are ignored (and said so in the log, once a look).
MAX_RECORDS = 10_000

# A record's states; a running record older than STALE_S is shown stale.
RUNNING, DONE, FAILED, STALE, PUBLISHED = "running", "done", "failed", "stale", "published"


def dataset_key(dataset: str) -> str:
    """The board's folder name for `dataset` (`a/b` -> `a~b`: one level, unambiguous)."""
    return dataset.replace("/", "~")


def record_path(dataset: str, fingerprint: str, index: int | None) -> str:
    """The record of slice `index` of an upload (None: a plain `trainfeed upload`)."""
    name = "local" if index is None else f"slice-{index:05d}"
    return f"{BOARD_DIR}/{dataset_key(dataset)}/{fingerprint[:16]}/{name}.json"


@dataclass
class PackerProgress:
    """One packer's record (a slice of a cluster upload, or a whole local upload)."""

    dataset: str
    fingerprint: str  # the upload's, first 16 hex digits (its data folder's name)
    index: int | None  # the slice (JOB_COMPLETION_INDEX); None for a plain upload
    slices: int  # slices of the upload (1 for a plain upload)
    records_total: int  # this packer's
    bytes_total: int
    shards_total: int
    upload_records: int  # the whole upload's
    upload_shards: int
    records_done: int = 0
    bytes_done: int = 0
    shards_done: int = 0
    resumed_records: int = 0  # finished by an earlier attempt: not part of the rate
    state: str = RUNNING
    reason: str | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    records_per_s: float = 0.0
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    version: int = RECORD_VERSION

    @property
    def path(self) -> str:
        return record_path(self.dataset, self.fingerprint, self.index)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


class ProgressReporter:
    """Keeps one packer's record on the board while it packs (see the module docstring).

    A context manager: entering writes the first record (state running) and starts the writer
    thread; `add` counts a finished shard (cheap: no I/O on the caller's thread); leaving stops
    the thread and writes the last record: done, or failed with the exception's reason
    (interrupted for Ctrl-C). A write that fails is logged and retried at the next beat: the
    board is for people, and never fails an upload.

    Enter it after starting packing processes by fork (trainfeed.ingest.pool forks only a
    process running one thread).
    """

    def __init__(self, storage: Storage, progress: PackerProgress,
                 clock: Callable[[], float] = time.time,
                 interval_s: float = WRITE_INTERVAL_S, heartbeat_s: float = HEARTBEAT_S):
        self.storage = storage
        self._progress = progress
        self._clock = clock
        progress.started_at = progress.updated_at = clock()
        self._interval_s, self._heartbeat_s = interval_s, heartbeat_s
        self._lock = threading.Lock()
        self._changed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._warned = False

    def resumed(self, shards: Sequence[ShardPlan], sizes: Sequence[int]) -> None:
        """Counts `shards` as finished by an earlier attempt (`sizes`: the upload's records')."""
        with self._lock:
            p = self._progress
            p.records_done += sum(len(s) for s in shards)
            p.resumed_records += sum(len(s) for s in shards)
            p.bytes_done += sum(sum(sizes[s.start:s.stop]) for s in shards)
            p.shards_done += len(shards)
            self._changed = True

    def add(self, records: int, num_bytes: int) -> None:
        """Counts one finished shard of `records` records and `num_bytes` planned bytes."""
        with self._lock:
            p = self._progress
            p.records_done += records
            p.bytes_done += num_bytes
            p.shards_done += 1
            self._changed = True

    def snapshot(self) -> PackerProgress:
        """A copy of the record as it would be written now."""
        with self._lock:
            p = self._progress
            now = self._clock()
            run_s = max(now - p.started_at, 1e-9)
            p.updated_at = now
            p.records_per_s = max(0, p.records_done - p.resumed_records) / run_s
            self._changed = False
            return replace(p)

    def _write(self) -> None:
        record = self.snapshot()
        try:
            self.storage.write_atomic(record.path, record.to_json())
        except Exception as e:  # the board never fails an upload
            # Once at warning level: storage that lets this process write its dataset's folder
            # but not the board's (an S3 policy on a prefix) would otherwise flood the log.
            logger.log(logging.DEBUG if self._warned else logging.WARNING,
                       "cannot write upload progress %s to %s: %s (retried at the next beat; "
                       "`trainfeed status --uploads` will not show this packer)",
                       record.path, self.storage.url, e)
            self._warned = True

    def _run(self) -> None:
        last = self._clock()
        while not self._stop.wait(self._interval_s):
            with self._lock:
                due = self._changed or self._clock() - last >= self._heartbeat_s
            if due:
                self._write()
                last = self._clock()

    def __enter__(self) -> ProgressReporter:
        self._write()
        self._thread = threading.Thread(target=self._run, name="trainfeed-upload-progress",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: object) -> None:
        self.close(error)

    def close(self, error: BaseException | None = None) -> None:
        """Stops the writer thread and writes the last record: done if `error` is None, else
        failed with its reason. Idempotent (the first call's outcome stays); also for a
        reporter never entered (a packer that failed before packing)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                logger.warning("the upload's progress writer has been writing to %s for over "
                               "%.0f s; the upload goes on without waiting for it",
                               self.storage.url, JOIN_S)
            self._thread = None
        with self._lock:
            if error is None:
                self._progress.state = DONE
            else:
                self._progress.state = FAILED
                self._progress.reason = (
                    "interrupted" if isinstance(error, KeyboardInterrupt)
                    else redact_text(f"{type(error).__name__}: {error}"))
        self._write()


def publish(storage: Storage, dataset: str, fingerprint: str, num_records: int,
            num_shards: int, num_bytes: int, slices: int | None,
            clock: Callable[[], float] = time.time) -> None:
    """Marks an upload published on the board: writes its `published.json` (from its packers'
    records: when it started), then removes every other record of the dataset. Idempotent;
    never raises (the dataset is published already: the board is for people). `slices` is
    None for a plain upload."""
    folder = f"{BOARD_DIR}/{dataset_key(dataset)}"
    try:
        found = _find(storage, folder, temporary=True)
        mine = f"{folder}/{fingerprint[:16]}/"
        records = [rel for rel in found if rel.endswith(".json")]
        started = [r["started_at"] for path, r in _read_all(storage, records).items()
                   if path.startswith(mine) and isinstance(r.get("started_at"), (int, float))]
        now = clock()
        record = {"version": RECORD_VERSION, "dataset": dataset, "fingerprint": fingerprint[:16],
                  "state": PUBLISHED, "slices": slices or 1, "index": None if slices is None
                  else 0, "records_total": num_records,
                  "records_done": num_records, "shards_total": num_shards,
                  "shards_done": num_shards, "bytes_done": num_bytes,
                  "started_at": min(started, default=now), "updated_at": now}
        target = f"{mine}{PUBLISHED_NAME}"
        storage.write_atomic(target, json.dumps(record, sort_keys=True).encode())
        for rel in found:
            if rel != target:
                storage.fs.rm(storage.path(rel))
        if storage.is_local:  # folders are real there: those of other uploads go too
            for parent in {rel.rsplit("/", 1)[0] for rel in found} - {mine.rstrip("/")}:
                try:
                    os.rmdir(storage.path(parent))
                except OSError:
                    pass  # written again since: a re-run index; the next publish removes it
    except Exception as e:  # the dataset is published: warn only
        logger.warning("dataset %r published, but its uploads board at %s/%s was not updated: "
                       "%s", dataset, storage.url, folder, e)


def last_report(storage: Storage, dataset: str, fingerprint: str, index: int,
                now: float | None = None) -> str:
    """What slice `index`'s packer last said on the board, for the commit's refusal: "" if it
    said nothing (never started, or a storage the board cannot be read from)."""
    try:
        r = json.loads(storage.read_bytes(record_path(dataset, fingerprint, index)))
        ago = max(0.0, (time.time() if now is None else now) - float(r["updated_at"]))
        state = STALE if r["state"] == RUNNING and ago > STALE_S else str(r["state"])
        return (f"its packer on {r['host']} last reported {int(r['records_done'])} of "
                f"{int(r['records_total'])} records {ago:.0f} s ago ({state})")
    except Exception:  # a hint only
        return ""


def _find(storage: Storage, folder: str, temporary: bool = False) -> dict[str, dict[str, Any]]:
    """Every record file below `folder` (paths relative to the root) with its listing info,
    fresh (fsspec's listing cache dropped first); with `temporary`, also the temporary files
    of writes cut short (a packer killed while writing its record)."""
    base = storage.path(folder)
    _forget_listings(storage, base)
    try:
        found = storage.fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    except PermissionError as e:
        raise access_error(storage.url, e) from e
    finally:
        _forget_listings(storage, base)
    prefix = storage.root.rstrip("/") + "/"
    return {path[len(prefix):] if path.startswith(prefix) else path: info
            for path, info in found.items()
            if temporary or (path.endswith(".json") and ".tmp-" not in path.rsplit("/", 1)[-1])}


def _forget_listings(storage: Storage, base: str) -> None:
    """Drops fsspec's cached listings of `base` and every folder below it. s3fs caches each
    folder's listing, and `find` fills that cache without replacing what it holds; a read then
    checks the cached listing, so a long-lived reader (the master) would miss every record
    written by another process after its first look."""
    cache = getattr(storage.fs, "dircache", None)
    for key in [k for k in (cache or ()) if k == base or k.startswith(base + "/")]:
        storage.fs.invalidate_cache(key)
    storage.fs.invalidate_cache(base)


def _read_all(storage: Storage, paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The records at `paths` (relative to the root) that could be read and parsed. On object
    stores they are fetched concurrently (fsspec's `cat` of many paths, in batches): one GET
    after another pays a round trip each, a thousand of them 5-14 s on a local SeaweedFS."""
    rels = list(paths)
    if not rels:
        return {}
    if storage.is_local:
        blobs = {}
        for rel in rels:
            try:
                blobs[rel] = storage.read_bytes(rel)
            except FileNotFoundError:
                continue  # removed since the listing: the next look has it
            except CorruptDatasetError as e:  # a FIFO, a device, a link out: never a packer's
                logger.warning("uploads board: %s; ignored", e)
    else:
        got = storage.fs.cat([storage.path(rel) for rel in rels], on_error="omit")
        blobs = {rel: got[storage.path(rel)] for rel in rels if storage.path(rel) in got}
    out = {}
    for rel, blob in blobs.items():
        if len(blob) > MAX_RECORD_BYTES:  # grew after the listing said it was small
            continue
        try:
            raw = json.loads(blob)
        except ValueError:
            continue  # being replaced (never on these storages' atomic writes), or damaged
        if isinstance(raw, dict) and well_formed(raw):
            out[rel] = raw
    return out


_INTS = ("slices", "records_total", "bytes_total", "shards_total", "upload_records",
         "upload_shards", "records_done", "bytes_done", "shards_done", "resumed_records", "pid",
         "version")
_FLOATS = ("started_at", "updated_at", "records_per_s")
_STATES = (RUNNING, DONE, FAILED, STALE, PUBLISHED)
# Counts and sizes beyond this are no packer's (2^53: what a JSON number holds exactly).
_MAX_COUNT = 2 ** 53


def well_formed(record: dict[str, Any]) -> bool:
    """Whether a board record has a packer's shape: `dataset` and a known `state`, and every
    known field that is present of its type and in range. Anyone who can write to storage can
    drop a record, and a field of another type (an `index` that is text, a count that is a
    list) would break the page's summary of every upload (trainfeed.ingest.board_summary)."""
    def whole(v: Any, low: int = 0) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and low <= v <= _MAX_COUNT

    def number(v: Any) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v) and 0 <= v <= _MAX_COUNT)

    if not isinstance(record.get("dataset"), str) or record.get("state") not in _STATES:
        return False
    return (all(whole(record[k]) for k in _INTS if k in record)
            and all(number(record[k]) for k in _FLOATS if k in record)
            and (record.get("index") is None or whole(record["index"]))
            and all(isinstance(record.get(k, ""), str) for k in ("fingerprint", "host"))
            and (record.get("reason") is None or isinstance(record["reason"], str)))


class Board:
    """Reads a storage's board, re-reading only the records whose listing entry changed.

    Thread-safety: none; wrap it (the master's page does, trainfeed.master.serve.status)."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._cache: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._said: set[str] = set()  # notes of files left unread, logged once each

    def records(self) -> list[dict[str, Any]]:
        found = _bounded(_find(self.storage, BOARD_DIR), self._said)
        changed = [rel for rel, info in found.items()
                   if rel not in self._cache or self._cache[rel][0] != _version_of(info)]
        fresh = _read_all(self.storage, changed)
        self._cache = {rel: (_version_of(found[rel]), fresh[rel]) if rel in fresh
                       else self._cache[rel] for rel in found
                       if rel in fresh or rel in self._cache}
        return [record for _, record in self._cache.values()]


def _bounded(found: dict[str, dict[str, Any]], said: set[str]) -> dict[str, dict[str, Any]]:
    """The listing's entries the board reads: files of at most MAX_RECORD_BYTES (a listing
    without sizes is read, and the size checked on the bytes), the first MAX_RECORDS by path.
    What is left out is logged once per distinct note (`said` keeps them): the page looks
    every few seconds."""
    small = {rel: info for rel, info in found.items()
             if int(info.get("size") or 0) <= MAX_RECORD_BYTES}
    notes = []
    if len(small) < len(found):
        notes.append(f"{len(found) - len(small)} file(s) over {MAX_RECORD_BYTES} bytes ignored "
                     f"(a packer's record is under 2 KiB), e.g. {min(set(found) - set(small))!r}")
    if len(small) > MAX_RECORDS:
        notes.append(f"{len(small)} records, only the first {MAX_RECORDS} read")
        small = {rel: small[rel] for rel in sorted(small)[:MAX_RECORDS]}
    for note in notes:
        if note not in said and len(said) < MAX_RECORDS:
            said.add(note)
            logger.warning("uploads board: %s", note)
    return small


def _version_of(info: dict[str, Any]) -> Any:
    """What changes when a record is rewritten: its size and time (or S3's ETag)."""
    return (info.get("size"), info.get("mtime"), info.get("ETag") or info.get("LastModified"))


__all__ = ["BOARD_DIR", "Board", "PackerProgress", "ProgressReporter", "STALE_S", "last_report",
           "publish", "record_path"]
