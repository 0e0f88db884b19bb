"""Which records go to which shard: a pure function of the records' sizes and the layout.

Planning before reading is what lets several processes (or the indexes of a cluster job) pack
shards independently and still write exactly what one process would: shard k holds the same
records whoever packs it, so the manifest and every shard's bytes do not depend on the process
count. The cut is the one a single writer makes as records stream past it (a row group ends at
`row_group_rows` records or before passing `row_group_bytes`; a shard ends after a row group
that brings it to `shard_row_groups` groups or `shard_bytes` bytes), applied to the sizes known
before reading: the files' sizes plus their other columns. Where an upload transforms files
(--jpeg-restarts, --max-side) the stored sizes differ from those: shards are still planned from
the files' sizes, and row groups are cut within each shard from the stored sizes (`row_groups`),
which the transform determines as well.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The layout knobs of UploadOptions that planning reads."""

    row_group_rows: int
    row_group_bytes: int
    shard_row_groups: int
    shard_bytes: int


@dataclass(frozen=True)
class ShardPlan:
    """Shard `index` holds the records at positions [start, stop) of the upload's entries."""

    index: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def row_groups(sizes: Sequence[int], layout: Layout) -> list[int]:
    """The number of records in each consecutive row group of records of `sizes`."""
    groups: list[int] = []
    rows = payload = 0
    for size in sizes:
        if rows and (rows >= layout.row_group_rows or payload + size > layout.row_group_bytes):
            groups.append(rows)
            rows = payload = 0
        rows += 1
        payload += size
    if rows:
        groups.append(rows)
    return groups


def plan_shards(sizes: Sequence[int], layout: Layout) -> tuple[ShardPlan, ...]:
    """The shards of an upload of records of `sizes` (see the module docstring).

    >>> plan_shards([5] * 10, Layout(row_group_rows=2, row_group_bytes=100,
    ...                              shard_row_groups=2, shard_bytes=1000))[-1]
    ShardPlan(index=2, start=8, stop=10)
    """
    shards: list[ShardPlan] = []
    start = at = groups = payload = 0
    for rows in row_groups(sizes, layout):
        payload += sum(sizes[at:at + rows])
        at += rows
        groups += 1
        if groups >= layout.shard_row_groups or payload >= layout.shard_bytes:
            shards.append(ShardPlan(len(shards), start, at))
            start, groups, payload = at, 0, 0
    if at > start:
        shards.append(ShardPlan(len(shards), start, at))
    return tuple(shards)


def slice_of(shards: Sequence[ShardPlan], index: int, count: int) -> tuple[ShardPlan, ...]:
    """The contiguous run of `shards` that index `index` of `count` packs (a cluster job's
    JOB_COMPLETION_INDEX): as even as whole shards allow; empty when there are fewer shards
    than indexes."""
    if not 0 <= index < count:
        raise ValueError(f"index {index} is not one of the {count} indexes 0..{count - 1}")
    return tuple(shards[len(shards) * index // count:len(shards) * (index + 1) // count])
