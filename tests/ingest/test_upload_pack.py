"""A packer reads a row group's files straight into one buffer (trainfeed.ingest.pack.read_groups,
issue 30 §2): the shard it writes is byte for byte the one of the record-by-record path, its
payload columns are stored as the files' bytes (uncompressed, no dictionary, no statistics,
page checksums on) and indexed where they are, and a file that changed size since it was
listed is an error naming its list line."""
from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zlib
from collections.abc import Iterable
from pathlib import Path

import crc32c
import numpy as np
import pyarrow.parquet as pq
import pytest
from upload_samples import photo_list

from trainfeed.errors import ListFileError
from trainfeed.formats import shards as shard_format
from trainfeed.formats.manifest import ID_COLUMN, FieldSpec
from trainfeed.formats.shards import RowGroupBuffer
from trainfeed.ingest.inputs import layout_of, read_inputs
from trainfeed.ingest.pack import (
    PackTask,
    cut_groups,
    pack_shard,
    pack_tasks,
    read_groups,
    read_payloads,
)
from trainfeed.ingest.plan import plan_shards
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions

# Small row groups (a few files each) so that a shard has many, read into the two buffers in
# turn: a group read into the buffer the encoder still uses would change the shard's bytes.
OPTIONS = UploadOptions(row_group_rows=7, row_group_bytes=6000, shard_row_groups=64,
                        read_threads=3, processes=1)


def tasks(listing: Path, storage: Path, options: UploadOptions = OPTIONS,
          ) -> list[PackTask]:
    inputs = read_inputs(str(listing), options)
    plans = plan_shards(inputs.sizes, layout_of(options))
    return pack_tasks(inputs, options, open_storage(str(storage)), plans, 1)


def encoded(fields: tuple[FieldSpec, ...], groups: Iterable[RowGroupBuffer],
            path: Path | None = None) -> tuple[bytes, str, np.ndarray | None]:
    """The shard `groups` make (in memory, or in the file `path`), its SHA-256 and its payload
    index."""
    encoder = shard_format.ShardEncoder(shard_format.arrow_schema(fields),
                                        None if path is None else str(path))
    for group in groups:
        encoder.add(group)
    data, sha, _, index = encoder.finish()
    if path is not None:
        assert data is None
        data = memoryview(path.read_bytes())
    assert data is not None and encoder.size == len(data)
    assert sha == hashlib.sha256(data).hexdigest()
    return bytes(data), sha, index


def test_the_buffered_read_writes_what_the_record_by_record_path_writes(tmp_path: Path) -> None:
    (task,) = tasks(photo_list(tmp_path / "source"), tmp_path / "out")
    assert len(list(read_groups(task))) > 4  # the two buffers are reused
    direct, sha, index = encoded(task.fields, read_groups(task))
    streamed, _, streamed_index = encoded(task.fields,
                                          cut_groups(task, read_payloads(task, None)))
    in_file, file_sha, file_index = encoded(task.fields, read_groups(task), tmp_path / "shard")
    assert direct == streamed == in_file and sha == file_sha
    assert index is not None and streamed_index is not None and file_index is not None
    assert np.array_equal(index, streamed_index) and np.array_equal(index, file_index)
    # Every value is where the index says, with its checksums.
    table = pq.read_table(io.BytesIO(direct))
    for (offset, length, crc32, crc32_c), value in zip(index[:, 0], table.column("image")):
        assert direct[offset:offset + length] == value.as_py()
        assert (crc32, crc32_c) == (zlib.crc32(value.as_py()), crc32c.crc32c(value.as_py()))


def test_payload_columns_are_stored_as_the_files_bytes(tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "source")
    (task,) = tasks(listing, tmp_path / "out")
    pack_shard(task)
    meta = pq.read_metadata(tmp_path / "out" / task.shard_path)
    assert meta.num_row_groups > 4
    for g in range(meta.num_row_groups):
        columns = {meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c)
                   for c in range(meta.num_columns)}
        image = columns["image"]
        assert image.compression == "UNCOMPRESSED"
        assert not image.is_stats_set  # no min/max copies of a JPEG in the footer
        assert not image.has_dictionary_page
        assert image.total_compressed_size == image.total_uncompressed_size
        assert columns[ID_COLUMN].is_stats_set  # readers find record ids by them
        assert columns[ID_COLUMN].compression == "SNAPPY"


@pytest.mark.parametrize("change", [b"", b"more bytes"])
def test_a_file_changed_since_listed_is_named_by_its_line(tmp_path: Path, change: bytes) -> None:
    listing = photo_list(tmp_path / "source")
    (task,) = tasks(listing, tmp_path / "out")
    victim = tmp_path / "source/images/5.jpg"  # line 6 of the list
    data = victim.read_bytes()
    victim.write_bytes(data + change if change else data[:-10])
    with pytest.raises(ListFileError, match=r"photos\.list:6: .*images/5\.jpg changed while "
                                            r"being uploaded"):
        pack_shard(task)


UPLOAD_AND_REPORT = """
import sys
from trainfeed.upload import UploadOptions, upload
upload(sys.argv[1], "ds", sys.argv[2], UploadOptions(processes=1), progress=False)
print("pandas" in sys.modules)
"""


def test_an_upload_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow's first `pa.array` imports pandas (0.2 CPU-s, as much as packing 500 photos):
    the upload builds its arrays from buffers (the sources table was the last `pa.array`)."""
    listing = photo_list(tmp_path / "photos", 12)
    result = subprocess.run([sys.executable, "-c", UPLOAD_AND_REPORT, str(listing),
                             str(tmp_path / "storage")], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False"]
