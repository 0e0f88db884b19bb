"""Reading one partition (a row-group range of one shard) from storage into an Arrow table."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.errors import CorruptDatasetError
from trainfeed.formats.manifest import ID_COLUMN
from trainfeed.storage import Storage, access_error

# Shards stay open between partitions (their footers parsed once); a handful covers the shards a
# worker moves between in one epoch without holding many file handles.
OPEN_SHARDS = 8


class PartitionReader:
    """Reads row-group ranges of a dataset's shards.

    Not thread-safe: give each thread its own. `close()` is idempotent.
    """

    def __init__(self, dataset: Storage, columns: Sequence[str]):
        self.dataset = dataset
        self.columns = [ID_COLUMN, *columns]
        self._open: OrderedDict[str, tuple[pq.ParquetFile, Any]] = OrderedDict()

    def _shard(self, shard: str) -> pq.ParquetFile:
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard][0]
        path = self.dataset.path(shard)
        try:
            if self.dataset.is_local:
                # pyarrow's own file reader: no Python in the read path, the GIL stays free.
                handle = None
                parquet = pq.ParquetFile(path, memory_map=False)
            else:
                handle = self.dataset.fs.open(path, "rb")
                parquet = pq.ParquetFile(handle)
        except PermissionError as e:
            raise access_error(self.dataset.url, e) from e
        except FileNotFoundError:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url} is missing (was the dataset deleted or "
                f"re-uploaded while this job ran?)") from None
        self._open[shard] = (parquet, handle)
        while len(self._open) > OPEN_SHARDS:
            _, (old, old_handle) = self._open.popitem(last=False)
            self._close_one(old, old_handle)
        return parquet

    def read(self, shard: str, row_group_start: int, row_group_stop: int,
             num_records: int) -> pa.Table:
        """The rows of row groups [start, stop) of `shard`: the `_id` column, then the fields."""
        parquet = self._shard(shard)
        if row_group_stop > parquet.num_row_groups:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url} has {parquet.num_row_groups} row groups, "
                f"the manifest promised at least {row_group_stop}")
        table = parquet.read_row_groups(range(row_group_start, row_group_stop),
                                        columns=self.columns, use_threads=False)
        if table.num_rows != num_records:
            raise CorruptDatasetError(
                f"shard {shard} of {self.dataset.url}: row groups [{row_group_start}, "
                f"{row_group_stop}) hold {table.num_rows} rows, the manifest says {num_records}")
        return table

    @staticmethod
    def _close_one(parquet: pq.ParquetFile, handle: Any) -> None:
        parquet.close()
        if handle is not None:
            handle.close()

    def close(self) -> None:
        while self._open:
            _, (parquet, handle) = self._open.popitem()
            self._close_one(parquet, handle)
