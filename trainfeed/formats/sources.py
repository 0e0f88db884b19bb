"""Where each record came from: its file and its line in the uploaded `.list`.

A record that fails at read time (an image that does not decode, a label the validation set does
not know) is only actionable if the error names the file the user can open and the list line
they can fix, not "record 14 of shard data/…/shard-00000.parquet". The shards carry no such
column: the hot read path never pays for it. Instead each upload writes one small Parquet file
beside its shards (record id, path as written in the list, line number), read only when an
error needs it, and the manifest names it.
"""
from __future__ import annotations

import io
import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.storage import Storage

SOURCES_FILE = "sources.parquet"
SCHEMA = pa.schema([pa.field("_id", pa.int64(), nullable=False),
                    pa.field("path", pa.string()),  # None for text lists
                    pa.field("line", pa.int64(), nullable=False)])


def write_sources(folder: Storage, data_dir: str, ids: Sequence[int],
                  paths: Sequence[str | None], lines: Sequence[int]) -> str:
    """Writes the sources of one upload (atomically); returns its path in the dataset folder."""
    table = pa.table([_int64_array(ids), _string_array(paths), _int64_array(lines)],
                     schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    rel = f"{data_dir}/{SOURCES_FILE}"
    folder.write_atomic(rel, sink.getvalue())
    return rel


# Built from buffers, not with `pa.array`: pyarrow's first `pa.array` call imports pandas
# (0.2 CPU-s), which an upload would pay for this one small table.
def _int64_array(values: Sequence[int]) -> pa.Array:
    data = np.asarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def _string_array(values: Sequence[str | None]) -> pa.Array:
    """Strings, or all None (a text list's records have no file)."""
    if all(v is None for v in values):
        return pa.nulls(len(values), pa.string())
    encoded = [v.encode() if v is not None else b"" for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in encoded], out=offsets[1:])
    valid = None
    if any(v is None for v in values):
        valid = pa.py_buffer(np.packbits([v is not None for v in values], bitorder="little"))
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


class SourceIndex:
    """Looks up records' sources, loading the file on first use (errors are rare). A dataset
    grown by appends has one sources file per version (`more`: the others' (path, list name)),
    each naming its own list."""

    def __init__(self, folder: Storage, rel: str | None, list_name: str,
                 more: Sequence[tuple[str | None, str]] = ()):
        self.folder = folder
        self.rel = rel
        self.list_name = list_name
        self._others = [SourceIndex(folder, r, name) for r, name in more if r != rel]
        self._by_id: dict[int, tuple[str | None, int]] | None = None
        self._lock = threading.Lock()

    def _load(self) -> dict[int, tuple[str | None, int]]:
        with self._lock:
            if self._by_id is None:
                by_id: dict[int, tuple[str | None, int]] = {}
                if self.rel is not None:
                    try:
                        # One thread, no read-ahead: a reader process must start no Arrow
                        # pool threads, which can abort the interpreter's exit (Arrow #34314).
                        table = pq.ParquetFile(io.BytesIO(self.folder.read_bytes(self.rel)),
                                               pre_buffer=False).read(use_threads=False)
                    except (OSError, pa.ArrowException):
                        table = None  # provenance is a courtesy: never mask the real error
                    if table is not None:
                        rows = zip(*(table.column(c).to_pylist() for c in SCHEMA.names))
                        by_id = {i: (path, line) for i, path, line in rows}
                self._by_id = by_id
            return self._by_id

    def describe(self, record_id: int) -> str:
        """'images/000014.jpg, train_data.list line 16' (or '' when unknown)."""
        found = self._load().get(int(record_id))
        if found is None:
            for other in self._others:
                if text := other.describe(record_id):
                    return text
            return ""
        path, line = found
        where = f"{self.list_name} line {line}"
        return f"{path}, {where}" if path is not None else where
