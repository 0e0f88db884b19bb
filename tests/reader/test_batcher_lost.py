"""The batcher drops a partition whose lease was lost (revoked, or given back to an idle reader)
from every piece still to come, also when its rows span several batches (issue 13: a partition
given back while its rows sat in the batch buffer)."""
from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from trainfeed.io.prefetch import LoadedPartition, TaskRef
from trainfeed.reader.batcher import Cutter, deliver


class ListStream:
    """A PassStream over loaded partitions in memory; `lose` names partitions whose lease is
    lost once the trainer has had `after` batches."""

    def __init__(self, parts: list[LoadedPartition], lose: set[int], after: int):
        self.parts = parts
        self.lose, self.after = lose, after
        self.epoch: int | None = 0
        self.positions: dict[int, int] = {}
        self.delivered = 0
        self.handed_batches = 0
        self.consumed_parts: list[int] = []
        self.forgotten: list[int] = []
        self.claimed: set[int] = set()
        self.closed: bool | None = None

    def __iter__(self) -> Iterator[LoadedPartition | None]:
        yield from self.parts

    def entered(self, part: LoadedPartition) -> None:
        pass

    def taken(self, part: LoadedPartition) -> None:
        pass

    def consumed(self, part: LoadedPartition) -> None:
        self.consumed_parts.append(part.task.partition)

    def progress(self, part: LoadedPartition, handed: int) -> None:
        pass

    def close(self, finished: bool) -> None:
        self.closed = finished

    def lost(self, part: LoadedPartition) -> bool:
        partition = part.task.partition
        if partition in self.lose and self.handed_batches >= self.after:
            return True
        self.claimed.add(partition)
        return False

    def forget(self, part: LoadedPartition) -> None:
        self.forgotten.append(part.task.partition)


def part(partition: int, first_id: int, rows: int) -> LoadedPartition:
    table = pa.table({"_id": pa.array(range(first_id, first_id + rows), pa.int64())})
    return LoadedPartition(TaskRef(0, partition, "s", 0, 1, rows), table)


def test_a_lost_partition_s_rows_are_dropped_from_every_later_batch() -> None:
    # Batches of 10 over partitions of 25: partition 1 (ids 25-49) fills batches 2 to 5. It is
    # lost after 1 batch, before any of its rows reached the trainer.
    stream = ListStream([part(0, 0, 25), part(1, 25, 25), part(2, 50, 25)], {1}, after=1)

    def ids(piece: object) -> list[int]:
        return piece.table.column("_id").to_pylist()  # type: ignore[attr-defined]

    got: list[list[int]] = []
    for batch in deliver(stream, Cutter(10), ids):  # type: ignore[arg-type]
        got.append(batch)
        stream.handed_batches += 1
    flat = [i for b in got for i in b]
    assert flat == list(range(25)) + list(range(50, 75))  # nothing of partition 1, in order
    assert stream.forgotten == [1] and 1 not in stream.consumed_parts
    assert sorted(stream.consumed_parts) == [0, 2] and stream.closed is True
