"""`upload --jpeg-restarts` keeps within the memory the docs state (issue 25 §3): rewrites
reserve the DCT coefficients their headers announce from one budget, so large files wait for
room instead of being rewritten on every reading thread at once. Once, eight 1 MB 16,384² JPEGs
took 4,233 MB of RSS against the README's "about 230 MiB plus two records"."""
from __future__ import annotations

import sys
from pathlib import Path

from bomb_images import jpeg_bomb
from peak_rss import run_measured

from trainfeed import LocalSource, PipelineOptions
from trainfeed.decode import roi
from trainfeed.decode.pixel_budget import jpeg_frame
from trainfeed.upload import DECODE_MEMORY_BYTES

#: Where the bound is stated ("How each stage works", Upload); it was in the README.
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def large_jpegs(folder: Path, count: int = 8) -> Path:
    """`count` valid 8,000² colour JPEGs (4:2:0, 375 KB each, 184 MiB of coefficients)."""
    (folder / "images").mkdir(parents=True)
    data = jpeg_bomb(8000, 8000, 3, subsampled=True)
    lines = []
    for i in range(count):
        (folder / f"images/{i}.jpg").write_bytes(data)
        lines.append(f"images/{i}.jpg\tbig\n")
    listing = folder / "big.list"
    listing.write_text("".join(lines))
    return listing


def test_the_readme_states_the_bound() -> None:
    text = " ".join(ARCHITECTURE.read_text(encoding="utf-8").split())
    assert (f"`--jpeg-restarts`, `--max-side` and `--check-images` add at most "
            f"{DECODE_MEMORY_BYTES >> 20} MiB of images") in text


def test_eight_large_jpegs_are_rewritten_within_the_stated_bound(tmp_path: Path) -> None:
    listing = large_jpegs(tmp_path / "source")
    frame = jpeg_frame((listing.parent / "images/0.jpg").read_bytes())
    assert frame is not None and 2 * frame.coefficient_bytes > DECODE_MEMORY_BYTES
    storage = str(tmp_path / "storage")
    runs = {}
    for name, extra in (("plain", ()), ("restarts", ("--jpeg-restarts",))):
        runs[name] = run_measured([sys.executable, "-m", "trainfeed.cli.main", "upload",
                                   str(listing), "--dataset", name, "--storage", storage,
                                   "--no-progress", *extra])
        assert runs[name].returncode == 0, runs[name].stderr
    added = runs["restarts"].peak_mb - runs["plain"].peak_mb
    print(f"upload of eight 8,000² JPEGs: peak RSS {runs['plain'].peak_mb:.0f} MB plain, "
          f"{runs['restarts'].peak_mb:.0f} MB with --jpeg-restarts (+{added:.0f} MB; "
          f"stated: at most +{DECODE_MEMORY_BYTES / 2**20:.0f} MiB)")
    assert added <= DECODE_MEMORY_BYTES / 2**20
    from trainfeed import dist  # the files were rewritten, not skipped

    reader = dist.reader("restarts", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(mode="validation"))
    assert all(roi._jpeg_region.restart_interval(image) > 0 for image, _ in reader())
