from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainfeed.formats.manifest import FieldSpec, Manifest, RowGroupInfo, ShardInfo
from trainfeed.planning.partitions import plan_partitions


def manifest_of(shard_groups: list[list[int]]) -> Manifest:
    """A manifest whose shard k has row groups of the given row counts."""
    shards, first_id = [], 0
    for k, rows in enumerate(shard_groups):
        groups = []
        for n in rows:
            groups.append(RowGroupInfo(n, n, first_id))
            first_id += n
        shards.append(ShardInfo(f"s{k}", sum(rows), 1, "0", tuple(groups)))
    return Manifest("d", "file", (FieldSpec("image", "binary"),), None, first_id, first_id,
                    tuple(shards), {}, "fp", "x.list", "now")


@given(shard_groups=st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=30),
                             min_size=1, max_size=8),
       target=st.integers(1, 200))
def test_partitions_are_disjoint_cover_every_row_group_and_meet_the_target(
        shard_groups: list[list[int]], target: int) -> None:
    manifest = manifest_of(shard_groups)
    parts = plan_partitions(manifest, target)
    covered = [(p.shard, g) for p in parts for g in range(p.row_group_start, p.row_group_stop)]
    every = [(f"s{k}", g) for k, rows in enumerate(shard_groups) for g in range(len(rows))]
    assert sorted(covered) == sorted(every)  # each row group exactly once
    assert [p.index for p in parts] == list(range(len(parts)))
    assert sum(p.num_records for p in parts) == manifest.num_records
    assert len(parts) >= min(target, manifest.num_row_groups)


def test_the_plan_is_a_pure_function_of_manifest_and_target() -> None:
    manifest = manifest_of([[10] * 100, [5] * 28])
    assert plan_partitions(manifest, 64) == plan_partitions(manifest, 64)
    assert len(plan_partitions(manifest, 64)) == 64  # 128 row groups, 2 per partition
