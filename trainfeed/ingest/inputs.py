"""An upload's input, checked before anything is written: the list parsed, every file there,
inside the list's folder and not too large; and its fingerprint (same input, same layout ⇒
same id, which makes a re-run a no-op and names the folder of its shards)."""
from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from stat import S_ISREG

from trainfeed.errors import (
    HardLinkedFilesError,
    MissingFilesError,
    OutsidePathsError,
    OversizeRecordsError,
)
from trainfeed.formats.listfile import ListEntry, ParsedList, outside_paths, parse_list
from trainfeed.ingest.options import UploadOptions
from trainfeed.ingest.plan import Layout

logger = logging.getLogger(__name__)

# The folder of every upload's shards in its dataset's folder (a reserved name segment,
# trainfeed.names.RESERVED_SEGMENTS): data/<fingerprint>/.
DATA_DIR = "data"


@dataclass(frozen=True)
class Inputs:
    """What an upload packs: its entries (missing files dropped with --skip-missing), each
    record's planned size in bytes, what was skipped, and the upload's fingerprint."""

    parsed: ParsedList
    entries: tuple[ListEntry, ...]
    sizes: tuple[int, ...]
    skipped: tuple[str, ...]
    fingerprint: str

    @property
    def data_dir(self) -> str:
        """The folder of this upload's shards, in the dataset's folder."""
        return f"{DATA_DIR}/{self.fingerprint[:16]}"


def layout_of(options: UploadOptions) -> Layout:
    return Layout(options.row_group_rows, options.row_group_bytes, options.shard_row_groups,
                  options.shard_bytes)


def read_inputs(list_path: str, options: UploadOptions) -> Inputs:
    """Parses and checks `list_path` (see the module docstring).

    Raises:
        ListFileError: a malformed line; MissingFilesError listing every missing file;
            OutsidePathsError; HardLinkedFilesError; OversizeRecordsError. Nothing is written
            then.
    """
    parsed = parse_list(list_path, options.kind, options.columns, comments=options.comments)
    with open(list_path, "rb") as f:
        list_bytes = f.read()
    entries = parsed.entries
    stats: list = []
    skipped: tuple[str, ...] = ()
    if parsed.kind == "file":
        stats = _stat_files(entries, options.read_threads, options.fingerprint_mtimes)
        _check_links(parsed, entries, stats, options)
        stats = [s[:2] if s is not None else None for s in stats]  # the fingerprint's
        entries, stats, skipped = _drop_missing(parsed, entries, stats, options)
        _check_files(parsed, entries, stats, options)
    sizes = tuple(_record_size(e, s, parsed.kind == "file")
                  for e, s in zip(entries, stats or [None] * len(entries)))
    fingerprint = _fingerprint(parsed, list_bytes, stats, options, skipped)
    return Inputs(parsed, entries, sizes, skipped, fingerprint)


def _record_size(entry: ListEntry, stat: tuple[int, int | str] | None, is_file: bool) -> int:
    """Payload bytes of a record as stored untransformed: the file's size, if any, and the
    UTF-8 bytes of its other columns."""
    columns = entry.columns[1:] if is_file else entry.columns
    return (stat[0] if stat is not None else 0) + sum(len(c.encode()) for c in columns)


def _drop_missing(parsed: ParsedList, entries: tuple[ListEntry, ...], stats: list,
                  options: UploadOptions) -> tuple[tuple[ListEntry, ...], list, tuple[str, ...]]:
    missing = [(e.line, e.columns[0]) for e, s in zip(entries, stats) if s is None]
    if missing and not options.skip_missing:
        raise MissingFilesError(parsed.path, missing)
    if not missing:
        return entries, stats, ()
    # Logged once here for library users; the CLI prints the list (result.skipped).
    logger.debug("skipping %d missing file(s) of %s", len(missing), parsed.path)
    kept = tuple(e for e, s in zip(entries, stats) if s is not None)
    return kept, [s for s in stats if s is not None], tuple(
        f"{parsed.path}:{line}: {path}" for line, path in missing)


def _check_links(parsed: ParsedList, entries: tuple[ListEntry, ...], stats: list,
                 options: UploadOptions) -> None:
    """Refuses regular files with more than one name (hard links), unless allowed: unlike a
    symlink, a hard link does not say where its other names are, so a file linked from outside
    the list's folder cannot be told from one linked inside, and `outside_paths` cannot see it.

    Raises:
        HardLinkedFilesError: naming each file, its list line and its number of names.
    """
    if options.allow_hard_links or options.allow_outside:
        return
    linked = [(e.line, e.columns[0], s[2]) for e, s in zip(entries, stats)
              if s is not None and s[2] > 1]
    if linked:
        raise HardLinkedFilesError(parsed.path, linked)


def _check_files(parsed: ParsedList, entries: tuple[ListEntry, ...], stats: list,
                 options: UploadOptions) -> None:
    if not options.allow_outside:
        outside = outside_paths(entries, os.path.dirname(parsed.path))
        if outside:
            raise OutsidePathsError(parsed.path, outside)
    big = [(e.line, e.columns[0], s[0]) for e, s in zip(entries, stats)
           if s[0] > options.max_record_bytes]
    if big:
        raise OversizeRecordsError(parsed.path, options.max_record_bytes, big)


_Stat = tuple[int, "int | str", int]


def _stat_files(entries: tuple[ListEntry, ...], threads: int,
                 with_mtimes: bool) -> list[_Stat | None]:
    """(size, mtime_ns or content hash, number of names) of each entry's file, or None where it
    is missing (or not a regular file). One stat per file, in runs per thread: a future per
    file cost more than its stat (0.1 CPU-s of 3,000 files)."""
    def stat(entry: ListEntry) -> _Stat | None:
        path = entry.columns[0]
        try:
            st = os.stat(path)
            if not S_ISREG(st.st_mode):
                return None
            if with_mtimes:
                return st.st_size, st.st_mtime_ns, st.st_nlink
            with open(path, "rb") as f:
                return st.st_size, hashlib.sha256(f.read()).hexdigest(), st.st_nlink
        except (FileNotFoundError, NotADirectoryError):
            return None

    def run(part: tuple[ListEntry, ...]) -> list[_Stat | None]:
        return [stat(entry) for entry in part]

    step = max(256, -(-len(entries) // threads))
    with ThreadPoolExecutor(threads) as pool:
        return [s for part in pool.map(run, [entries[i:i + step]
                                             for i in range(0, len(entries), step)])
                for s in part]


def _fingerprint(parsed: ParsedList, list_bytes: bytes, stats: list, options: UploadOptions,
                 skipped: tuple[str, ...]) -> str:
    """Identifies an upload's input: same list, same files (size, mtime), same layout ⇒ same
    id. Settings added later enter it only when not at their default, so that datasets
    uploaded before keep their id (a re-run stays a no-op)."""
    digest = hashlib.sha256(list_bytes)
    layout: tuple[object, ...] = (parsed.kind, parsed.field_names, options.row_group_rows,
                                  options.row_group_bytes, options.shard_bytes,
                                  options.shard_row_groups, skipped)
    if not options.comments:
        layout += ("comments kept as data",)
    if options.jpeg_restarts:
        layout += ("jpeg restarts",)
    if options.max_side is not None:
        layout += (f"max side {options.max_side} q{options.quality}",)
    if options.raw_below is not None:
        layout += (f"raw below {options.raw_below}",)
    digest.update(repr(layout).encode())
    digest.update(repr(stats).encode())
    return digest.hexdigest()
