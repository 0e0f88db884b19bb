"""The region decoder (trainfeed/decode/_jpeg_region.c) against crafted files (issue 25): what
a file can do to it is raise a Python exception, never free memory twice, crash the process or
allocate for pixels beyond the caller's budget.

The crafted files run in a child process: an abort there is a failed assertion with the child's
output, not a dead pytest. tools/sanitize_jpeg_region.sh runs these tests again with the
extension built under AddressSanitizer and UBSan, and fuzzes it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from jpeg_samples import (
    declared_jpeg,
    encode,
    many_scans_jpeg,
    oversized_dc_jpeg,
    photo,
    restart_indexed_jpeg,
)

from trainfeed import LocalSource, PipelineOptions, dist
from trainfeed.decode import roi

region = roi._jpeg_region
# Set by tools/sanitize_jpeg_region.sh: the extension under test is its ASan build.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")


def run_child(code: str, *args: str, env: dict[str, str] | None = None,
              preexec: bool = False) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter, which loads only the extension (from region.__file__,
    passed as argv[1]), with `args` after it."""
    prelude = textwrap.dedent("""\
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("_jpeg_region", sys.argv[1])
        region = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(region)
        """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code),
                           str(region.__file__), *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("comment_bytes", [6000, 70_000], ids=["6000 B", "70000 B"])
def test_add_restarts_refuses_the_crafted_file_without_a_double_free(
        tmp_path: Path, comment_bytes: int) -> None:
    """An 8x8 JPEG whose comments (>= 4 KiB: the output buffer grows) are copied before
    libjpeg refuses its DC coefficient: a ValueError, not "double free or corruption" (the
    child aborted, SIGABRT, before the fix)."""
    crafted = tmp_path / "crafted.jpg"
    crafted.write_bytes(oversized_dc_jpeg(comment_bytes))
    child = run_child("""\
        data = open(sys.argv[2], "rb").read()
        for _ in range(3):  # a freed buffer reused would show on a later call
            try:
                region.add_restarts(data, 32)
            except ValueError as error:
                print("ValueError:", error)
            else:
                print("no error")
        """, str(crafted))
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.splitlines() == ["ValueError: DCT coefficient out of range"] * 3


def test_upload_jpeg_restarts_keeps_the_crafted_file_as_it_is(tmp_path: Path) -> None:
    """`trainfeed upload --jpeg-restarts` on a list holding the crafted file (line 2): the
    upload completes, the photos get restart markers, the crafted file keeps its bytes (what
    the rewrite does to every JPEG libjpeg cannot re-encode: CMYK, damaged). It aborted with
    exit 134 before the fix."""
    source = tmp_path / "source"
    (source / "images").mkdir(parents=True)
    crafted = oversized_dc_jpeg()
    (source / "images/a.jpg").write_bytes(encode(photo(64, 80)))
    (source / "images/crafted.jpg").write_bytes(crafted)
    (source / "images/c.jpg").write_bytes(encode(photo(48, 40)))
    (source / "train_data.list").write_text("images/a.jpg\tx\nimages/crafted.jpg\ty\n"
                                            "images/c.jpg\tx\n")
    storage = tmp_path / "storage"
    upload = subprocess.run(
        [sys.executable, "-m", "trainfeed.cli.main", "upload", str(source / "train_data.list"),
         "--dataset", "crafted", "--storage", str(storage), "--jpeg-restarts", "--no-progress"],
        capture_output=True, text=True, timeout=120)
    assert upload.returncode == 0, f"exit {upload.returncode}: {upload.stderr[-2000:]}"
    reader = dist.reader("crafted", source=LocalSource(storage=str(storage)),
                         pipeline=PipelineOptions(mode="validation"))
    stored = sorted((bytes(image) for image, _label in reader()), key=len)
    assert crafted in stored and len(stored) == 3
    assert [region.restart_interval(image) > 0 for image in stored if image != crafted] == \
        [True, True]


