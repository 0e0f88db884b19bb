"""Decompression bombs (issue 25 §3): a reader given any of them finishes its pass with
decode_errors="skip", delivers every other record, counts the bomb as a decode failure named by
its file and list line, and stays under 1 GB of RSS, measured on a reader process of its own; and
starts no native pool thread that could abort the interpreter's exit."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bomb_images import jpeg_bomb, zero_png
from peak_rss import run_measured
from sample_data import make_image_list

from trainfeed.upload import upload

PASS_SCRIPT = str(Path(__file__).with_name("bomb_pass.py"))
RECORDS = 64
BOMB = 40  # the record whose file is replaced by the bomb
MEMORY_LIMIT_MB = 1024

# The table, row by row: the file and the decode path the reader took.
ROWS: dict[str, tuple[str, Callable[[], bytes], str]] = {
    # 630 bytes declaring 28,000x30,000: libjpeg pads the missing data, 2.4 GB touched.
    "truncated jpeg of 28000x30000": ("jpg", lambda: jpeg_bomb(28000, 30000, 3, data_bytes=480),
                                      "plain"),
    # 389 KB: Pillow's DecompressionBombError escaped decode_errors="skip".
    "zero png of 20000x20000": ("png", lambda: zero_png(20000, 20000), "plain"),
    "png of 12000x12000": ("png", lambda: zero_png(12000, 12000), "plain"),
    # A valid file of 1 MiB: 805 MB of pixels.
    "valid jpeg of 16384x16384": ("jpg", lambda: jpeg_bomb(16384, 16384), "plain"),
    # Progressive (one DC scan): the region decoder holds every coefficient, 1.6 GB, for a crop.
    "progressive jpeg of 16384x16384": ("jpg", lambda: jpeg_bomb(16384, 16384, 3,
                                                                 progressive=True), "crops"),
}


def dataset_with_bomb(folder: Path, storage: str, suffix: str, bomb: bytes) -> str:
    """Uploads 64 small JPEGs with record BOMB's file replaced by `bomb`; returns its path as
    the list names it."""
    listing = make_image_list(folder, RECORDS)
    rel = f"images/{BOMB:05d}.{suffix}"
    (folder / f"images/{BOMB:05d}.jpg").unlink()
    (folder / rel).write_bytes(bomb)
    listing.write_text(listing.read_text().replace(f"images/{BOMB:05d}.jpg", rel))
    upload(str(listing), "bombs", storage, progress=False)
    return rel


@pytest.mark.parametrize("row", list(ROWS))
def test_a_bomb_is_skipped_counted_and_named_within_1_gb(row: str, tmp_path: Path) -> None:
    suffix, make, path = ROWS[row]
    storage = str(tmp_path / "storage")
    rel = dataset_with_bomb(tmp_path / "source", storage, suffix, make())
    run = run_measured([sys.executable, PASS_SCRIPT, storage, "bombs", path])
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    print(f"{row} ({path}): peak RSS {run.peak_mb:.0f} MB, {len(result['ids'])} delivered, "
          f"{result['failures']} failure(s), error {result['error']}")
    assert result["error"] is None
    assert sorted(result["ids"]) == [i for i in range(RECORDS) if i != BOMB]
    assert result["failures"] == 1
    assert f"record {BOMB} ({rel}, train_data.list line {BOMB + 1})" in run.stderr
    assert "pixel budget" in run.stderr and "TRAINFEED_MAX_IMAGE_PIXELS" in run.stderr
    assert "BytesIO" not in run.stderr
    assert run.peak_mb < MEMORY_LIMIT_MB
    # Naming the bomb's file reads the dataset's sources table: with one thread, so that no
    # Arrow pool thread outlives the pass (the exit abort CI met, 1 run in ~200 under load).
    assert result["native_threads_started"] == 0
