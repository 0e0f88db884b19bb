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

import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.formats.arrays import int64_array, string_array
from trainfeed.storage import Storage

SOURCES_FILE = "sources.parquet"
SCHEMA = pa.schema([pa.field("_id", pa.int64(), nullable=False),
                    pa.field("path", pa.string()),  # None for text lists
                    pa.field("line", pa.int64(), nullable=False)])


def write_sources(folder: Storage, data_dir: str, ids: Sequence[int],
                  paths: Sequence[str | None], lines: Sequence[int]) -> str:
    """Writes the sources of one upload (atomically); returns its path in the dataset folder."""
    table = pa.table([int64_array(ids), string_array(paths), int64_array(lines)],
                     schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    rel = f"{data_dir}/{SOURCES_FILE}"
    folder.write_atomic(rel, sink.getvalue())
    return rel


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