def test_sub_image_tells_no_layout_from_an_allocation_failure(tmp_path: Path) -> None:
    """None means "no fitting restart layout: decode the whole stream"; an allocation that
    fails is a MemoryError (it was None too, so a caller could not tell)."""
    assert region.sub_image(encode(photo(64, 64)), 8, 8, 16, 16) is None  # no restart markers
    assert region.sub_image(restart_indexed_jpeg(64, 64), 8, 8, 16, 16) is not None
    padded = tmp_path / "padded.jpg"  # 16 MiB: the copy the fast path makes cannot be had
    padded.write_bytes(restart_indexed_jpeg(64, 64, padding=16 << 20))
    code = """\
        import mmap, resource
        file = open(sys.argv[2], "rb")
        data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if len(sys.argv) > 3:  # no ASan: cap the address space at what is mapped, +4 MiB
            pages = int(open("/proc/self/statm").read().split()[0])
            limit = pages * resource.getpagesize() + (4 << 20)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            print(region.sub_image(data, 8, 8, 16, 16))
        except MemoryError:
            print("MemoryError")
        """
    if SANITIZED:  # ASan reserves terabytes of address space: cap its allocator instead
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1"
                               ":max_allocation_size_mb=4:log_path=stderr")  # (its warning)
        child = run_child(code, str(padded), env=env)
    else:
        child = run_child(code, str(padded), "limit")
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.strip() == "MemoryError"


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_a_pixel_budget_refuses_before_allocating(progressive: bool) -> None:
    """A few hundred bytes declaring 28,000 x 30,000 pixels: PixelBudgetError (a ValueError)
    that says so, from both entry points that decode. Exactly the budget is within it."""
    bomb = declared_jpeg(28_000, 30_000, progressive)
    out = np.empty(1 << 16, np.uint8)
    budget = 89_478_485  # Pillow's MAX_IMAGE_PIXELS
    message = "declares 28000x30000 pixels, over the budget of 89478485"
    with pytest.raises(region.PixelBudgetError, match=message):
        region.decode_region(bomb, out, 0, 0, 8, 8, 1, 1, False, max_pixels=budget)
    with pytest.raises(region.PixelBudgetError, match=message):
        region.add_restarts(bomb, 32, max_pixels=budget)
    assert issubclass(region.PixelBudgetError, ValueError)
    small = declared_jpeg(8, 8, progressive)
    assert region.decode_region(small, out, 0, 0, 8, 8, 1, 1, False, max_pixels=64) == (8, 0)
    with pytest.raises(region.PixelBudgetError, match="8x8 pixels, over the budget of 63"):
        region.decode_region(small, out, 0, 0, 8, 8, 1, 1, False, max_pixels=63)
    assert len(region.add_restarts(small, 32, max_pixels=64)) > 0
    with pytest.raises(ValueError, match="max_pixels must be >= 0"):
        region.add_restarts(small, 32, max_pixels=-1)


def test_the_budget_also_holds_on_the_restart_interval_fast_path() -> None:
    """A restart-indexed JPEG's window decodes from a sub-image smaller than the frame: the
    frame's declared size is what the budget counts all the same."""
    data = restart_indexed_jpeg(64, 64)
    out = np.empty(1 << 16, np.uint8)
    assert region.decode_region(data, out, 16, 16, 8, 8, 1, 1, False, max_pixels=4096)[0] >= 8
    with pytest.raises(region.PixelBudgetError, match="64x64 pixels"):
        region.decode_region(data, out, 16, 16, 8, 8, 1, 1, False, max_pixels=4095)


def test_the_budget_bounds_the_memory_of_a_progressive_bomb(tmp_path: Path) -> None:
    """The same bomb, progressive (libjpeg would zero 1.7 GB of coefficients for it), in a
    child process: refused with its peak memory still that of a bare interpreter."""
    bomb = tmp_path / "bomb.jpg"
    bomb.write_bytes(declared_jpeg(28_000, 30_000, progressive=True))
    child = run_child("""\
        try:
            region.decode_region(open(sys.argv[2], "rb").read(), bytearray(1 << 16), 0, 0, 8, 8,
                                 1, 1, False, max_pixels=89_478_485)
        except region.PixelBudgetError as error:  # (ru_maxrss would count the forking parent)
            peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
            print(type(error).__name__, peak.split()[1])
        """, str(bomb))
    assert child.returncode == 0, child.stderr[-2000:]
    name, peak_kib = child.stdout.split()
    assert name == "PixelBudgetError" and int(peak_kib) < 100 * 1024, child.stdout


def test_more_than_500_scans_are_refused() -> None:
    """Each scan of a progressive JPEG is a pass over all its coefficients: 500 decode (what
    TurboJPEG's scan limit allows), 501 raise ValueError in both entry points that decode."""
    out = np.empty(1 << 16, np.uint8)
    assert region.MAX_SCANS == 500
    assert region.decode_region(many_scans_jpeg(500), out, 0, 0, 8, 8, 1, 1, False) == (8, 0)
    assert len(region.add_restarts(many_scans_jpeg(500), 32)) > 0
    bomb = many_scans_jpeg(501)
    with pytest.raises(ValueError, match="more than 500 scans"):
        region.decode_region(bomb, out, 0, 0, 8, 8, 1, 1, False)
    with pytest.raises(ValueError, match="more than 500 scans"):
        region.add_restarts(bomb, 32)


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine holds freed memory: there the "
                    "fuzzer's LeakSanitizer checks this (tools/fuzz/seeds.py has the input)")
def test_a_refused_empty_input_leaks_nothing() -> None:
    """libjpeg refuses empty data as it is handed over (jpeg_mem_src): the decompressor made
    just before must still be destroyed (the fuzz run's LeakSanitizer found it was not, 4 KiB
    an input, in this branch before it landed)."""
    out = np.empty(1 << 12, np.uint8)

    def rss_kib() -> int:
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])

    for _ in range(2):  # the first rounds settle the allocator
        for _ in range(5_000):
            with pytest.raises(ValueError, match="[Ee]mpty"):
                region.decode_region(b"", out, 0, 0, 8, 8, 1, 3, False)
    before = rss_kib()
    for _ in range(20_000):
        for call in (lambda: region.decode_region(b"", out, 0, 0, 8, 8, 1, 3, False),
                     lambda: region.add_restarts(b"", 32)):
            with pytest.raises(ValueError, match="[Ee]mpty"):
                call()
    assert rss_kib() - before < 16 * 1024, "about 4 KiB leaked a call"
