"""take_rows: Table.take, with large binary values as slices of the table's own buffers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from trainfeed.decode.pixels import binary_views
from trainfeed.io.gather import SAMPLE_CHUNKS, SLICE_AT_BYTES, gather_slices, take_rows


def blob(i: int) -> bytes:
    return bytes([i % 251]) * (SLICE_AT_BYTES + 37 * i)


def table_in_chunks(sizes: list[int]) -> pa.Table:
    """ids, labels and large blobs (row i: blob(i)), in record batches of `sizes` rows."""
    batches, start = [], 0
    for size in sizes:
        rows = range(start, start + size)
        batches.append(pa.record_batch({
            "_id": pa.array(list(rows), pa.int64()),
            "label": pa.array([f"c{i % 3}" for i in rows]),
            "image": pa.array([blob(i) for i in rows], pa.binary())}))
        start += size
    return pa.Table.from_batches(batches)


@pytest.mark.parametrize("rows", [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],  # in order: one run per chunk
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],  # reversed: a slice per row
    [3, 4, 5, 0, 1, 8, 9, 2, 6, 7],  # runs that cross chunk boundaries
    [5, 5, 5, 2],  # repeats (an oversampled record)
    [],
])
@pytest.mark.parametrize("chunks", [[4, 1, 5], [10]])  # [10]: a partition as it was read
def test_the_same_table_as_take(rows: list[int], chunks: list[int]) -> None:
    table = table_in_chunks(chunks)
    order = np.array(rows, dtype=np.int64)
    taken = take_rows(table, order)
    assert taken.schema == table.schema
    assert taken.to_pylist() == table.take(order).to_pylist()
    assert [bytes(v) for v in binary_views(taken.column("image"))] == [blob(i) for i in rows]


def test_large_values_are_not_copied_and_small_columns_are() -> None:
    table = table_in_chunks([6, 4])
    taken = take_rows(table, np.array([7, 8, 1, 2, 3]))
    source = {chunk.buffers()[2].address for chunk in table.column("image").chunks}
    assert {chunk.buffers()[2].address for chunk in taken.column("image").chunks} <= source
    assert taken.column("image").num_chunks == 2  # runs [7, 8] and [1, 2, 3]
    assert taken.column("label").num_chunks == 1  # taken as usual


def test_a_permuted_partition_is_gathered_again_from_its_one_row_chunks() -> None:
    # The shuffle window's cut: partitions already permuted (a one-row chunk per record, as
    # `take_rows` leaves them) are concatenated and permuted again; each record is its own
    # one-row chunk, passed on as it is, without a copy.
    first = take_rows(table_in_chunks([12]), np.arange(11, -1, -1))
    assert first.column("image").num_chunks == 12
    window = pa.concat_tables([first, first.slice(0, 5)])
    order = np.random.default_rng(3).permutation(window.num_rows)
    taken = take_rows(window, order)
    assert taken.to_pylist() == window.take(order).to_pylist()
    source = {chunk.buffers()[2].address for chunk in first.column("image").chunks}
    assert {chunk.buffers()[2].address for chunk in taken.column("image").chunks} == source


def test_whether_values_are_sliced_is_judged_from_the_first_chunks() -> None:
    # Visiting every chunk's size cost 1 µs a row once partitions were permuted (one chunk per
    # row): the first SAMPLE_CHUNKS tell. Large images first, then many tiny values: sliced,
    # although the column's mean value is under SLICE_AT_BYTES.
    chunks = [pa.array([blob(i)], pa.binary()) for i in range(SAMPLE_CHUNKS)]
    chunks += [pa.array([b"x"], pa.binary())] * (40 * SAMPLE_CHUNKS)
    table = pa.table({"image": pa.chunked_array(chunks)})
    assert table.column("image").nbytes < SLICE_AT_BYTES * table.num_rows
    rows = np.array([2, 0, 100])
    taken = take_rows(table, rows)
    assert taken.column("image").to_pylist() == [blob(2), blob(0), b"x"]
    assert taken.column("image").chunk(0).buffers()[2].address == \
        chunks[2].buffers()[2].address  # a slice, not a copy
    small = pa.table({"image": pa.chunked_array(chunks[::-1])})  # tiny values first: taken
    assert take_rows(small, rows).column("image").num_chunks == 1


def test_small_binary_values_are_taken_as_usual() -> None:
    table = pa.table({"code": pa.array([b"ab", b"c", b"def"], pa.binary())})
    taken = take_rows(table, np.array([2, 0]))
    assert taken.column("code").to_pylist() == [b"def", b"ab"]
    assert taken.column("code").chunks[0].buffers()[2].address != \
        table.column("code").chunks[0].buffers()[2].address


def test_nulls_and_large_binary_keep_their_type_and_values() -> None:
    values = [blob(1), None, blob(2), blob(3)]
    for kind in (pa.binary(), pa.large_binary()):
        table = pa.table({"image": pa.array(values, kind)})
        taken = take_rows(table, np.array([3, 1, 0]))
        assert taken.column("image").type == kind
        assert taken.column("image").to_pylist() == [values[3], None, values[0]]


@pytest.mark.parametrize("chunks", [[3, 3], [6]])
def test_rows_out_of_bounds_are_an_error_not_a_wrong_value(chunks: list[int]) -> None:
    column = table_in_chunks(chunks).column("image")
    for rows in ([6], [-1], [0, 7], [5, 4, 6]):
        with pytest.raises(IndexError, match="out of bounds"):
            gather_slices(column, np.array(rows, dtype=np.int64))


def test_decoded_pixels_are_gathered_without_a_copy() -> None:
    """Remote decode's fixed-size binary pixels (trainfeed.decode.remote): the shuffle
    buffer's reorder keeps them where the decoder wrote them."""
    size = SLICE_AT_BYTES
    pixels = [pa.array([bytes([i]) * size for i in rows], pa.binary(size))
              for rows in (range(0, 3), range(3, 5))]
    table = pa.Table.from_batches([pa.record_batch({"_id": pa.array(list(rows), pa.int64()),
                                                    "image": column})
                                   for rows, column in zip((range(0, 3), range(3, 5)), pixels)])
    taken = take_rows(table, np.array([4, 0, 1, 3]))
    assert taken.column("image").type == pa.binary(size)
    assert taken.column("image").to_pylist() == [bytes([i]) * size for i in (4, 0, 1, 3)]
    source = {column.buffers()[1].address for column in pixels}
    assert {chunk.buffers()[1].address for chunk in taken.column("image").chunks} <= source
