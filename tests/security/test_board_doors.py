"""Issue 35: the uploads board is a folder any storage writer can drop files into, and the
master's page reads it every few seconds. A FIFO there must not hang that read, a huge file must
not be loaded, and a flood of records is read only up to a bound; the packers' own records still
show."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from board_records import record

from trainfeed.ingest import board
from trainfeed.ingest.board import Board, record_path
from trainfeed.ingest.board_summary import summarize
from trainfeed.storage import open_storage

# A look at the board that has not returned after this long is waiting on something it opened.
LOOK_LIMIT_S = 60.0


def look(folder: Path) -> list[dict[str, Any]]:
    """Board(...).records() in a thread; fails if it does not come back within LOOK_LIMIT_S."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(Board(open_storage(str(folder)))
                                                       .records()), daemon=True)
    thread.start()
    thread.join(LOOK_LIMIT_S)
    assert got, f"the board's look did not return within {LOOK_LIMIT_S:.0f} s"
    return list(got[0])


def write(folder: Path, rel: str, data: bytes) -> Path:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_fifo_and_a_huge_file_on_the_board_are_left_unread(tmp_path: Path) -> None:
    honest = record(1)
    write(tmp_path, record_path("public/photos", "f" * 16, 1), json.dumps(honest).encode())
    fifo = tmp_path / record_path("public/photos", "e" * 16, 2)
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    huge = {**record(3), "host": "x" * (board.MAX_RECORD_BYTES * 4)}
    write(tmp_path, record_path("public/photos", "d" * 16, 3), json.dumps(huge).encode())
    try:
        records = look(tmp_path)
    finally:  # release a reader blocked on the FIFO (the old code's hang), so the test ends
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)
    assert records == [honest]


def test_a_flood_of_records_is_read_only_up_to_the_bound(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    monkeypatch.setattr(board, "MAX_RECORDS", 20)
    for i in range(50):
        write(tmp_path, record_path("public/photos", f"{i:016x}", 1),
              json.dumps(record(1)).encode())
    assert len(look(tmp_path)) == 20


def test_records_of_another_shape_are_left_out_and_the_summary_still_shows(
        tmp_path: Path) -> None:
    """A text `index` beside numbered slices, a count that is text or a list, a NaN time, an
    unknown state: each broke the summary of every upload (a TypeError in sorting or summing,
    and the page showed an error instead of the uploads). They are left unread now."""
    honest = [record(0, "done", 100), record(1, "running", 50)]
    for i, r in enumerate(honest):
        write(tmp_path, record_path("public/photos", "f" * 16, i), json.dumps(r).encode())
    odd = [{**record(2), "index": "two"}, {**record(3), "records_done": "lots"},
           {**record(4), "records_total": [1, 2]}, {**record(5), "updated_at": float("nan")},
           {**record(6), "state": "hacked"}, {**record(7), "slices": True},
           {**record(8), "host": {"x": 1}}, {**record(9), "reason": 5}]
    for i, r in enumerate(odd, start=2):
        write(tmp_path, record_path("public/photos", "f" * 16, i), json.dumps(r).encode())
    records = look(tmp_path)
    assert sorted(records, key=lambda r: r["index"]) == honest
    [upload] = summarize(records, now=1001.0)
    assert upload["records_done"] == 150
