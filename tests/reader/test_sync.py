"""Synchronous readers (issue 13) without a master: who a process is in its group, the static
local shares, and what the adapters tell the frameworks (steps per epoch)."""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from optional import require

from trainfeed import BatchOptions, LocalSource, PipelineOptions, SamplingOptions, SyncOptions, dist
from trainfeed.errors import ConfigurationError
from trainfeed.reader.world import SyncGroup, detect_world, locate
from trainfeed.upload import UploadOptions, upload

RECORDS = 500


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """500 text records in row groups of 20 (25 partitions)."""
    folder = tmp_path_factory.mktemp("sync")
    listing = folder / "rows.list"
    listing.write_text("".join(f"row {i}\tc{i % 4}\n" for i in range(RECORDS)))
    out = str(folder / "storage")
    upload(str(listing), "rows", out, UploadOptions(kind="text", row_group_rows=20),
           progress=False)
    return out


def test_the_group_comes_from_torchrun_slurm_tf_config_or_the_arguments() -> None:
    assert detect_world(4, 1, {"WORLD_SIZE": "4", "RANK": "1"}) == (4, 1)
    assert detect_world(4, 1, {}) == (4, 1)
    assert detect_world(environ={"WORLD_SIZE": "8", "RANK": "3"}) == (8, 3)
    assert detect_world(environ={"SLURM_NTASKS": "4", "SLURM_PROCID": "2"}) == (4, 2)
    # torchrun inside srun renumbers SLURM's tasks: WORLD_SIZE/RANK win, no disagreement.
    assert detect_world(environ={"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "WORLD_SIZE": "8",
                                 "RANK": "3"}) == (8, 3)
    tf_config = {"cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]},
                 "task": {"type": "worker", "index": 1}}
    assert detect_world(environ={"TF_CONFIG": json.dumps(tf_config)}) == (3, 2)
    tf_config["task"] = {"type": "chief", "index": 0}
    assert detect_world(environ={"TF_CONFIG": json.dumps(tf_config)}) == (3, 0)
    assert detect_world(environ={}) == (1, 0)


class FakeTorchDistributed:
    """What `torch.distributed` answers in a process that called init_process_group."""

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return self.world_size

    def get_rank(self) -> int:
        return self.rank


