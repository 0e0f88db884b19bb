"""Rows of a table in a new order, without copying the encoded images.

A shuffled pass reorders every record twice before decoding: a partition is permuted in its
delivery order, then the shuffle buffer interleaves partitions. `Table.take` copies every value
each time (and a chunked column is first concatenated: one more copy), into memory the kernel
must zero first. For 83 KB JPEGs, `perf` put that at a tenth of the reader's CPU. Here, a
binary column of large values is gathered as zero-copy slices of the buffers the partition
was read into: the decoder reads each value where Parquet put it. Small columns (ids, labels)
are taken as usual: copying them is cheaper than keeping a slice per row.

What it costs: a piece keeps the buffers of the partitions its rows come from alive until it is
decoded, a few partitions at most, since the prefetch window bounds what is in flight.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

# Binary columns whose values average at least this many bytes are gathered as slices: below
# it, a Python slice object per run costs more than the copy it saves.
SLICE_AT_BYTES = 4096
# How many of a column's chunks `_gathered_by_slices` looks at.
SAMPLE_CHUNKS = 8
# `compacted` copies at most this many bytes (binary offsets are 32-bit: a larger table would
# not fit one array, and keeps its slices).
COMPACT_MAX_BYTES = 1 << 30


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """`table.take(rows)`, with large binary columns as slices of `table`'s own buffers."""
    rows = np.asarray(rows, dtype=np.int64)
    sliced = [name for name, column in zip(table.column_names, table.columns)
              if _gathered_by_slices(column)]
    if not sliced:
        return table.take(rows)
    rest = [name for name in table.column_names if name not in sliced]
    taken = table.select(rest).take(rows) if rest else None
    columns = [gather_slices(table.column(name), rows) if name in sliced
               else taken.column(name)  # type: ignore[union-attr]
               for name in table.column_names]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _gathered_by_slices(column: pa.ChunkedArray) -> bool:
    """Large binary values: encoded images, or decoded pixels from remote decode (fixed-size
    binary, in the trainer's shared memory: `take` copied each image twice, concatenating the
    window's chunks and then taking, before the batch's own copy).

    Judged from the first SAMPLE_CHUNKS chunks: the whole column's `nbytes` visits every chunk,
    and after a partition's permutation there is one per row (1 µs a row, with the GIL held, in
    the shuffle window's cut: issue 39). A column's values are of one kind (images, or small
    fields), so its first chunks tell."""
    kind = column.type
    if pa.types.is_fixed_size_binary(kind):
        return len(column) > 0 and kind.byte_width >= SLICE_AT_BYTES
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return False
    sample = [column.chunk(i) for i in range(min(SAMPLE_CHUNKS, column.num_chunks))]
    rows = sum(len(chunk) for chunk in sample)
    return rows > 0 and sum(chunk.nbytes for chunk in sample) >= SLICE_AT_BYTES * rows


def gather_slices(column: pa.ChunkedArray, rows: np.ndarray) -> pa.ChunkedArray:
    """Values `rows` of `column` as one zero-copy slice per run of consecutive rows."""
    if not len(rows):
        return pa.chunked_array([], type=column.type)
    if column.num_chunks == 1:
        return _from_one_chunk(column.chunk(0), rows)
    # Each `column.chunks` makes a Python object per chunk: after a partition's permutation
    # that is one per row, so it is listed once (benchmarks/gather_cost.py, issue 39).
    chunks = column.chunks
    sizes = [len(chunk) for chunk in chunks]
    starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    if rows.min() < 0 or rows.max() >= starts[-1]:
        raise IndexError(f"rows out of bounds for a column of {starts[-1]} values")
    chunk_of = np.searchsorted(starts, rows, side="right") - 1
    within = rows - starts[chunk_of]
    # A run: the next row is the next value of the same chunk.
    breaks = np.flatnonzero((chunk_of[1:] != chunk_of[:-1]) | (within[1:] != within[:-1] + 1))
    run_starts, run_lengths = _runs_after(breaks, len(rows))
    # A run that is a whole chunk is that chunk (the shuffle window's runs are mostly whole
    # one-row chunks of the permuted partitions), not a slice of it.
    return pa.chunked_array(
        [chunks[c] if n == sizes[c] else chunks[c].slice(i, n)
         for c, i, n in zip(chunk_of[run_starts].tolist(), within[run_starts].tolist(),
                            run_lengths.tolist())],
        type=column.type)


def _from_one_chunk(chunk: pa.Array, rows: np.ndarray) -> pa.ChunkedArray:
    """`gather_slices` of a column of one chunk (a partition as it was read): the runs follow
    from the rows alone, without finding each row's chunk (a quarter of a partition's
    permutation's Python: 1.95 against 1.48 µs a record, benchmarks/gather_cost.py)."""
    if rows.min() < 0 or rows.max() >= len(chunk):
        raise IndexError(f"rows out of bounds for a column of {len(chunk)} values")
    breaks = np.flatnonzero(rows[1:] != rows[:-1] + 1)
    if len(breaks) == len(rows) - 1:  # every row a run of its own: a permutation, mostly
        return pa.chunked_array([chunk.slice(i, 1) for i in rows.tolist()], type=chunk.type)
    run_starts, run_lengths = _runs_after(breaks, len(rows))
    return pa.chunked_array([chunk.slice(i, n) for i, n in zip(rows[run_starts].tolist(),
                                                                run_lengths.tolist())],
                            type=chunk.type)


def _runs_after(breaks: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of `count` rows, a run ending after each row in `breaks`."""
    starts = np.concatenate(([0], breaks + 1))
    return starts, np.diff(np.append(starts, count))


def compacted(table: pa.Table) -> pa.Table:
    """`table`'s rows copied into buffers of their own, so that it no longer holds the buffers
    its slices point into.

    For the rows a shuffle window leaves over for the next one: as slices, a few of them kept
    every partition they came from alive, and a few of those stayed over again. Counted on the
    ImageNet-like train reader: up to 48 partitions' read buffers (~6 MB each) alive at once
    for a shuffle buffer of 1,024 records (~15 partitions), 37 with the copy; beyond what the
    read-buffer pool keeps, a row group is read into fresh pages the kernel must zero first (5 %
    of the reader's CPU, `perf`). Copying the leftover rows (at most a batch) costs ~20 KB per
    image.
    """
    if not table.num_rows or table.nbytes > COMPACT_MAX_BYTES:
        return table
    # (`combine_chunks` would hand a single chunk back as it is, slice and all.)
    return table.take(np.arange(table.num_rows))
