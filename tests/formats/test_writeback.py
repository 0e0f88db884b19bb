"""A shard written to a file has each row group's disk writes started as soon as the group is
written (trainfeed.formats.writeback, Linux sync_file_range), so that the fsync that ends the
shard waits for little (issue 30 §2: ~0.17 -> 0.02 s per 6 shards); the bytes do not change."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from trainfeed.formats import shards as shard_format
from trainfeed.formats import writeback
from trainfeed.formats.manifest import FieldSpec
from trainfeed.formats.shards import RowGroupBuffer

FIELDS = (FieldSpec("image", "binary"), FieldSpec("label", "string"))


def groups() -> list[RowGroupBuffer]:
    out = []
    for g in range(3):
        group = RowGroupBuffer.empty(2)
        for i in range(4):
            group.add(g * 4 + i, [os.urandom(1000 + i), str(i % 2)], 1001 + i)
        out.append(group)
    return out


def test_each_row_group_of_a_file_has_its_writes_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(shard_format, "start_writeback",
                        lambda fd, offset, length: started.append((offset, length)))
    written = groups()
    encoder = shard_format.ShardEncoder(shard_format.arrow_schema(FIELDS), str(tmp_path / "s"))
    for group in written:
        encoder.add(group)
    _, sha, infos, _ = encoder.finish()
    data = (tmp_path / "s").read_bytes()
    assert sha == hashlib.sha256(data).hexdigest() and len(infos) == len(written)
    assert len(started) == len(written)
    # Consecutive, each after the last: the row groups' bytes, before the footer.
    for (offset, length), (following, _) in zip(started, started[1:]):
        assert length > 0 and offset + length == following
    assert started[0][0] == 4 and sum(n for _, n in started) < len(data)  # after "PAR1"


def test_an_encoder_in_memory_starts_no_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(shard_format, "start_writeback", lambda *args: started.append(1))
    encoder = shard_format.ShardEncoder(shard_format.arrow_schema(FIELDS))
    for group in groups():
        encoder.add(group)
    encoder.finish()
    assert started == []


def test_starting_writes_of_a_real_file_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        writeback.start_writeback(f.fileno(), 0, 100_000)
        writeback.start_writeback(f.fileno(), 0, 0)
        os.fsync(f.fileno())
    assert path.read_bytes() == b"x" * 100_000
    if os.uname().sysname == "Linux":
        assert writeback._CALL is not None  # glibc has it: the hint is given
