"""The partition plan: every record in exactly one partition, enough partitions for a small
dataset (slices of row groups), and the plan of large datasets unchanged."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainfeed.formats.manifest import FieldSpec, Manifest, RowGroupInfo, ShardInfo
from trainfeed.planning.partitions import (
    DEFAULT_TARGET_PARTITIONS,
    MIN_PARTITION_ROWS,
    Partition,
    plan_partitions,
    restored_plan,
    whole_row_group_plan,
)


def manifest_of(shard_groups: list[list[int]]) -> Manifest:
    """A manifest whose shard k has row groups of the given row counts (payload: 3 bytes a row)."""
    shards, first_id = [], 0
    for k, rows in enumerate(shard_groups):
        groups = []
        for n in rows:
            groups.append(RowGroupInfo(n, 3 * n, first_id))
            first_id += n
        shards.append(ShardInfo(f"s{k}", sum(rows), 1, "0", tuple(groups)))
    return Manifest("d", "file", (FieldSpec("image", "binary"),), None, first_id, 3 * first_id,
                    tuple(shards), {}, "fp", "x.list", "now")


def rows_of(p: Partition, shard_groups: list[list[int]]) -> list[tuple[str, int]]:
    """The (shard, row within the shard) pairs a partition names."""
    groups = shard_groups[int(p.shard[1:])]
    first = sum(groups[:p.row_group_start]) + p.row_start
    return [(p.shard, r) for r in range(first, first + p.num_records)]


shard_groups_strategy = st.lists(st.lists(st.integers(1, 120), min_size=1, max_size=30),
                                 min_size=1, max_size=8)


@given(shard_groups=shard_groups_strategy, target=st.integers(1, 200))
def test_every_record_is_in_exactly_one_partition_and_the_target_is_met(
        shard_groups: list[list[int]], target: int) -> None:
    manifest = manifest_of(shard_groups)
    parts = plan_partitions(manifest, target)
    covered = [row for p in parts for row in rows_of(p, shard_groups)]
    every = [(f"s{k}", r) for k, groups in enumerate(shard_groups) for r in range(sum(groups))]
    assert sorted(covered) == every  # each record exactly once
    assert covered == every  # in shard, then row order
    assert [p.index for p in parts] == list(range(len(parts)))
    assert all(p.num_records >= 1 for p in parts)
    assert sum(p.num_bytes for p in parts) == manifest.num_bytes
    row_groups = [n for groups in shard_groups for n in groups]
    if len(row_groups) >= target:  # whole row groups, as before slices existed
        assert parts == whole_row_group_plan(manifest, target)
        assert len(parts) >= target
    else:
        # As many as the target, unless that needs slices below MIN_PARTITION_ROWS.
        assert len(parts) == min(target, sum(max(1, n // MIN_PARTITION_ROWS)
                                             for n in row_groups))
        for p in parts:
            whole = shard_groups[int(p.shard[1:])][p.row_group_start]
            assert p.row_group_stop == p.row_group_start + 1
            assert p.num_records >= MIN_PARTITION_ROWS or p.num_records == whole


@given(shard_groups=shard_groups_strategy, target=st.integers(1, 200))
def test_slices_are_near_equal(shard_groups: list[list[int]], target: int) -> None:
    """Within a row group the slices differ by at most one row; across row groups, no row group
    that could still be cut has slices larger than a cut one had before its last cut (the
    largest slice is as small as it can be)."""
    manifest = manifest_of(shard_groups)
    if manifest.num_row_groups >= target:
        return
    slices: dict[tuple[str, int], list[int]] = {}
    for p in plan_partitions(manifest, target):
        slices.setdefault((p.shard, p.row_group_start), []).append(p.num_records)
    for sizes in slices.values():
        assert max(sizes) - min(sizes) <= 1
    cut = [(sum(s), len(s)) for s in slices.values() if len(s) > 1]
    open_ = [(sum(s), len(s)) for s in slices.values()
             if sum(s) // MIN_PARTITION_ROWS >= len(s) + 1]
    for rows, k in cut:
        for other_rows, other_k in open_:
            assert other_rows / other_k <= rows / (k - 1)


def test_the_issue_case_2000_records_in_8_row_groups_gets_64_partitions() -> None:
    """2,000 records of 320x240 JPEGs in 8 MiB row groups (about 250 rows each) were only 8
    partitions; now the default target of 64 is met, 31 or 32 records each."""
    manifest = manifest_of([[250] * 8])
    parts = plan_partitions(manifest)
    assert len(parts) == DEFAULT_TARGET_PARTITIONS == 64
    assert {p.num_records for p in parts} == {31, 32}
    assert sum(p.num_records for p in parts) == 2000


def test_a_large_dataset_keeps_its_plan_of_whole_row_groups() -> None:
    manifest = manifest_of([[10] * 100, [5] * 28])
    parts = plan_partitions(manifest, 64)
    assert parts == plan_partitions(manifest, 64)
    assert len(parts) == 64  # 128 row groups, 2 per partition
    assert all(p.row_start == 0 and p.row_group_stop == p.row_group_start + 2 for p in parts)
    assert parts == whole_row_group_plan(manifest, 64)


def test_golden_plan() -> None:
    """Pins the plan of a small dataset. It may change only with a migration: a master restores
    saved jobs by partition id (see restored_plan) and reader states name partitions."""
    parts = plan_partitions(manifest_of([[20, 9], [40]]), 8)
    assert [(p.shard, p.row_group_start, p.row_start, p.num_records) for p in parts] == [
        ("s0", 0, 0, 10), ("s0", 0, 10, 10), ("s0", 1, 0, 9),
        ("s1", 0, 0, 8), ("s1", 0, 8, 8), ("s1", 0, 16, 8), ("s1", 0, 24, 8), ("s1", 0, 32, 8)]


def test_a_job_saved_before_slices_is_restored_with_its_own_plan() -> None:
    manifest = manifest_of([[250] * 8])
    assert restored_plan(manifest, 64, 64) == plan_partitions(manifest, 64)
    legacy = restored_plan(manifest, 64, 8)
    assert legacy == whole_row_group_plan(manifest, 64)
    assert [(p.row_group_start, p.num_records) for p in legacy] == [(g, 250) for g in range(8)]
    with pytest.raises(ValueError, match="no partition plan of dataset 'd' .* has 9 partitions"):
        restored_plan(manifest, 64, 9)


def test_the_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="target partitions must be ≥ 1, got 0"):
        plan_partitions(manifest_of([[10]]), 0)


def test_a_sql_dataset_s_partitions_are_its_buckets() -> None:
    from dataclasses import replace

    from trainfeed.formats.manifest import SQL_KIND
    from trainfeed.planning.partitions import SQL_SHARD

    manifest = replace(manifest_of([[5]]), kind=SQL_KIND,
                       extra={"sql": {"num_partitions": 3}})
    assert plan_partitions(manifest, 64) == tuple(
        Partition(m, SQL_SHARD, m, 3, 0, 0) for m in range(3))


def test_exactly_target_row_groups_keep_the_whole_row_group_plan() -> None:
    manifest = manifest_of([[100] * 4])
    assert plan_partitions(manifest, 4) == whole_row_group_plan(manifest, 4)
    assert all(p.row_start == 0 and p.num_records == 100 for p in plan_partitions(manifest, 4))


def test_slice_bytes_are_whole_numbers_that_add_up() -> None:
    manifest = manifest_of([[50, 7]])  # 3 bytes a row; 50 rows cut into slices
    parts = plan_partitions(manifest, 8)
    assert all(type(p.num_bytes) is int for p in parts)
    assert sum(p.num_bytes for p in parts) == manifest.num_bytes
    assert [p.num_bytes for p in parts if p.row_group_start == 0] == [
        3 * p.num_records for p in parts if p.row_group_start == 0]


def test_a_local_state_keeps_the_plan_it_counts_in() -> None:
    from trainfeed.planning.partitions import plan_of_state

    manifest = manifest_of([[40] * 4])  # 4 row groups: sliced for a target of 16
    sliced, whole = plan_partitions(manifest, 16), whole_row_group_plan(manifest, 16)
    assert len(sliced) == 16 and len(whole) == 4
    assert plan_of_state(manifest, 16, 16) == sliced
    assert plan_of_state(manifest, 0, 16) == whole  # a state from before slices: whole groups
    assert plan_of_state(manifest, 4, 16) == whole
    assert plan_of_state(manifest, 0) == whole_row_group_plan(manifest)
    with pytest.raises(ValueError, match=r"counts in a plan of 5 partitions, but dataset 'd' "
                                         r"cuts into 16"):
        plan_of_state(manifest, 5, 16)


def test_a_restored_job_of_either_plan_for_a_target() -> None:
    manifest = manifest_of([[40] * 4])
    assert restored_plan(manifest, 16, 16) == plan_partitions(manifest, 16)
    assert restored_plan(manifest, 2, 2) == whole_row_group_plan(manifest, 2)
    big = manifest_of([[16] * 128])  # more row groups than the default target, fewer than 200
    assert restored_plan(big, 200, 128) == whole_row_group_plan(big, 200)
    assert len(restored_plan(big, 200, 128)) == 128


def test_an_empty_row_group_is_an_empty_partition_of_no_bytes() -> None:
    parts = plan_partitions(manifest_of([[0, 40]]), 4)
    assert [(p.row_group_start, p.num_records, p.num_bytes) for p in parts][0] == (0, 0, 0)
    assert sum(p.num_records for p in parts) == 40
