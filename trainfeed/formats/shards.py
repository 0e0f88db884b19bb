"""Parquet shards: how records are laid out in storage.

A shard is one Parquet file of bounded size made of bounded row groups. Row groups are the unit of
partitioning (a partition is a range of row groups, or a slice of one when a dataset has too few:
trainfeed.planning.partitions), so their size sets the grain at which the master spreads work
without slicing: small enough for many partitions per worker, large enough that one read is one
efficient sequential request.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast, overload

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.formats.arrays import int64_array, string_array
from trainfeed.formats.crc import crc32, crc32c
from trainfeed.formats.manifest import ID_COLUMN, FieldSpec, RowGroupInfo, ShardInfo
from trainfeed.formats.writeback import start_writeback
from trainfeed.storage import Storage

_ARROW_TYPES = {"binary": pa.binary(), "string": pa.string()}


def arrow_schema(fields: Sequence[FieldSpec]) -> pa.Schema:
    """The Parquet schema of a dataset: the record id, then the fields in .list column order."""
    return pa.schema([pa.field(ID_COLUMN, pa.int64(), nullable=False)]
                     + [pa.field(f.name, _ARROW_TYPES[f.type], nullable=False) for f in fields])


class PackedValues(Sequence[memoryview]):
    """Binary values laid end to end in one buffer: value i is `data[offsets[i]:offsets[i+1]]`.

    A packer reads a row group's files straight into one buffer (trainfeed.ingest.pack): the
    encoder then hands that buffer to Arrow as the column's values, without a bytes object per
    file nor the copy that joins them (together a third of a plain upload's CPU). Values are
    read-only views of `data`, valid while it is not reused."""

    def __init__(self, data: memoryview, offsets: np.ndarray):
        self.data = data
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self) -> Iterator[memoryview]:
        data = self.data
        return (data[a:b] for a, b in itertools.pairwise(self.offsets.tolist()))

    @overload
    def __getitem__(self, index: int) -> memoryview: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[memoryview]: ...

    def __getitem__(self, index: int | slice) -> memoryview | Sequence[memoryview]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"value {index} of {len(self)}")
        index %= len(self)
        return self.data[int(self.offsets[index]):int(self.offsets[index + 1])]


@dataclass
class RowGroupBuffer:
    """Rows collected for one row group, column by column (a binary column's values may be
    one buffer's: PackedValues)."""

    ids: list[int]
    columns: list[list | PackedValues]
    payload_bytes: int = 0

    @classmethod
    def empty(cls, num_fields: int) -> RowGroupBuffer:
        return cls([], [[] for _ in range(num_fields)])

    def add(self, record_id: int, values: Sequence[bytes | str], size: int) -> None:
        self.ids.append(record_id)
        for column, value in zip(self.columns, values):
            assert isinstance(column, list), "a PackedValues column is filled whole"
            column.append(value)
        self.payload_bytes += size

    def __len__(self) -> int:
        return len(self.ids)

    def info(self) -> RowGroupInfo:
        return RowGroupInfo(num_rows=len(self.ids), num_bytes=self.payload_bytes,
                            first_id=self.ids[0])


def encode_shard(schema: pa.Schema, row_groups: Sequence[RowGroupBuffer]) -> tuple[bytes, str]:
    """Serializes row groups into one Parquet file in memory; returns (bytes, sha256 hex).

    Binary payloads (already-compressed JPEG/PNG bytes) are stored uncompressed: compressing them
    again costs CPU on every read and saves nothing. Text columns use Snappy. Every page carries
    a CRC-32 (Parquet page checksums), which readers verify: a flipped byte is an error, never a
    wrong record handed to a trainer.
    """
    compression = {f.name: ("NONE" if f.type == pa.binary() else "SNAPPY") for f in schema}
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, schema, compression=compression,
                          write_statistics=[ID_COLUMN], write_page_checksum=True) as writer:
        for group in row_groups:
            table = pa.Table.from_arrays(
                [pa.array(group.ids, pa.int64())]
                + [pa.array(col, schema.field(i + 1).type) for i, col in enumerate(group.columns)],
                schema=schema)
            writer.write_table(table, row_group_size=len(group))
    data = sink.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def payload_index(data: bytes, schema: pa.Schema,
                  row_groups: Sequence[RowGroupBuffer]) -> np.ndarray | None:
    """Where each binary value sits in the encoded shard `data`: an int64 array (rows, binary
    fields, 4) of (offset, length, CRC-32, CRC-32C of the value), rows in shard order; None if
    a value cannot be located. A ranged read of one value bypasses Parquet's page checksums, so
    the index carries a checksum per value. Readers check the CRC-32C, which the CPU computes
    (SSE 4.2, ARMv8): ~4 µs per 83 KB JPEG against ~30 µs for zlib's CRC-32, 3 % of a train
    crop's CPU. The CRC-32 stays for readers of earlier versions, which checked it where their
    google-crc32c had no compiled code, and is the only checksum of indexes of 3 columns,
    written by those versions (those of 2 columns, older still, carry none).

    Binary columns are written uncompressed, so each value is in the file verbatim, preceded by
    its 4-byte length (PLAIN encoding, in data pages or, dictionary-encoded, in the dictionary
    page), in row order within its column chunk, whose byte range the footer gives. A value
    that repeats an earlier one may only be in the dictionary: its first copy is used.
    """
    meta = pq.read_metadata(io.BytesIO(data))
    binary = [i for i, f in enumerate(schema) if f.type == pa.binary()]
    out = np.zeros((sum(len(g) for g in row_groups), len(binary), INDEX_COLUMNS), dtype=np.int64)
    first_row = 0
    for index, group in enumerate(row_groups):
        row_group = meta.row_group(index)
        for k, column in enumerate(binary):
            chunk = row_group.column(column)
            start = (chunk.dictionary_page_offset if chunk.has_dictionary_page
                     and chunk.dictionary_page_offset is not None else chunk.data_page_offset)
            end = start + chunk.total_compressed_size
            cursor = start
            for row, value in enumerate(group.columns[column - 1]):
                needle = len(value).to_bytes(4, "little") + value
                at = data.find(needle, cursor, end)
                if at < 0:
                    at = data.find(needle, start, end)  # a repeat: its dictionary entry
                    if at < 0:
                        return None
                else:
                    cursor = at + len(needle)
                out[first_row + row, k] = (at + 4, len(value), crc32(value), crc32c(value))
        first_row += len(group)
    return out


# Beside each shard: its payload index (see `payload_index`), an int64 .npy.
PAYLOAD_INDEX_SUFFIX = ".payload.npy"
# (offset, length, CRC-32, CRC-32C) per value; older indexes have the first three, or two, only.
INDEX_COLUMNS = 4
# The columns of an index: where its checksums are, and which an index must have to carry one.
CRC32_COLUMN, CRC32C_COLUMN = 2, 3


def write_shard(folder: Storage, rel: str, schema: pa.Schema,
                row_groups: Sequence[RowGroupBuffer]) -> ShardInfo:
    """Encodes `row_groups` as shard `rel` of a dataset folder, writes it and its payload index
    (where it has binary fields), each atomically, and returns what the manifest lists."""
    data, sha = encode_shard(schema, row_groups)
    folder.write_atomic(rel, data)
    index = payload_index(data, schema, row_groups)
    index_rel = None
    if index is not None and index.shape[1]:
        index_rel = rel + PAYLOAD_INDEX_SUFFIX
        buffer = io.BytesIO()
        np.save(buffer, index, allow_pickle=False)
        folder.write_atomic(index_rel, buffer.getvalue())
    return ShardInfo(path=rel, num_rows=sum(len(g) for g in row_groups), num_bytes=len(data),
                     sha256=sha, row_groups=tuple(g.info() for g in row_groups),
                     payload_index=index_rel)


class ShardEncoder:
    """Encodes one shard row group by row group, as the groups come (`add`), so that a packer
    holds the group being added, never every group's values as well: `encode_shard` needs them
    all at once (and `payload_index` searches them in the whole file).

    Binary columns are PLAIN-encoded, without the dictionary pyarrow tries first, uncompressed
    and without statistics: each value is then in its column chunk verbatim after its 4-byte
    length, in row order, so that its offset is where the previous value ended unless a page
    header sits between them (then searched for, from there); a place is taken when its length
    and CRC-32 are the value's. Text columns keep dictionaries and Snappy. The bytes depend
    only on the groups added: the same groups make the same shard whichever process encodes
    them (parallel uploads rely on it).

    With `path` (a local file), the shard is encoded straight into that file, which `finish`
    reads back one row group at a time to hash it and locate its values, then syncs: no copy
    of the shard in memory, and no second write of it (on 3,000 ImageNet-like photos a Python
    BytesIO, then a write of its bytes, took ~0.2 CPU-s more, and 64 MiB per packer). Without
    `path` (object stores), it is encoded in memory and `finish` hands back its bytes.

    Not thread-safe: one encoder per shard being written.
    """

    def __init__(self, schema: pa.Schema, path: str | None = None,
                 scratch: Callable[[int], bytearray] | None = None):
        """`scratch(size)`: a buffer of at least `size` bytes, free while `finish` runs, to read
        the shard back into (default: a new one); a packer reuses one from shard to shard."""
        self.schema = schema
        self.path = path
        self._scratch = scratch or bytearray
        self._memory = io.BytesIO() if path is None else None
        self._sink: pa.NativeFile | io.BytesIO = (self._memory if self._memory is not None
                                                  else pa.OSFile(path, "wb"))
        strings = [f.name for f in schema if f.type == pa.string()]
        self._writer = pq.ParquetWriter(
            self._sink, schema,
            compression={f.name: ("NONE" if f.type == pa.binary() else "SNAPPY") for f in schema},
            use_dictionary=strings or False, write_statistics=[ID_COLUMN],
            write_page_checksum=True)
        self._binary = [i for i, f in enumerate(schema) if f.type == pa.binary()]
        # Per row group: where it starts in the shard, and its binary values' (0, length,
        # CRC-32, CRC-32C), their offsets filled in by `finish`.
        self._index: list[tuple[int, np.ndarray]] = []
        self._groups: list[RowGroupInfo] = []
        self.size = 0  # the shard's bytes, once finished

    def add(self, group: RowGroupBuffer) -> None:
        """Encodes `group` as the shard's next row group and checksums its binary values."""
        start = self._sink.tell()
        # Arrays from buffers (trainfeed.formats.arrays): `pa.array` imports pandas on its first
        # call (pyarrow's pandas shim), 0.5 CPU-s in every packing process.
        table = pa.Table.from_arrays(
            [int64_array(group.ids)]
            + [_binary_array(col) if self.schema.field(i + 1).type == pa.binary()
               else string_array(cast(list[str], col))
               for i, col in enumerate(group.columns)], schema=self.schema)
        self._writer.write_table(table, row_group_size=len(group))
        del table
        if self._memory is None:  # a file: its disk writes start now (formats.writeback)
            start_writeback(cast(pa.NativeFile, self._sink).fileno(), start,
                            self._sink.tell() - start)
        self._groups.append(group.info())
        out = np.zeros((len(group), len(self._binary), INDEX_COLUMNS), dtype=np.int64)
        for k, column in enumerate(self._binary):
            sizes, crc32s, crc32cs = [], [], []
            for value in _values_of(group.columns[column - 1]):
                sizes.append(len(value))
                crc32s.append(crc32(value))
                crc32cs.append(crc32c(value))
            out[:, k, 1], out[:, k, CRC32_COLUMN], out[:, k, CRC32C_COLUMN] = (
                sizes, crc32s, crc32cs)
        self._index.append((start, out))

    def finish(self) -> tuple[memoryview | None, str, tuple[RowGroupInfo, ...],
                              np.ndarray | None]:
        """Closes the shard: (its bytes, or None when written to `path`; their SHA-256 hex; its
        row groups; its payload index, or None if a value was not found). A file at `path` is
        synced (fsync) before this returns; in-memory bytes are a view of the encoder's buffer,
        valid while the encoder lives."""
        self._writer.close()
        bounds = [start for start, _ in self._index]
        if self._memory is not None:
            view = self._memory.getbuffer()
            self.size = len(view)
            sha, located = self._scan(bounds, lambda a, b: view[a:b])
            data: memoryview | None = view
        else:
            self._sink.close()
            assert self.path is not None
            with open(self.path, "rb", buffering=0) as f:
                self.size = os.fstat(f.fileno()).st_size
                spans = [b - a for a, b in zip([0, *bounds], [*bounds, self.size])]
                buffer = memoryview(self._scratch(max(spans, default=0)))

                def region(a: int, b: int) -> memoryview:
                    view = buffer[:b - a]
                    f.seek(a)
                    got = 0
                    while got < len(view):
                        n = f.readinto(view[got:])
                        if not n:
                            raise OSError(f"{self.path}: {self.size} bytes written, "
                                          f"{a + got} read back")
                        got += n
                    return view

                sha, located = self._scan(bounds, region)
                os.fsync(f.fileno())
            data = None
        index = None
        if self._binary and located:
            index = (np.concatenate([out for _, out in self._index]) if self._index else
                     np.zeros((0, len(self._binary), INDEX_COLUMNS), dtype=np.int64))
        return data, sha, tuple(self._groups), index

    def _scan(self, bounds: list[int],
              region: Callable[[int, int], memoryview]) -> tuple[str, bool]:
        """Hashes the shard region by region (the magic, each row group, the footer) and
        locates each group's binary values in its own: (SHA-256 hex, all located)."""
        sha = hashlib.sha256()
        located = bool(self._binary)
        ends = [*bounds[1:], self.size]
        sha.update(region(0, bounds[0] if bounds else self.size))
        for (start, out), end in zip(self._index, ends):
            view = region(start, end)
            sha.update(view)
            if located:
                located = _locate_group(view, start, out)
        return sha.hexdigest(), located


def _locate_group(view: memoryview, start: int, out: np.ndarray) -> bool:
    """Fills in the offsets (in the shard: `view` starts at `start`) of one row group's binary
    values, column chunk after column chunk; False if one is not there.

    A place is taken when the bytes there have the value's length and checksum: its CRC-32C
    (~3 µs per 83 KB photo), or its CRC-32 in an index without one. Both were computed from the
    value itself by `ShardEncoder.add`; checking the CRC-32 here as well took 0.07 CPU-s of a
    3,000-photo upload's 1.4."""
    cursor = 0
    column, check = ((CRC32C_COLUMN, crc32c) if out.shape[2] > CRC32C_COLUMN
                     else (CRC32_COLUMN, crc32))
    for k in range(out.shape[1]):
        for row in range(out.shape[0]):
            size, crc = int(out[row, k, 1]), int(out[row, k, column])
            at = _place(view, cursor, size, crc, check)
            if at < 0:
                return False
            out[row, k, 0] = start + at + 4
            cursor = at + 4 + size
    return True


def _values_of(values: Sequence[bytes] | PackedValues) -> Iterator[bytes]:
    """`values` one by one as the checksum functions read them: PackedValues's as slices of
    one numpy view of their buffer, neither copied (2 µs per 83 KB photo) nor memoryviews of it,
    which would each have to be released before the buffer can be."""
    if not isinstance(values, PackedValues):
        yield from values
        return
    data = np.frombuffer(values.data, dtype=np.uint8)
    for a, b in itertools.pairwise(values.offsets.tolist()):
        yield cast(bytes, data[a:b])  # bytes-like, as crc32 and crc32c read it


def _place(view: memoryview, cursor: int, size: int, crc: int,
           check: Callable[[memoryview], int] = crc32) -> int:
    """Where a value of `size` bytes whose checksum (`check`: CRC-32 by default) is `crc`
    sits, with its 4-byte length before it, at or after `cursor` in `view`; -1 if nowhere.
    Looks at `cursor` first, then near it, then further: the first place in the view's order.

    Lengths are searched for in copies of `_SEARCH_BYTES` at a time, never of the value: a
    window that spanned the value copied all of it (a 128 MiB record took 128 MiB more)."""
    head = size.to_bytes(4, "little")
    last = len(view) - 4 - size  # the last place where the value would fit

    def holds(at: int) -> bool:
        return (at <= last and view[at:at + 4].tobytes() == head
                and check(view[at + 4:at + 4 + size]) == crc)

    if holds(cursor):
        return cursor
    lo, step = cursor, _NEAR_BYTES
    while lo <= last:
        hi = min(lo + step, last + 1)  # places lo..hi-1, and the 3 bytes after the last
        window = view[lo:hi + 3].tobytes()
        at = window.find(head)
        while 0 <= at < hi - lo:
            if holds(lo + at):
                return lo + at
            at = window.find(head, at + 1)
        lo, step = hi, _SEARCH_BYTES
    return -1


def _binary_array(values: Sequence[bytes] | PackedValues) -> pa.Array:
    """`pa.array(values, pa.binary())`, built from one joined buffer and its offsets: the same
    array, at a fraction of the CPU (no per-value conversion); PackedValues's buffer is used as
    it is (no copy)."""
    if isinstance(values, PackedValues):
        start = int(values.offsets[0])
        return pa.Array.from_buffers(
            pa.binary(), len(values),
            [None, pa.py_buffer((values.offsets - start).astype(np.int32)),
             pa.py_buffer(values.data[start:int(values.offsets[-1])])])
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


# How far past where a value would follow the previous one `_place` looks first: a page header
# (no statistics on binary columns) or the record ids' chunk before a group's first value.
_NEAR_BYTES = 64 << 10
# How much of a row group `_place` copies at a time to search past that.
_SEARCH_BYTES = 1 << 20


def payload_index_bytes(index: np.ndarray) -> bytes:
    """A payload index as the .npy file stored beside its shard."""
    buffer = io.BytesIO()
    np.save(buffer, index, allow_pickle=False)
    return buffer.getvalue()
