"""A pass cut short, then a full one (issue 13): local and master-fed readers agree, and the two
passes together hand out every record of the epoch exactly once. A record counts as delivered
once the trainer was handed it (the last one of a `break` included)."""
from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from trainfeed import LocalSource, MasterSource, PipelineOptions, dist
from trainfeed.master.serve.process import MasterProcess


@pytest.fixture
def master(storage: str) -> Iterator[MasterProcess]:
    with MasterProcess(storage) as process:
        yield process


def make(where: str, storage: str, request: pytest.FixtureRequest, **options: Any) -> Any:
    pipeline = PipelineOptions.from_keywords(**options)
    if where == "local":
        return dist.reader("flowers", source=LocalSource(storage=storage), pipeline=pipeline)
    master = request.getfixturevalue("master")
    return dist.reader("flowers", source=MasterSource(
        master.address, job=f"cut-{uuid.uuid4().hex[:8]}"), pipeline=pipeline)


@pytest.mark.parametrize("where", ["local", pytest.param("master", marks=pytest.mark.integration)])
@pytest.mark.parametrize("cut", [1, 37, 64, 65, 99])
def test_islice_then_a_full_pass_reads_every_record_once(
        where: str, cut: int, storage: str, request: pytest.FixtureRequest) -> None:
    reader = make(where, storage, request, batch_size=1)
    first = [int(b["_id"][0]) for b in itertools.islice(reader(), cut)]
    rest = [int(b["_id"][0]) for b in reader()]
    assert len(first) == cut and reader.epoch == 0
    assert sorted(first + rest) == list(range(100)), (len(first), len(rest))
    reader.close()


@pytest.mark.parametrize("where", ["local", pytest.param("master", marks=pytest.mark.integration)])
def test_a_break_after_the_100th_tuple_then_a_full_pass(where: str, storage: str,
                                                         request: pytest.FixtureRequest) -> None:
    """Tuples (no id): counted by content; the record the loop broke on was used."""
    reader = make(where, storage, request)
    seen: list[bytes] = []
    for image, _label in reader():
        seen.append(image)
        if len(seen) == 55:
            break
    seen += [image for image, _ in reader()]
    everything = [image for image, _ in make("local", storage, request)()]
    assert sorted(seen) == sorted(everything)
    reader.close()
