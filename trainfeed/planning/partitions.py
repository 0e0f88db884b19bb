"""Cutting a dataset into partitions: contiguous row-group ranges within one shard.

Partitions are the unit of work the master leases. Many more partitions than workers let fast
workers take more, let a joining worker start at once, and bound what a dead worker's loss costs.
The plan is a pure function of the manifest and the target count, so a restarted master, every
reader and the local reader all agree on it without storing it.
"""
from __future__ import annotations

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


@dataclass(frozen=True)
class Partition:
    index: int
    shard: str  # path relative to the dataset folder
    row_group_start: int
    row_group_stop: int  # exclusive
    num_records: int
    # Payload bytes of its rows (the manifest's row-group figures); 0 for SQL buckets, whose
    # rows are unknown until a worker runs the query.
    num_bytes: int = 0


def plan_partitions(manifest: Manifest,
                    target: int = DEFAULT_TARGET_PARTITIONS) -> tuple[Partition, ...]:
    """Splits the dataset into about `target` partitions (at least `target` where it has that
    many row groups), each a run of whole row groups of one shard.

    Every row group belongs to exactly one partition; partition order follows the shards.
    """
    if target < 1:
        raise ValueError(f"target partitions must be ≥ 1, got {target}")
    if manifest.kind == SQL_KIND:  # fixed at registration: the buckets are part of the dataset
        buckets = int(manifest.extra["sql"]["num_partitions"])
        return tuple(Partition(m, SQL_SHARD, m, buckets, 0) for m in range(buckets))
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
