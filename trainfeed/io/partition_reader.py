"""Reading one partition (a row-group range of one shard, or a row slice of one row group) from
storage into an Arrow table.

`read_selected` reads the small columns first and fetches the payloads (file bytes) of only the
rows a chooser keeps, by byte range, using the shard's payload index (see
trainfeed.formats.shards.payload_index): records that class rebalancing drops cost no payload
I/O. Shards without an index fall back to reading whole row groups.

On a local (or mounted) filesystem, whole row groups take the same path: their payloads are
read by range straight into one buffer that becomes the Arrow column, with no copy. Parquet's
own decoding of a binary column copies every value into a growing builder (and the kernel zeroes
each fresh page of it): for 83 KB JPEGs that cost ~0.07 ms per image, 6 % of a train crop's
whole budget. Remote stores keep Parquet's read, one request per column chunk rather than one
per run of values.

Nothing read is trusted: Parquet page checksums are verified on every page read, every ranged
payload read is bounds-checked against the shard's size and checked against the checksum the
payload index records for it (CRC-32C, or CRC-32 in indexes written before 2026-11-25), and
the row counts are checked against the manifest. Any mismatch is a CorruptDatasetError naming
the dataset, the shard and the rows, never a wrong record.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.confine import path_problem
from trainfeed.formats.crc import crc32, crc32c
from trainfeed.formats.manifest import ID_COLUMN, MANIFEST_NAME
from trainfeed.formats.shards import (
    CRC32_COLUMN,
    CRC32C_COLUMN,
    INDEX_COLUMNS,
    PAYLOAD_INDEX_SUFFIX,
)
from trainfeed.io.array_pool import ArrayPool
from trainfeed.io.prefetch import TaskRef
from trainfeed.planning.partitions import SQL_SHARD
from trainfeed.storage import Storage, access_error, check_regular

# Shards stay open between partitions (their footers parsed once); a handful covers the shards a
# worker moves between in one epoch without holding many file handles.
OPEN_SHARDS = 8
# The column that carries how many times a selected row is to be emitted (over-sampling).
COPIES_COLUMN = "_copies"
# Ranged reads of a local shard: values at most this far apart are read by one system call (the
# bytes between them, Parquet's length prefixes and page headers, go to a scratch buffer), and
# one call takes at most this many values (IOV_MAX, the kernel's limit, is 1024 on Linux).
COALESCE_GAP = 64 * 1024
COALESCE_VALUES = 500
# A column's values are read into buffers of at most this many bytes each (Arrow's binary
# type addresses its data with int32 offsets).
MAX_CHUNK_BYTES = 2**31 - 1
# Payload buffers a reader keeps for reuse (trainfeed.io.array_pool): a row group's payloads
# stay alive until the pieces holding its rows are decoded, so a shuffled reader has 25-40 in
# use (the prefetched partitions, the shuffle window's, the pieces in flight: counted on the
# ImageNet-like train reader, ~6 MB each); a fresh buffer for each meant the kernel zeroed every
# page the read then overwrote (5 % of a train crop's CPU, measured).
# The byte bound caps what a reader holds on to for datasets of large partitions (a partition
# whose row groups fill a 1 GB shard is one 1 GB buffer).
PAYLOAD_BUFFERS_KEPT = 64
PAYLOAD_BYTES_KEPT = 512 << 20


@dataclass
class ReadStats:
    """What a reader fetched from storage, summed over its partitions (shared by passes, and
    by a pass's load threads: `add_payload` counts under a lock, since `+=` on an attribute
    can lose an update between two threads)."""

    payload_bytes: int = 0  # bytes of binary field values read
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                  compare=False)

    def add_payload(self, nbytes: int) -> None:
        with self._lock:
            self.payload_bytes += nbytes


Chooser = Callable[[pa.Table], np.ndarray]
# Given a task and its rows without payloads, how many times to emit each row (resampling).
Selector = Callable[[TaskRef, pa.Table], np.ndarray]


# numpy reads an .npy header with `ast.literal_eval`, and CPython 3.11's AST constructor keeps
# its recursion depth in the interpreter, not in the thread: two threads building ASTs at once
# (a garbage collection running a finalizer in between lets the other one in) can raise
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905; seen in CI
# with two load threads, trainfeed.io.loads). One index header is parsed at a time.
_INDEX_PARSE = threading.Lock()


def parsed_index(data: bytes) -> np.ndarray:
    """A payload index's array from its .npy bytes, one parse at a time (see _INDEX_PARSE).
    Raises ValueError or OSError for bytes that are not a plain .npy array (no pickles)."""
    with _INDEX_PARSE:
        index: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    return index


def payload_buffer_pool() -> ArrayPool:
    """A pool for the buffers payloads are read into (see PartitionReader)."""
    return ArrayPool(PAYLOAD_BUFFERS_KEPT, PAYLOAD_BYTES_KEPT)


class PartitionReader:
    """Reads row-group ranges of a dataset's shards.

    Not thread-safe: give each thread its own. `close()` is idempotent.
    """

    def __init__(self, dataset: Storage, columns: Sequence[str], binary: Sequence[str] = (),
                 stats: ReadStats | None = None, payload_buffers: ArrayPool | None = None):
        """`payload_buffers`: where payloads are read into (`payload_buffer_pool()`); pass the
        same pool to the readers of successive passes, so that a new pass reuses the buffers
        of the last instead of mapping fresh ones (a pass of the 5,000-image benchmark lasts
        two seconds: a pool per pass was always empty)."""
        self.dataset = dataset
        self.columns = [ID_COLUMN, *columns]
        self.binary = [c for c in columns if c in set(binary)]
        self.stats = stats or ReadStats()
        self._open: OrderedDict[str, tuple[pq.ParquetFile, Any]] = OrderedDict()
        self._indexes: dict[str, np.ndarray | None] = {}
        self._sql: Any = None  # trainfeed.sql.SqlSource of a SQL dataset, on first use
        self._payload_buffers = (payload_buffers if payload_buffers is not None
                                 else payload_buffer_pool())

    def _shard(self, shard: str) -> pq.ParquetFile:
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard][0]
        self._check_name(shard)
        try:
            if self.dataset.is_local:
                # pyarrow's own file reader: no Python in the read path, the GIL stays free.
                # Its real path, checked to be a regular file inside the dataset's folder.
                handle = None
                parquet = pq.ParquetFile(self.dataset.local_file(shard), memory_map=False,
                                         pre_buffer=False, page_checksum_verification=True)
            else:
                handle = self.dataset.fs.open(self.dataset.path(shard), "rb")
                parquet = pq.ParquetFile(handle, pre_buffer=False,
                                         page_checksum_verification=True)
        except PermissionError as e:
            raise access_error(self.dataset.url, e) from e
        except FileNotFoundError:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url} is missing (was the dataset deleted or "
                f"re-uploaded while this job ran?)") from None
        except (OSError, pa.ArrowException) as e:  # truncated, or not Parquet at all
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url} is unreadable: {e}") from None
        self._open[shard] = (parquet, handle)
        while len(self._open) > OPEN_SHARDS:
            _, (old, old_handle) = self._open.popitem(last=False)
            self._close_one(old, old_handle)
        return parquet

    def _check_name(self, shard: str) -> None:
        """Refuses a shard path that could lead out of the dataset's folder before it is
        opened: a manifest's paths are checked at load (trainfeed.formats.manifest), and a
        master-fed reader gets its shard paths from the master, which this checks again."""
        problem = path_problem(shard)
        if problem is not None:
            raise CorruptDatasetError(f"shard {str(repr(shard))[:200]} of {self.dataset.url}: "
                                      f"{problem}; refused unopened")

    def read(self, shard: str, row_group_start: int, row_group_stop: int,
             num_records: int, row_start: int = 0) -> pa.Table:
        """Rows [row_start, row_start + num_records) of row groups [start, stop) of `shard`
        (every row of them, for a partition of whole row groups): the `_id` column, then the
        fields.

        A slice of a row group (trainfeed.planning.partitions) reads the row group's small
        columns and fetches the payloads of its own rows alone by byte range (the payload
        index), so that cutting a row group into k slices does not read its payloads k times;
        a shard without an index is read whole and cut."""
        held = self._check_rows(shard, row_group_start, row_group_stop, row_start, num_records)
        whole = row_start == 0 and num_records == held
        if whole and not self._reads_payloads_by_range(shard):
            table = self._row_groups(shard, row_group_start, row_group_stop, held, self.columns)
            self.stats.add_payload(self._payload_size(table))
            return table
        if not self.binary or self._index(shard) is None:
            whole = self._row_groups(shard, row_group_start, row_group_stop, held, self.columns)
            self.stats.add_payload(self._payload_size(whole))
            return whole.slice(row_start, num_records)
        small = [c for c in self.columns if c not in self.binary]
        meta = self._row_groups(shard, row_group_start, row_group_stop, held, small)
        return self._with_payloads(shard, row_group_start, row_group_stop, meta,
                                   np.arange(row_start, row_start + num_records))

    def _check_rows(self, shard: str, row_group_start: int, row_group_stop: int,
                    row_start: int, num_records: int) -> int:
        """How many rows row groups [start, stop) hold (the shard's footer); raises
        CorruptDatasetError unless they hold the rows the manifest's partition names."""
        parquet = self._shard(shard)
        if row_group_stop > parquet.num_row_groups:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url} has {parquet.num_row_groups} row groups, "
                f"the manifest promised at least {row_group_stop}")
        held: int = sum(parquet.metadata.row_group(i).num_rows
                        for i in range(row_group_start, row_group_stop))
        if row_start < 0 or row_start + num_records > held:
            what = (f"says {num_records}" if row_start == 0 else
                    f"names rows [{row_start}, {row_start + num_records})")
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url}: row groups [{row_group_start}, "
                f"{row_group_stop}) hold {held} rows, the manifest {what}")
        return held

    def _row_groups(self, shard: str, row_group_start: int, row_group_stop: int,
                    num_rows: int, columns: Sequence[str]) -> pa.Table:
        """`columns` of row groups [start, stop), checked to hold `num_rows` rows."""
        try:
            table = self._shard(shard).read_row_groups(range(row_group_start, row_group_stop),
                                                       columns=list(columns), use_threads=False)
        except (OSError, pa.ArrowException) as e:  # a page checksum mismatch, a cut-off file
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url}, row groups [{row_group_start}, "
                f"{row_group_stop}): corrupt data: {e}") from None
        if table.num_rows != num_rows:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url}: row groups [{row_group_start}, "
                f"{row_group_stop}) hold {table.num_rows} rows, expected {num_rows}")
        return table

    def _reads_payloads_by_range(self, shard: str) -> bool:
        """Whether whole row groups of `shard` are read with their payloads fetched by range:
        on a local filesystem, when the shard's index has a checksum per value (so the bytes
        are verified as Parquet's page checksums would verify them)."""
        if not self.binary or not self.dataset.is_local:
            return False
        index = self._index(shard)
        return index is not None and _checksum_of(index.shape[2]) is not None

    def _payload_size(self, table: pa.Table) -> int:
        return sum(int(pc.sum(pc.binary_length(table.column(c))).as_py() or 0)
                   for c in self.binary)

    def read_selected(self, shard: str, row_group_start: int, row_group_stop: int,
                      num_records: int, choose: Chooser, row_start: int = 0) -> pa.Table:
        """The rows `choose` keeps of the partition (rows [row_start, row_start + num_records)
        of row groups [start, stop)), with a COPIES_COLUMN of how often to emit each.

        `choose` gets the partition without its binary fields (`_id` and the small columns) and
        returns an int count per row (0: drop). Only the kept rows' payloads are fetched."""
        held = self._check_rows(shard, row_group_start, row_group_stop, row_start, num_records)
        small = [c for c in self.columns if c not in self.binary]
        meta = self._row_groups(shard, row_group_start, row_group_stop, held, small)
        copies = np.asarray(choose(meta.slice(row_start, num_records)), dtype=np.int64)
        rows = np.flatnonzero(copies)
        table = self._with_payloads(shard, row_group_start, row_group_stop, meta,
                                    row_start + rows)
        return table.append_column(COPIES_COLUMN, pa.array(copies[rows], pa.int64()))

    def _with_payloads(self, shard: str, row_group_start: int, row_group_stop: int,
                       meta: pa.Table, rows: np.ndarray) -> pa.Table:
        """Rows `rows` (positions in `meta`, the small columns of row groups [start, stop))
        with their binary fields: fetched by byte range through the shard's payload index, or,
        for an older shard without one, read whole."""
        index = self._index(shard)
        if not self.binary:
            payloads = {}
        elif index is None:  # an older shard: its payload columns are read whole
            whole = self._row_groups(shard, row_group_start, row_group_stop, meta.num_rows,
                                     self.binary)
            self.stats.add_payload(self._payload_size(whole))
            payloads = {name: whole.column(name).take(rows) for name in self.binary}
        else:
            parquet = self._shard(shard)
            first = sum(parquet.metadata.row_group(i).num_rows for i in range(row_group_start))
            ids = meta.column(ID_COLUMN).to_numpy()[rows]
            # The index has a column per binary field of the shard, in the shard's order.
            slot = {f.name: k for k, f in enumerate(
                f for f in parquet.schema_arrow if f.type == pa.binary())}
            payloads = {name: self._fetch(shard, index[first + rows, slot[name]], ids)
                        for name in self.binary}
        kept = meta.take(rows)
        # The shard's own schema (non-null fields), as a whole read has: a pass concatenates
        # slices with whole row groups.
        schema = self._shard(shard).schema_arrow
        return pa.Table.from_arrays(
            [payloads[c] if c in payloads else kept.column(c) for c in self.columns],
            schema=pa.schema([schema.field(c) for c in self.columns]))

    def read_sql(self, bucket: int, buckets: int) -> pa.Table:
        """One hash bucket of a SQL dataset's query, run on its database by this worker, sorted
        by the key columns (a stable order: progress within it skips a prefix), with a stable
        `_id` from the key values."""
        if self._sql is None:
            from trainfeed.sql import SqlSource  # a database driver is an optional extra
            manifest = json.loads(self.dataset.read_bytes(MANIFEST_NAME))
            spec = manifest["extra"]["sql"]
            self._sql = SqlSource(spec["query"], spec["url"], tuple(spec["key_columns"]))
        table = self._sql.read_partition(bucket, buckets)
        keys = list(self._sql.key_columns) or table.column_names
        table = table.sort_by([(k, "ascending") for k in keys])
        ids = pa.array(stable_ids(table, keys), pa.int64())
        return pa.table([ids, *(table.column(c) for c in self.columns[1:])], names=self.columns)

    def _index(self, shard: str) -> np.ndarray | None:
        if shard not in self._indexes:
            try:
                index = parsed_index(self.dataset.read_bytes(shard + PAYLOAD_INDEX_SUFFIX))
            except FileNotFoundError:
                index = None  # written before payload indexes existed
            except (ValueError, OSError) as e:
                raise CorruptDatasetError(f"payload index of shard {shard} of "
                                          f"{self.dataset.url} is unreadable: {e}") from None
            if index is not None:
                self._check_index(shard, index)
            self._indexes[shard] = index
        return self._indexes[shard]

    def _check_index(self, shard: str, index: np.ndarray) -> None:
        """Every (offset, length) must lie inside the shard: a damaged index must give an
        error, not a wrong payload or a 2^40-byte allocation. (Older indexes have 2 or 3
        columns: see trainfeed.formats.shards.payload_index.)"""
        if (index.ndim != 3 or index.shape[2] not in (2, 3, INDEX_COLUMNS)
                or index.dtype != np.int64):
            raise CorruptDatasetError(f"payload index of shard {shard} of {self.dataset.url} "
                                      f"has shape {index.shape} {index.dtype}")
        file_size = self._file_size(shard)
        offsets, lengths = index[..., 0], index[..., 1]
        bad = np.argwhere((offsets < 4) | (lengths < 0) | (offsets + lengths > file_size))
        if len(bad):
            row, field = (int(x) for x in bad[0])
            raise CorruptDatasetError(
                f"payload index of shard {shard} of {self.dataset.url}: row {row} points at "
                f"{int(lengths[row, field])} bytes from offset {int(offsets[row, field])}, "
                f"outside the shard's {file_size} bytes")

    def _file_size(self, shard: str) -> int:
        if self.dataset.is_local:
            return os.path.getsize(self.dataset.local_file(shard))
        return int(self.dataset.fs.size(self.dataset.path(shard)))

    def _fetch(self, shard: str, ranges: np.ndarray,
               ids: np.ndarray) -> pa.Array | pa.ChunkedArray:
        """The byte ranges (offset, length[, checksums]) of one shard, in order, each checked
        against its checksum when the index has one (`ids` name the records in errors)."""
        self.stats.add_payload(int(ranges[:, 1].sum()) if len(ranges) else 0)
        if self.dataset.is_local:
            path = self.dataset.local_file(shard)
            chunks = [self._read_local(shard, path, part, ids[at:at + len(part)])
                      for at, part in _parts_under(ranges, MAX_CHUNK_BYTES)]
            return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, pa.binary())
        starts = [int(at) for at, _ in ranges[:, :2]]
        ends = [int(at + n) for at, n in ranges[:, :2]]
        values = self.dataset.fs.cat_ranges([self.dataset.path(shard)] * len(starts), starts,
                                            ends)
        checksum = _checksum_of(ranges.shape[1])
        if checksum is not None:
            column, crc = checksum
            for value, expected, record in zip(values, ranges[:, column].tolist(), ids):
                if crc(value) != expected:
                    raise self._checksum_error(shard, int(record))
        return pa.array(values, pa.binary())

    def _read_local(self, shard: str, path: str, ranges: np.ndarray,
                    ids: np.ndarray) -> pa.Array:
        """`ranges` of a local file read into one buffer, which becomes the binary array's data
        as it is (values at most COALESCE_GAP apart share a system call)."""
        lengths = ranges[:, 1]
        offsets = np.zeros(len(ranges) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        data = self._payload_buffers.buffer(int(offsets[-1]))
        out = data.data  # a memoryview of the array
        gap = memoryview(bytearray(COALESCE_GAP))
        at_list = ranges[:, 0].tolist()
        bounds = offsets.tolist()
        # Never waits on a FIFO put in the checked file's place since (`Storage.local_file`).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            check_regular(os.fstat(fd).st_mode, f"shard {shard} of {self.dataset.url}")
            os.set_blocking(fd, True)
            i = 0
            while i < len(at_list):
                # One run: values in file order, each within COALESCE_GAP of the last.
                buffers = [out[bounds[i]:bounds[i + 1]]]
                first, end, j = at_list[i], at_list[i] + bounds[i + 1] - bounds[i], i + 1
                while (j < len(at_list) and j - i < COALESCE_VALUES
                       and end <= at_list[j] <= end + COALESCE_GAP):
                    if at_list[j] > end:
                        buffers.append(gap[:at_list[j] - end])
                    buffers.append(out[bounds[j]:bounds[j + 1]])
                    end = at_list[j] + bounds[j + 1] - bounds[j]
                    j += 1
                got = os.preadv(fd, buffers, first)
                if got != end - first:  # the first value not read whole is the one named
                    cut = next(k for k in range(i, j)
                               if at_list[k] + bounds[k + 1] - bounds[k] > first + got)
                    raise CorruptDatasetError(
                        f"record {int(ids[cut])} of shard {shard} of {self.dataset.url}: the "
                        f"shard ends before its payload (truncated since it was indexed?)")
                i = j
        finally:
            os.close(fd)
        checksum = _checksum_of(ranges.shape[1])
        if checksum is not None:
            column, crc = checksum
            for start, stop, expected, record in zip(bounds[:-1], bounds[1:],
                                                     ranges[:, column].tolist(), ids.tolist()):
                if crc(data[start:stop]) != expected:
                    raise self._checksum_error(shard, int(record))
        return pa.Array.from_buffers(pa.binary(), len(ranges),
                                     [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    def _checksum_error(self, shard: str, record: int) -> CorruptDatasetError:
        return CorruptDatasetError(
            f"record {record} of shard {shard} of {self.dataset.url}: its payload does not "
            f"match its checksum (the shard or its index is corrupt)")

    @staticmethod
    def _close_one(parquet: pq.ParquetFile, handle: Any) -> None:
        parquet.close()
        if handle is not None:
            handle.close()

    def close(self) -> None:
        while self._open:
            _, (parquet, handle) = self._open.popitem()
            self._close_one(parquet, handle)


def _checksum_of(index_columns: int) -> tuple[int, Callable[[Any], int]] | None:
    """Which column of a payload index of `index_columns` columns holds the checksum readers
    verify, and the function that computes it (see trainfeed.formats.shards.payload_index):
    CRC-32C where the index has it, else CRC-32, else None (no checksum). Both release the GIL
    while they hash a large value (trainfeed.formats.crc): a read thread checking a row group of
    raw 256-px images no longer holds it for ~18 µs per image, during which the decode threads
    could not start their next."""
    if index_columns >= INDEX_COLUMNS:
        return CRC32C_COLUMN, crc32c
    if index_columns > CRC32_COLUMN:
        return CRC32_COLUMN, crc32
    return None


def _parts_under(ranges: np.ndarray, limit: int) -> list[tuple[int, np.ndarray]]:
    """`ranges` cut into consecutive parts (with the position each starts at) whose lengths
    sum to at most `limit` each; a part holds at least one range."""
    parts, start, total = [], 0, 0
    for i, length in enumerate(ranges[:, 1].tolist()):
        if total + length > limit and i > start:
            parts.append((start, ranges[start:i]))
            start, total = i, 0
        total += length
    parts.append((start, ranges[start:]))
    return parts


def stable_ids(table: pa.Table, keys: Sequence[str]) -> list[int]:
    """A 63-bit id per row from its key values: the same row gets the same id in every read."""
    columns = [table.column(k).to_pylist() for k in keys]
    return [int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=8).digest(),
                           "little") >> 1 for values in zip(*columns)]


def read_task(reader: PartitionReader, task: TaskRef, selector: Selector | None) -> pa.Table:
    """A task's rows minus the `task.skip` an earlier holder's trainer already got; with a
    selector, only the rows it keeps (and a COPIES_COLUMN), payloads fetched for those alone."""
    if selector is None:
        table = (reader.read_sql(task.row_group_start, task.row_group_stop)
                 if task.shard == SQL_SHARD else
                 reader.read(task.shard, task.row_group_start, task.row_group_stop,
                             task.num_records, task.row_start))
        if task.stop:
            return table.slice(task.skip, max(0, task.stop - task.skip))
        return table.slice(task.skip) if task.skip else table

    def choose(meta: pa.Table) -> np.ndarray:
        copies = np.array(selector(task, meta), dtype=np.int64)
        copies[:task.skip] = 0
        return copies
    if task.shard == SQL_SHARD:  # the rows come whole from the database anyway
        table = reader.read_sql(task.row_group_start, task.row_group_stop)
        copies = choose(table)
        rows = np.flatnonzero(copies)
        return table.take(rows).append_column(COPIES_COLUMN, pa.array(copies[rows], pa.int64()))
    return reader.read_selected(task.shard, task.row_group_start, task.row_group_stop,
                                task.num_records, choose, task.row_start)
