"""A packing thread keeps its two row-group buffers from shard to shard (trainfeed.ingest.pack
.SCRATCH) and reads each finished shard back into the first (issue 30 §2: a fresh bytearray per
shard was fresh pages, most of an upload's 65,000 page faults for 10,000 photos). What a shard
leaves in them never reaches the next one's bytes; another thread has its own; an upload in the
caller's process gives them back when it ends."""
from __future__ import annotations

import threading
from pathlib import Path

from upload_samples import photo_list

from trainfeed.ingest.inputs import layout_of, read_inputs
from trainfeed.ingest.pack import SCRATCH, PackTask, Scratch, pack_shard, pack_tasks
from trainfeed.ingest.plan import plan_shards
from trainfeed.ingest.pool import Packers
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions

# Shards of a few row groups of different sizes: a later shard's groups are smaller than what
# an earlier one left in the buffers.
OPTIONS = UploadOptions(row_group_rows=5, row_group_bytes=40_000, shard_row_groups=3,
                        read_threads=3, processes=1)


def shard_tasks(listing: Path, storage: Path) -> list[PackTask]:
    inputs = read_inputs(str(listing), OPTIONS)
    plans = plan_shards(inputs.sizes, layout_of(OPTIONS))
    return pack_tasks(inputs, OPTIONS, open_storage(str(storage)), plans, 1)


def shard_bytes(storage: Path, tasks: list[PackTask]) -> list[bytes]:
    return [(storage / t.shard_path).read_bytes() for t in tasks]


def test_shards_packed_one_after_another_reuse_the_buffers_and_equal_fresh_ones(
        tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "photos", 40)
    SCRATCH.release()
    reused = shard_tasks(listing, tmp_path / "reused")
    assert len(reused) >= 3
    held = []
    for task in reused:
        pack_shard(task)
        held.append(list(SCRATCH.buffers))
    # A buffer is made again only to grow (a larger row group, or a shard read back into it).
    for before, after in zip(held, held[1:]):
        assert all(new is old or len(new) > len(old) for old, new in zip(before, after))
    for task in reused:  # large enough for every shard now: packed again in the same buffers
        pack_shard(task)
        assert all(now is then for now, then in zip(SCRATCH.buffers, held[-1]))
    fresh = shard_tasks(listing, tmp_path / "fresh")
    for task in reversed(fresh):  # each in buffers of its own, in another order
        SCRATCH.release()
        pack_shard(task)
    SCRATCH.release()
    assert shard_bytes(tmp_path / "reused", reused) == shard_bytes(tmp_path / "fresh", fresh)


def test_a_buffer_grows_when_a_larger_one_is_asked_and_threads_have_their_own() -> None:
    scratch = Scratch()
    small = scratch.buffer(1, 10)
    assert scratch.buffer(1, 8) is small and len(scratch.buffer(1, 100)) == 112
    grown = scratch.buffer(1, 101)
    assert scratch.buffer(1, 112) is grown  # the eighth more: no new pages for a little more
    seen: list[list[bytearray]] = []
    thread = threading.Thread(target=lambda: seen.append(list(scratch.buffers)))
    thread.start()
    thread.join()
    assert [len(b) for b in seen[0]] == [0, 0]  # the other thread's, not this one's
    scratch.release()
    assert [len(b) for b in scratch.buffers] == [0, 0]


def test_an_upload_in_this_process_gives_the_buffers_back(tmp_path: Path) -> None:
    tasks = shard_tasks(photo_list(tmp_path / "photos", 12), tmp_path / "out")
    with Packers(tasks, 1) as packers:
        assert len(list(packers.results())) == len(tasks)
        assert any(len(b) for b in SCRATCH.buffers)
    assert [len(b) for b in SCRATCH.buffers] == [0, 0]