def test_an_initialised_torch_distributed_gives_the_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: mp.spawn + init_process_group(rank=, world_size=) sets no environment."""
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeTorchDistributed(2, 1))
    assert locate(environ={}) == (2, 1, "torch.distributed (init_process_group)")
    assert detect_world(2, 1, {"WORLD_SIZE": "2", "RANK": "1"}) == (2, 1)
    # Its group supersedes SLURM's task numbers (one srun task spawning a process per GPU).
    assert detect_world(environ={"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) == (2, 1)


@pytest.mark.parametrize("environ,kwargs,named", [
    ({"WORLD_SIZE": "1", "RANK": "0"}, {},
     [r"torch.distributed \(init_process_group\) says rank 1 of world size 2",
      r"\$WORLD_SIZE/\$RANK says rank 0 of world size 1"]),
    ({}, {"world_size": 2, "rank": 0},
     ["torch.distributed", "world_size=/rank= says rank 0 of world size 2"]),
])
def test_sources_that_disagree_are_refused_naming_each(
        monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], kwargs: dict[str, Any],
        named: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeTorchDistributed(2, 1))
    with pytest.raises(ConfigurationError, match="given twice, differently") as e:
        detect_world(environ=environ, **kwargs)
    for pattern in named:
        assert re.search(pattern, str(e.value)), (pattern, str(e.value))


def test_the_environment_and_arguments_that_disagree_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"\$SLURM_NTASKS/\$SLURM_PROCID says rank 2 "
                                                 r"of world size 4; world_size=/rank= says "
                                                 r"rank 1 of world size 4"):
        detect_world(4, 1, {"SLURM_NTASKS": "4", "SLURM_PROCID": "2"})


@pytest.mark.parametrize("kwargs,environ,error,match", [
    ({"world_size": 2}, {}, ValueError, "together"),
    ({"world_size": 2, "rank": 2}, {}, ValueError, "rank 2 of world size 2"),
    ({}, {"WORLD_SIZE": "2"}, ConfigurationError, r"\$WORLD_SIZE and \$RANK"),
    ({}, {"WORLD_SIZE": "2", "RANK": "x"}, ConfigurationError, r"\$RANK='x'"),
    ({}, {"TF_CONFIG": "{"}, ConfigurationError, "not TensorFlow's cluster JSON"),
    ({}, {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a"]},
                                   "task": {"type": "ps", "index": 0}})},
     ConfigurationError, "takes no batches"),
    ({}, {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a"]},
                                   "task": {"type": "worker", "index": 3}})},
     ConfigurationError, "not in its cluster"),
])
def test_a_bad_group_is_named(kwargs: dict[str, Any], environ: dict[str, str],
                              error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        detect_world(environ=environ, **kwargs)


def test_a_group_keeps_whole_steps_and_shares_them() -> None:
    group = SyncGroup(world_size=3, rank=1, batch_size=32)
    assert group.steps(3000) == 31 and group.quota(3000) == 992 and group.kept(3000) == 2976
    assert group.share(3000) == (992, 1984)
    with pytest.raises(ValueError, match="0 ≤ rank < world_size"):
        SyncGroup(2, 2, 8)


@pytest.mark.parametrize("shuffle", [0, 64])
def test_local_ranks_take_equal_disjoint_shares_every_epoch(storage: str, shuffle: int) -> None:
    world, batch = 3, 16  # 500 // 48 = 10 steps: 480 kept, 20 dropped
    seen: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
    for rank in range(world):
        reader = dist.reader("rows", source=LocalSource(storage=storage, seed=5),
                             pipeline=PipelineOptions(
                                 batch=BatchOptions(size=batch),
                                 sampling=SamplingOptions(shuffle_buffer=shuffle)),
                             sync=SyncOptions(world_size=world, rank=rank))
        assert reader.steps_per_epoch == 10 and reader.dropped_per_epoch == 20
        for epoch in (0, 1):
            batches = list(reader())
            assert len(batches) == 10 and {len(b["_id"]) for b in batches} == {batch}
            assert reader.epoch == epoch
            seen[epoch].update(i for b in batches for i in b["_id"].tolist())
        reader.close()
    for counter in seen.values():
        assert len(counter) == 480 and max(counter.values()) == 1
    assert set(seen[0]) != set(seen[1])  # each epoch drops other records (its own order)


def test_a_local_rank_resumes_mid_epoch_with_the_rest_of_its_share(storage: str) -> None:
    options: dict[str, Any] = {
        "source": LocalSource(storage=storage), "sync": SyncOptions(world_size=2, rank=1),
        "pipeline": PipelineOptions(batch=BatchOptions(size=16),
                                    sampling=SamplingOptions(shuffle_buffer=32))}
    reader = dist.reader("rows", **options)
    steps = reader.steps_per_epoch
    whole = [i for b in reader() for i in b["_id"].tolist()]
    reader.close()
    first = dist.reader("rows", **options)
    batches = iter(first())
    got = [i for _ in range(5) for i in next(batches)["_id"].tolist()]
    state = first.state_dict()
    first.close()
    again = dist.reader("rows", state=state, **options)
    rest = [i for b in again() for i in b["_id"].tolist()]
    assert len(got) + len(rest) == steps * 16
    assert sorted(got + rest) == sorted(whole)


@pytest.mark.parametrize("options,match", [
    ({}, "batch_size"),
    ({"batch_size": 8, "resample": "uniform"}, "cannot resample"),
    ({"batch_size": 8, "decode": True, "decode_errors": "skip"}, "decode_errors"),
])
def test_a_synchronous_reader_refuses_what_would_change_a_ranks_count(
        storage: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dist.reader("rows", source=LocalSource(storage=storage),
                    pipeline=PipelineOptions.from_keywords(**options), sync=SyncOptions())


def test_world_size_needs_sync(storage: str) -> None:
    """The deprecated keywords (the grouped spelling cannot say it): refused before warning."""
    with pytest.raises(ValueError, match="sync=True"):
        dist.reader("rows", local=True, storage=storage, world_size=2, rank=0, batch_size=4)


def test_other_batch_sizes_are_refused_on_a_synchronous_reader(storage: str) -> None:
    reader = dist.reader("rows", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=8)), sync=SyncOptions())
    with pytest.raises(ValueError, match="synchronous with batch_size 8"):
        next(iter(reader.column_batches(16)))
    reader.close()


def test_adapters_know_a_synchronous_epoch_s_length(storage: str) -> None:
    torch = require("torch")
    reader = dist.reader("rows", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=10)),
                         sync=SyncOptions(world_size=2, rank=0))
    data = reader.as_torch()
    assert len(data) == 25 == reader.steps_per_epoch
    assert sum(1 for _ in torch.utils.data.DataLoader(data, batch_size=None)) == 25
    plain = dist.reader("rows", source=LocalSource(storage=storage),
                        pipeline=PipelineOptions(batch=BatchOptions(size=10)))
    with pytest.raises(TypeError, match="has no length"):
        len(plain.as_torch())


def test_keras_gets_a_dataset_of_known_cardinality(storage: str) -> None:
    tf = require("tensorflow")
    reader = dist.reader("rows", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(batch=BatchOptions(size=10)),
                         sync=SyncOptions(world_size=2, rank=1))
    dataset = reader.as_tf_dataset(inputs="text0", targets=())
    assert int(dataset.cardinality()) == 25
    assert sum(1 for _ in dataset) == 25
    plain = dist.reader("rows", source=LocalSource(storage=storage),
                        pipeline=PipelineOptions(batch=BatchOptions(size=10)))
    unknown = plain.as_tf_dataset(inputs="text0", targets=())
    assert int(unknown.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)


def test_a_state_saved_at_an_epoch_boundary_resumes_the_next_epoch(
        storage: str, tmp_path: Path) -> None:
    options: dict[str, Any] = {"source": LocalSource(storage=storage),
                               "sync": SyncOptions(world_size=1, rank=0),
                               "pipeline": PipelineOptions(batch=BatchOptions(size=25))}
    reader = dist.reader("rows", **options)
    list(reader())
    state = reader.state_dict()
    second = [i for b in reader() for i in b["_id"].tolist()]
    restored = dist.reader("rows", state=state, **options)
    assert [i for b in restored() for i in b["_id"].tolist()] == second
    assert restored.epoch == 1
