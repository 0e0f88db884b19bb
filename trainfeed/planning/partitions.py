"""Cutting a dataset into partitions: contiguous row-group ranges within one shard, or contiguous
row slices of one row group when the dataset has fewer row groups than partitions wanted.

Partitions are the unit of work the master leases. Many more partitions than workers let fast
workers take more, let a joining worker start at once, and bound what a dead worker's loss costs.
The plan is a pure function of the manifest and the target count, so a restarted master, every
reader and the local reader all agree on it without storing it.

The rule (docs/architecture.md too): a dataset gets at least `target` partitions (64 by default:
16 for each of an expected 4 workers) unless that would take partitions of fewer than
MIN_PARTITION_ROWS records. With at least `target` row groups, a partition is a run of whole row
groups (the plan of every release before slices existed, kept unchanged so that saved jobs keep
their partition ids); with fewer, row groups are cut into contiguous slices of near-equal size (a
partition is then rows [row_start, row_start + num_records) of one row group), exactly `target`
of them where MIN_PARTITION_ROWS allows. A row group smaller than 2 × MIN_PARTITION_ROWS stays
whole. `trainfeed upload --rows-per-group` sets the row-group size.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from trainfeed.formats.manifest import SQL_KIND, Manifest

# A SQL dataset's partitions are hash buckets of its query's rows (trainfeed.sql.dataset): the
# task names this pseudo-shard, bucket `row_group_start` of `row_group_stop`; each worker runs
# its bucket's query itself.
SQL_SHARD = "<sql>"

# "≥ 16 partitions per expected worker" (the design): 16 × an expected 4 workers.
PARTITIONS_PER_WORKER = 16
DEFAULT_EXPECTED_WORKERS = 4
DEFAULT_TARGET_PARTITIONS = PARTITIONS_PER_WORKER * DEFAULT_EXPECTED_WORKERS
# The smallest slice a row group is cut into. Partitions exist to balance readers, and a reader
# can be at most one partition behind another: at 8 records that is a fraction of any training
# batch, so finer slices buy no balance, while each one still costs a task, an acknowledgement
# and a read of its row group's small columns. A row group of fewer rows stays whole.
MIN_PARTITION_ROWS = 8


@dataclass(frozen=True)
class Partition:
    index: int
    shard: str  # path relative to the dataset folder
    row_group_start: int
    row_group_stop: int  # exclusive
    num_records: int
    # Payload bytes of its rows (the manifest's row-group figures, shared among a row group's
    # slices in proportion to their rows); 0 for SQL buckets, whose rows are unknown until a
    # worker runs the query.
    num_bytes: int = 0
    # The partition's first row, counted from the start of row group `row_group_start`: it is
    # rows [row_start, row_start + num_records) of its row groups (0 for whole row groups).
    row_start: int = 0


def plan_partitions(manifest: Manifest,
                    target: int = DEFAULT_TARGET_PARTITIONS) -> tuple[Partition, ...]:
    """Splits the dataset into about `target` partitions: at least `target` unless that would
    take slices of fewer than MIN_PARTITION_ROWS records (see the module docstring).

    Every record belongs to exactly one partition; partition order follows the shards, and
    within a shard the rows. Deterministic: a pure function of (manifest, target).
    """
    if target < 1:
        raise ValueError(f"target partitions must be ≥ 1, got {target}")
    if manifest.kind == SQL_KIND:  # fixed at registration: the buckets are part of the dataset
        buckets = int(manifest.extra["sql"]["num_partitions"])
        return tuple(Partition(m, SQL_SHARD, m, buckets, 0) for m in range(buckets))
    # mutmut: `>` is equivalent: at exactly `target` row groups the sliced plan cuts nothing.
    if manifest.num_row_groups >= target:
        return whole_row_group_plan(manifest, target)
    return _sliced_plan(manifest, target)


def whole_row_group_plan(manifest: Manifest,
                         target: int = DEFAULT_TARGET_PARTITIONS) -> tuple[Partition, ...]:
    """Runs of whole row groups of one shard, `num_row_groups // target` each: the plan of
    every dataset before row groups were sliced (jobs saved then are restored with it)."""
    per_partition = max(1, manifest.num_row_groups // target)
    partitions: list[Partition] = []
    for shard in manifest.shards:
        groups = shard.row_groups
        for start in range(0, len(groups), per_partition):
            stop = min(start + per_partition, len(groups))
            partitions.append(Partition(
                index=len(partitions), shard=shard.path, row_group_start=start,
                row_group_stop=stop, num_records=sum(g.num_rows for g in groups[start:stop]),
                num_bytes=sum(g.num_bytes for g in groups[start:stop])))
    return tuple(partitions)


def _sliced_plan(manifest: Manifest, target: int) -> tuple[Partition, ...]:
    """Fewer row groups than `target`: each row group cut into k near-equal row slices.

    The k are dealt one at a time to the row group whose slices are currently the largest (ties:
    the earlier row group), which makes the largest slice as small as it can be; a row group
    takes no more slices than it has MIN_PARTITION_ROWS-row runs.
    """
    groups = [(shard.path, g, info) for shard in manifest.shards
              for g, info in enumerate(shard.row_groups)]
    slices = [1] * len(groups)
    # Max-heap on the current slice size (rows / slices), then the group's order.
    heap: list[tuple[float, int]] = [(-float(info.num_rows), k)
                                     for k, (_, _, info) in enumerate(groups)
                                     # mutmut: `/` for `//` is equivalent (n/8 ≥ 2 ⟺ n//8 ≥ 2)
                                     if info.num_rows // MIN_PARTITION_ROWS >= 2]
    heapq.heapify(heap)
    count = len(groups)
    while count < target and heap:
        _, k = heapq.heappop(heap)
        slices[k] += 1
        count += 1
        rows = groups[k][2].num_rows
        # mutmut: `/` for `//` is equivalent here too (the right side is a whole number).
        if rows // MIN_PARTITION_ROWS >= slices[k] + 1:
            heapq.heappush(heap, (-rows / slices[k], k))
    partitions: list[Partition] = []
    for (shard, g, info), k in zip(groups, slices):
        for j in range(k):
            # Near-equal: the slices of one row group differ by at most one row.
            start, stop = (info.num_rows * j) // k, (info.num_rows * (j + 1)) // k
            partitions.append(Partition(
                index=len(partitions), shard=shard, row_group_start=g, row_group_stop=g + 1,
                num_records=stop - start,
                num_bytes=(info.num_bytes * stop) // info.num_rows
                - (info.num_bytes * start) // info.num_rows if info.num_rows else 0,
                row_start=start))
    return tuple(partitions)


def restored_plan(manifest: Manifest, target: int, num_partitions: int) -> tuple[Partition, ...]:
    """The plan a saved job of `num_partitions` partitions was made with.

    A job saved before row groups were sliced, on a dataset of fewer row groups than `target`,
    has one partition per row group; its ledger's partition ids must keep naming those rows, so
    it keeps that plan. Any other job has today's plan. Raises ValueError if neither matches
    (the caller starts the job afresh).
    """
    for plan in (plan_partitions(manifest, target), whole_row_group_plan(manifest, target)):
        if len(plan) == num_partitions:
            return plan
    raise ValueError(f"no partition plan of dataset {manifest.name!r} (target {target}) has "
                     f"{num_partitions} partitions")


def plan_of_state(manifest: Manifest, saved_partitions: int,
                  target: int = DEFAULT_TARGET_PARTITIONS) -> tuple[Partition, ...]:
    """The plan whose partition ids a local reader's saved state counts in: the state says how
    many partitions its plan had; 0 (a state written before it said so, hence before row groups
    were sliced) means one per run of whole row groups. A reader restored from it keeps that
    plan, so its `done` and `positions` name the records they named when saved.

    Raises:
        ValueError: no plan of the dataset has that many partitions (was it re-uploaded?).
    """
    count = saved_partitions or len(whole_row_group_plan(manifest, target))
    try:
        return restored_plan(manifest, target, count)
    except ValueError:
        raise ValueError(f"reader state counts in a plan of {count} partitions, but dataset "
                         f"{manifest.name!r} cuts into {len(plan_partitions(manifest, target))}"
                         f": was it re-uploaded?") from None
