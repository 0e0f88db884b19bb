"""A small dataset read locally through slices of its row groups (issue 13, point 3): the
2,000-record case of the issue gets 64 partitions, and every pass delivers every record exactly
once, raw, batched, decoded, shuffled, and across a checkpoint taken mid-pass."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from sample_data import make_image_list

from trainfeed import BatchOptions, LocalSource, PipelineOptions, SamplingOptions, batch, dist
from trainfeed.formats.manifest import read_manifest
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS, plan_partitions
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

N = 2000  # the issue's count; in 8 row groups of 250, as 8 MiB groups of 320x240 JPEGs were


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("small")
    source = make_image_list(root / "source", N, size=8)
    out = str(root / "storage")
    upload(str(source), "flowers", out, UploadOptions(row_group_rows=250), progress=False)
    return out


def test_the_issue_s_2000_records_get_at_least_64_partitions(storage: str) -> None:
    manifest = read_manifest(open_storage(storage), "flowers")
    assert manifest.num_row_groups == 8  # before: 8 partitions, one per row group
    parts = plan_partitions(manifest)
    assert len(parts) >= DEFAULT_TARGET_PARTITIONS == 64
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    assert len(reader._backend.partitions) == len(parts)  # type: ignore[attr-defined]
    reader.close()


def ids_of_pass(batches: list[dict[str, np.ndarray]]) -> Counter[int]:
    return Counter(int(i) for b in batches for i in b["_id"].tolist())


@pytest.mark.parametrize("options", [
    {},
    {"shuffle_buffer": 300},
    {"decode": True, "image_size": (4, 4)},
    {"decode": True, "image_size": (4, 4), "shuffle_buffer": 300},
], ids=["plain", "shuffle-buffer", "decode", "decode-shuffle-buffer"])
def test_every_record_exactly_once_per_pass(storage: str, options: dict[str, object]) -> None:
    with dist.reader("flowers", source=LocalSource(storage=storage),
                     pipeline=PipelineOptions.from_keywords(batch_size=64, **options)) as reader:
        for _ in range(2):
            assert ids_of_pass(list(reader())) == Counter(range(N))


def test_raw_tuples_and_columnar_batches_cover_the_dataset(storage: str) -> None:
    with dist.reader("flowers", source=LocalSource(storage=storage)) as reader:
        assert sum(1 for _ in reader()) == N
        columns = list(batch(reader, 100, columnar=True)())
        assert Counter(i for b in columns for i in b["_id"].tolist()) == Counter(range(N))


def test_a_checkpoint_mid_pass_resumes_with_exactly_the_rest(storage: str) -> None:
    """Positions inside slices (records handed of a partition) survive a restore: the records
    before the checkpoint and those after it make the epoch, with none twice."""
    with dist.reader("flowers", source=LocalSource(storage=storage),
                     pipeline=PipelineOptions(
                         batch=BatchOptions(size=48),
                         sampling=SamplingOptions(shuffle_buffer=100))) as reader:
        stream = iter(reader())
        before = list(itertools.islice(stream, 13))  # mid-partition: 48 is no slice's multiple
        state = reader.state_dict()
    assert state["positions"]  # some slice was in the trainer's hands
    with dist.reader("flowers", source=LocalSource(storage=storage),
                     pipeline=PipelineOptions(batch=BatchOptions(size=48),
                                              sampling=SamplingOptions(shuffle_buffer=100)),
                     state=state) as restored:  # type: ignore[arg-type]
        after = list(restored())
    assert ids_of_pass(before) + ids_of_pass(after) == Counter(range(N))


def test_slices_and_whole_row_groups_mix_in_one_batch(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Row groups of 20, 20 and 10 records: the first two are cut in two, the last stays whole
    (fewer than 2 x 8 records); batches straddle both kinds, whose columns must agree."""
    root = tmp_path_factory.mktemp("mixed")
    out = str(root / "storage")
    upload(str(make_image_list(root / "source", 50, size=8)), "mixed", out,
           UploadOptions(row_group_rows=20), progress=False)
    parts = plan_partitions(read_manifest(open_storage(out), "mixed"))
    assert [(p.row_group_start, p.row_start, p.num_records) for p in parts] == [
        (0, 0, 10), (0, 10, 10), (1, 0, 10), (1, 10, 10), (2, 0, 10)]
    with dist.reader("mixed", source=LocalSource(storage=out),
                     pipeline=PipelineOptions(batch=BatchOptions(size=7))) as reader:
        assert ids_of_pass(list(reader())) == Counter(range(50))


def test_a_state_saved_before_slices_resumes_in_its_own_plan(storage: str) -> None:
    """A local reader's state written before row groups were sliced names whole row groups
    (then partitions 0..7 of 250 records): restored, it skips exactly what it says it had."""
    with dist.reader("flowers", source=LocalSource(storage=storage)) as reader:
        next(iter(reader.column_batches()))
        state = reader.state_dict()
    assert state["partitions"] == 64
    old = {**state, "done": [0, 1], "positions": [[2, 10]]}  # row groups 0, 1; 10 of group 2
    del old["partitions"]  # as written before states said their plan
    with dist.reader("flowers", source=LocalSource(storage=storage), state=old) as restored:
        rest = Counter(i for b in restored.column_batches() for i in b["_id"].tolist())
        assert restored.state_dict()["partitions"] == 8  # it keeps counting in that plan
    assert rest == Counter(range(510, N))


def test_a_state_of_an_unknown_plan_is_refused(storage: str) -> None:
    with dist.reader("flowers", source=LocalSource(storage=storage)) as reader:
        next(iter(reader()))
        state = {**reader.state_dict(), "partitions": 9}
    with pytest.raises(ValueError, match="reader state counts in a plan of 9 partitions, but "
                                         "dataset 'flowers' cuts into 64: was it re-uploaded?"):
        dist.reader("flowers", source=LocalSource(storage=storage), state=state).output_spec()
