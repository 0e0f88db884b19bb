"""`upload --check-images` on a real photo set (issue 26 §1): images of any size are each decoded
on their own, in parallel and within a memory budget; every undecodable file (a non-image, a
decompression bomb, a truncated JPEG) is listed with its list line and the upload is refused.
Once, images of different sizes failed as a batch that could not be stacked, and the PNG bomb
crashed the upload with a traceback (issue 25 §3)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from bomb_images import zero_png
from peak_rss import run_measured
from PIL import Image

from trainfeed.formats.manifest import list_datasets
from trainfeed.storage import open_storage

MEMORY_LIMIT_MB = 1024


def photo_set(folder: Path, count: int = 30) -> Path:
    """`count` JPEGs and PNGs of varied sizes (61x65 to 500x712, as a user's photos) in class
    folders, and the list naming them."""
    rng = np.random.default_rng(7)
    lines = []
    for i in range(count):
        height, width = int(rng.integers(61, 713)), int(rng.integers(65, 501))
        label = ("daisy", "rose", "tulip")[i % 3]
        rel = f"{label}/{i:03d}.{'png' if i % 5 == 0 else 'jpg'}"
        (folder / label).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / rel)
        lines.append(f"{rel}\t{label}\n")
    listing = folder / "photos.list"
    listing.write_text("".join(lines))
    return listing


def upload_cli(listing: Path, storage: str, *extra: str):  # type: ignore[no-untyped-def]
    return run_measured([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                         "--dataset", "photos", "--storage", storage, "--check-images",
                         "--no-progress", *extra])


def test_photos_of_varied_sizes_are_checked_and_published(tmp_path: Path) -> None:
    listing = photo_set(tmp_path / "photos")
    storage = str(tmp_path / "storage")
    run = upload_cli(listing, storage)
    assert run.returncode == 0, run.stderr
    assert "published 'photos': 30 records" in run.stdout


def test_every_bad_file_is_named_with_its_line_and_nothing_is_published(
        tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    listing = photo_set(folder)
    (folder / "notes.jpg").write_text("these are my notes, not a photo\n")
    (folder / "bomb.png").write_bytes(zero_png(20000, 20000))  # 389 KB, 400 MB of pixels
    good = (folder / "rose/001.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(good[:len(good) // 3])  # truncated
    lines = listing.read_text().splitlines(keepends=True)
    lines[4:4] = ["notes.jpg\tdaisy\n"]  # line 5
    lines[17:17] = ["bomb.png\trose\n"]  # line 18
    lines.append("cut.jpg\ttulip\n")  # line 33
    listing.write_text("".join(lines))
    storage = str(tmp_path / "storage")

    run = upload_cli(listing, storage)
    print(f"--check-images with a bomb: peak RSS {run.peak_mb:.0f} MB")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert "3 file(s) named in" in run.stderr and "nothing was published" in run.stderr
    named = sorted(line.split(": ", 1)[0].rsplit(":", 1)[1]
                   for line in run.stderr.splitlines() if line.startswith(f"  {listing}:"))
    assert named == ["18", "33", "5"], run.stderr
    assert f"{listing}:5: {folder / 'notes.jpg'}: not an image format" in run.stderr
    assert f"{listing}:18: {folder / 'bomb.png'}: it declares 20,000x20,000 pixels" in run.stderr
    assert f"{listing}:33: {folder / 'cut.jpg'}: " in run.stderr
    assert "BytesIO" not in run.stderr and "different shapes" not in run.stderr
    assert "photos" not in list_datasets(open_storage(storage))
    assert run.peak_mb < MEMORY_LIMIT_MB
