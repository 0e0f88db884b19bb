"""The local reader (TRAIN_LOCAL), batching, and the acknowledgement contract."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from sample_data import file_digests

from trainfeed import LocalSource, batch, dist


def test_train_local_env_switches_to_reading_storage(storage: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAIN_LOCAL", "1")
    monkeypatch.setenv("TRAINFEED_STORAGE", storage)
    monkeypatch.delenv("TRAINFEED_MASTER", raising=False)
    assert dist.train_local()
    reader = dist.reader("flowers")
    assert sum(1 for _ in reader()) == 100
    for off in ("", "0"):
        monkeypatch.setenv("TRAIN_LOCAL", off)
        assert not dist.train_local()


def test_each_pass_is_a_permutation_of_the_dataset(storage: str, image_list: Path) -> None:
    digests = file_digests(image_list)
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    assert reader.field_names == ("image", "label")
    passes = []
    for _ in range(2):
        got = Counter((hashlib.sha256(img).hexdigest(), label) for img, label in reader())
        assert got == Counter(digests.values())
        passes.append([b["_id"].tolist() for b in reader.column_batches()])
    assert reader.epoch == 3
    # Partition order is reshuffled per epoch, reproducibly for a seed.
    assert passes[0] != passes[1]
    again = dist.reader("flowers", source=LocalSource(storage=storage))
    list(again())
    assert [b["_id"].tolist() for b in again.column_batches()] == passes[0]


def test_batch_sizes_and_drop_last(storage: str) -> None:
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    assert [len(b) for b in batch(reader, 32)()] == [32, 32, 32, 4]
    assert [len(b) for b in batch(reader, 32, drop_last=True)()] == [32, 32, 32]
    columns = list(batch(reader, 30, columnar=True)())
    assert [len(b["label"]) for b in columns] == [30, 30, 30, 10]
    assert sorted(i for b in columns for i in b["_id"].tolist()) == list(range(100))
    assert all(isinstance(b["image"][0], bytes) for b in columns)
    # A batch larger than everything prefetched (4 partitions of ≤ 8 rows) still fills.
    assert [len(b["label"]) for b in batch(reader, 1000, columnar=True)()] == [100]


def test_batch_works_on_any_reader_creator() -> None:
    assert list(batch(lambda: iter(range(5)), 2)()) == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="columnar=True needs a trainfeed Reader"):
        batch(lambda: iter(range(5)), 2, columnar=True)
    with pytest.raises(ValueError, match="positive int"):
        batch(lambda: iter(()), 0)


def test_a_closed_reader_refuses_new_passes(storage: str) -> None:
    with dist.reader("flowers", source=LocalSource(storage=storage)) as reader:
        next(reader())
    reader.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        reader()


def test_a_cluster_reader_without_master_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINFEED_MASTER", raising=False)
    monkeypatch.delenv("TRAIN_LOCAL", raising=False)
    reader = dist.reader("flowers")
    with pytest.raises(ConnectionError, match=r"\$TRAINFEED_MASTER is not set.*TRAIN_LOCAL=1"):
        reader()
