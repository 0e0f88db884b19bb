"""A pass loads partitions on two threads (trainfeed.io.loads) and delivers exactly what one
thread would: every record once, in the same order, the same shuffle and the same crops."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import trainfeed.io.loads as loads_module
import trainfeed.reader.pipeline as pipeline_module
import trainfeed.reader.reader as reader_module
from trainfeed import LocalSource, PipelineOptions, dist

RECORDS = 100  # the "flowers" dataset of the `storage` fixture: 13 partitions of ≤ 8 records


def with_load_threads(monkeypatch: pytest.MonkeyPatch, threads: int) -> set[str]:
    """Passes from now on load on `threads` threads; returns the names of the threads that
    loaded, as they load."""
    monkeypatch.setattr(reader_module, "load_threads", lambda: threads)
    monkeypatch.setattr(pipeline_module, "load_threads", lambda: threads)
    loaded_on: set[str] = set()
    one = loads_module.Loads._one

    def counted(self: loads_module.Loads, task: Any) -> Any:
        loaded_on.add(threading.current_thread().name)
        return one(self, task)
    monkeypatch.setattr(loads_module.Loads, "_one", counted)
    return loaded_on


def shuffled_passes(storage: str) -> list[tuple[list[int], bytes]]:
    """Two shuffled, decoded, randomly cropped passes: each one's ids and pixels' digest."""
    reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                         pipeline=PipelineOptions.from_keywords(
                             decode=True, image_size=(32, 32), batch_size=16,
                             shuffle_buffer=40, random_resized_crop=((0.3, 1.0), (0.75, 1.33)),
                             random_flip=True))
    out = []
    for _ in range(2):
        ids, pixels = [], []
        for batch in reader():
            ids.extend(batch["_id"].tolist())
            pixels.append(np.ascontiguousarray(batch["image"]).tobytes())
        out.append((ids, b"".join(pixels)))
    reader.close()
    return out


def test_two_load_threads_deliver_what_one_does(storage: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    on_one = with_load_threads(monkeypatch, 1)
    one = shuffled_passes(storage)
    assert len(on_one) == 1 and not any(name.endswith("-load_0") for name in on_one)
    on_two = with_load_threads(monkeypatch, 2)
    two = shuffled_passes(storage)
    assert len({n for n in on_two if "-load_" in n}) == 2  # both threads loaded partitions
    for (ids_one, pixels_one), (ids_two, pixels_two) in zip(one, two):
        assert sorted(ids_two) == list(range(RECORDS))  # every record once
        assert ids_two == ids_one  # the same order, so the same shuffle
        assert pixels_two == pixels_one  # and the same crops
    assert one[0][0] != one[1][0]  # (each epoch is shuffled anew)


def test_raw_reads_on_two_threads_count_every_payload_byte(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with_load_threads(monkeypatch, 1)
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    one = [(bytes(image), label) for image, label in reader()]
    bytes_one = reader.payload_bytes_read
    with_load_threads(monkeypatch, 2)
    reader = dist.reader("flowers", source=LocalSource(storage=storage))
    two = [(bytes(image), label) for image, label in reader()]
    assert two == one
    assert reader.payload_bytes_read == bytes_one == sum(len(image) for image, _ in one)
