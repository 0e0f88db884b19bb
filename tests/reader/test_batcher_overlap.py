"""Two pieces converted at once (the decode pipeline, trainfeed.reader.batcher._overlapped):
results come in order, errors surface, and a piece is never held back while the input waits for
more (a distributed pass's partial batch must reach the trainer before the master hands out
more partitions: holding it back hung the first version of this)."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist
from trainfeed.reader.batcher import _overlapped
from trainfeed.upload import upload


@dataclass
class FakePiece:
    index: int
    shows: bool = True


def slow_square(piece: FakePiece) -> int:
    time.sleep(random.random() * 0.01)
    return piece.index ** 2


def test_results_come_in_order_with_hidden_pieces_passed_through() -> None:
    pieces = [FakePiece(i, shows=i % 5 != 0) for i in range(60)]
    got = list(_overlapped(iter(pieces), slow_square, 2))
    assert [p.index for _, p in got] == list(range(60))
    assert [v for v, _ in got] == [None if i % 5 == 0 else i * i for i in range(60)]


def test_a_piece_is_yielded_while_the_input_waits_for_more() -> None:
    delivered = threading.Event()

    def pieces() -> Iterator[FakePiece]:
        yield FakePiece(1)
        # The next partition comes only once the trainer had the first piece (as the master
        # hands out more only when a partial batch's partitions were acknowledged).
        assert delivered.wait(5), "the first piece was held back"
        yield FakePiece(2)

    out = _overlapped(pieces(), slow_square, 2)
    value, piece = next(out)
    assert (value, piece.index) == (1, 1)
    delivered.set()
    assert [v for v, _ in out] == [4]


def test_errors_of_convert_and_of_the_input_reach_the_consumer() -> None:
    def convert(piece: FakePiece) -> int:
        if piece.index == 3:
            raise ValueError("record 3 cannot be decoded")
        return piece.index

    out = _overlapped(iter([FakePiece(i) for i in range(10)]), convert, 2)
    assert [next(out)[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="record 3"):
        next(out)

    def broken() -> Iterator[FakePiece]:
        yield FakePiece(0)
        raise OSError("shard unreadable")

    out = _overlapped(broken(), slow_square, 2)
    assert next(out)[0] == 0
    with pytest.raises(OSError, match="shard unreadable"):
        next(out)


def test_closing_early_stops_the_cutting_thread() -> None:
    produced: list[int] = []

    def endless() -> Iterator[FakePiece]:
        i = 0
        while True:
            produced.append(i)
            yield FakePiece(i)
            i += 1

    before = {t.name for t in threading.enumerate()}
    out = _overlapped(endless(), slow_square, 2)
    assert [next(out)[0] for _ in range(4)] == [0, 1, 4, 9]
    out.close()
    deadline = time.monotonic() + 5
    while any(t.name == "trainfeed-cut" and t.is_alive() for t in threading.enumerate()
              if t.name not in before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "trainfeed-cut" for t in threading.enumerate()
                   if t.name not in before)
    assert len(produced) <= 4 + 2 + 2  # read ahead by at most the queue and the converters


@pytest.fixture
def one_row_group_storage(image_list: Path, storage_dir: str) -> str:
    """"flowers": `image_list` in one row group (the default size), sliced into partitions."""
    upload(str(image_list), "flowers", storage_dir, progress=False)
    return storage_dir


@pytest.mark.parametrize(("threads", "overlapped"), [(1, False), (2, True)])
def test_one_decode_thread_means_one_batch_decoding_at_a_time(one_row_group_storage: str,
                                                              threads: int,
                                                              overlapped: bool) -> None:
    """With a single decode thread the decoder runs on the converting thread: two converters
    would decode two batches at once against decode_threads=1 (what LOCAL_WORLD_SIZE asks of
    each rank). Seen by the pipeline's named converter threads during a whole pass."""
    reader = dist.reader("flowers", source=LocalSource(storage=one_row_group_storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(16, 16),
                                                                       threads=threads),
                                                  batch=BatchOptions(size=10)))
    seen = set()
    for _ in reader():
        seen |= {t.name for t in threading.enumerate() if t.name.startswith("trainfeed-convert")}
    assert bool(seen) == overlapped, seen
    reader.close()
