"""Restart-indexed JPEGs (trainfeed/decode/_jpeg_region.c): `add_restarts` rewrites a JPEG
losslessly, and a window of a JPEG with fitting restart markers, decoded from its intervals alone,
is bit-exact with the same window of a whole decode, at every DCT scale and sampling. Layouts
that do not fit (no markers, an interval that does not divide the rows, progressive) and damaged
data take the whole-stream path: exact pixels or ValueError, never anything else."""
from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from jpeg_samples import decode_window, encode, photo
from PIL import Image

from trainfeed.decode import roi

region = roi._jpeg_region
HEIGHT, WIDTH = 403, 474
SAMPLINGS = {"4:2:0": {}, "4:4:4": {"subsampling": 0}, "4:2:2": {"subsampling": 1},
             "progressive": {"progressive": True}, "grey": {"grey": True}}


def source(name: str) -> bytes:
    options = dict(SAMPLINGS[name])
    pixels = photo(HEIGHT, WIDTH)
    if options.pop("grey", False):
        pixels = np.asarray(Image.fromarray(pixels).convert("L"))
    return encode(pixels, **options)


def windows(width: int, height: int, seed: int = 3) -> list[tuple[int, int, int, int]]:
    """Corners, edges, single pixels and random windows of an image of (width, height)."""
    rng = np.random.default_rng(seed)
    fixed = [(0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, 1, 1),
             (width // 2, 0, width - width // 2, height), (0, height // 2, width, 1),
             (width - 17, height - 9, 17, 9), (5, 7, 3, height - 7)]
    for _ in range(40):
        w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        fixed.append((int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)),
                      w, h))
    return fixed


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_the_rewrite_is_lossless_and_adds_fitting_restarts(name: str) -> None:
    data = source(name)
    rewritten = region.add_restarts(data, roi.RESTART_TARGET_PIXELS)
    np.testing.assert_array_equal(simplejpeg.decode_jpeg(rewritten), simplejpeg.decode_jpeg(data))
    assert region.restart_interval(data) == 0
    interval = region.restart_interval(rewritten)
    mcu = 8 if name in ("4:4:4", "grey") else 16
    assert interval >= 1 and -(-WIDTH // mcu) % interval == 0
    assert interval * mcu <= roi.RESTART_TARGET_PIXELS
    assert 0.95 < len(rewritten) / len(data) < 1.1  # markers, against optimized tables


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_windows_of_a_rewritten_jpeg_are_bit_exact_with_the_original_s_whole_decode(
        name: str) -> None:
    data = source(name)
    rewritten = roi.with_restarts(data)
    for scale in (1, 2, 4, 8):
        whole = simplejpeg.decode_jpeg(data, min_height=-(-HEIGHT // scale),
                                       min_width=-(-WIDTH // scale))
        height, width = whole.shape[:2]
        for left, top, w, h in windows(width, height, seed=scale):
            got = decode_window(rewritten, left, top, w, h, scale)
            np.testing.assert_array_equal(got, whole[top:top + h, left:left + w],
                                          err_msg=f"{name} 1/{scale} {(left, top, w, h)}")


@pytest.mark.parametrize("name", ["4:2:0", "4:4:4", "grey"])
def test_the_intervals_alone_decode_the_window(name: str) -> None:
    """The fast path itself, without the whole-stream fallback: the sub-image of the intervals
    around a window is a JPEG no larger than the window's MCU rows and columns, and the window
    decoded from it equals the whole decode's."""
    data = source(name)
    rewritten = roi.with_restarts(data)
    whole = simplejpeg.decode_jpeg(data)
    assert region.sub_image(data, 100, 100, 200, 200) is None  # no markers: nothing to cut
    assert region.sub_image(rewritten, 0, 0, WIDTH, HEIGHT) is None  # the image itself
    for left, top, w, h in windows(WIDTH, HEIGHT)[1:]:
        edge = 4
        cut = region.sub_image(rewritten, max(0, left - edge), max(0, top - edge),
                               left + w + edge, top + h + edge)
        if cut is None:  # whole rows from the first: the plain path does the same work
            assert top - edge < 16 and left - edge < 32 and left + w + edge > WIDTH - 32
            continue
        sub, x, y = cut
        assert len(sub) < len(rewritten)
        sub_height, sub_width = simplejpeg.decode_jpeg_header(sub)[:2]
        assert x <= left and y <= top
        assert x + sub_width >= min(WIDTH, left + w) and y + sub_height >= min(HEIGHT, top + h)
        np.testing.assert_array_equal(decode_window(sub, left - x, top - y, w, h),
                                      whole[top:top + h, left:left + w],
                                      err_msg=f"{name} {(left, top, w, h)}")


@pytest.mark.parametrize(("options", "interval"), [({"restart_marker_rows": 1}, 30),
                                                   ({"restart_marker_blocks": 7}, 0),
                                                   ({"restart_marker_blocks": 5}, 5)],
                         ids=["a row per interval", "7 (not a divisor of 30)", "5 (a divisor)"])
def test_restart_markers_written_by_other_encoders(options: dict, interval: int) -> None:
    """Pillow's own restart markers: a row per interval and an interval dividing the row take
    the intervals path (interval > 0), one that straddles rows the whole-stream path; all
    exact."""
    data = encode(photo(HEIGHT, WIDTH), **options)
    assert region.restart_interval(data) == interval
    whole = simplejpeg.decode_jpeg(data)
    for left, top, w, h in windows(WIDTH, HEIGHT):
        np.testing.assert_array_equal(decode_window(data, left, top, w, h),
                                      whole[top:top + h, left:left + w])


def test_metadata_is_kept_and_jfif_written_once() -> None:
    out = io.BytesIO()
    exif = Image.Exif()
    exif[0x010F] = "trainfeed camera"
    Image.fromarray(photo(64, 80)).save(out, "JPEG", quality=90, exif=exif.tobytes(),
                                        comment=b"a comment")
    rewritten = roi.with_restarts(out.getvalue())
    assert region.restart_interval(rewritten) > 0
    with Image.open(io.BytesIO(rewritten)) as image:
        assert image.getexif()[0x010F] == "trainfeed camera"
        assert image.info.get("comment") == b"a comment"
    assert rewritten.count(b"JFIF\x00") == 1


def test_what_cannot_be_rewritten_keeps_its_bytes() -> None:
    png = io.BytesIO()
    Image.fromarray(photo(32, 32)).save(png, "PNG")
    cmyk = io.BytesIO()
    Image.fromarray(photo(32, 32)).convert("CMYK").save(cmyk, "JPEG")
    truncated = source("4:2:0")[:5000]
    for data in (png.getvalue(), cmyk.getvalue(), truncated, b"\xff\xd8 not a jpeg"):
        assert roi.with_restarts(data) is data
    with pytest.raises(ValueError):
        region.add_restarts(truncated, 2)
    with pytest.raises(ValueError, match="1-65535"):
        region.add_restarts(source("grey"), 0)


def test_a_restart_marker_out_of_sequence_is_an_error_not_pixels() -> None:
    """The layout check refuses markers out of order, and the whole-stream decode (strict)
    names the damage: a window past it raises."""
    rewritten = roi.with_restarts(source("4:2:0"))
    first = rewritten.index(b"\xff\xd0")
    damaged = rewritten[:first + 1] + b"\xd3" + rewritten[first + 2:]
    assert region.restart_interval(damaged) == region.restart_interval(rewritten)
    with pytest.raises(ValueError):
        decode_window(damaged, WIDTH - 50, HEIGHT - 40, 50, 40)


def test_flipped_bytes_never_crash_the_layout_parser() -> None:
    """Hostile headers: every outcome is exact pixels, other pixels from a stream libjpeg
    accepts, or ValueError; the parser reads nothing outside the buffer (no crash)."""
    rewritten = roi.with_restarts(source("4:2:0"))
    scan = rewritten.index(b"\xff\xda")
    rng = np.random.default_rng(11)
    outcomes = {"pixels": 0, "error": 0}
    for _ in range(300):
        damaged = bytearray(rewritten)
        for at in rng.integers(2, scan + 14, size=int(rng.integers(1, 4))):
            damaged[at] = int(rng.integers(0, 256))
        cut = int(rng.integers(scan, len(damaged) + 1))
        try:
            decode_window(bytes(damaged[:cut]), 200, 150, 120, 100)
            outcomes["pixels"] += 1
        except ValueError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0


def test_the_scan_stops_at_the_window_s_last_row() -> None:
    """Intervals below the window are neither decoded nor scanned: a stream cut short below the
    window still gives the window's exact pixels from its intervals, and one cut inside the
    window is an error."""
    data = source("4:2:0")
    rewritten = roi.with_restarts(data)
    whole = simplejpeg.decode_jpeg(data)
    mcu_row = len(rewritten) * 16 // HEIGHT  # roughly one row of MCUs, in bytes
    cut_short = rewritten[:len(rewritten) // 2 + 2 * mcu_row]  # no EOI: not a whole stream
    left, top, w, h = 100, 40, 120, HEIGHT // 2 - 60
    cut = region.sub_image(cut_short, left - 4, top - 4, left + w + 4, top + h + 4)
    assert cut is not None
    sub, x, y = cut
    np.testing.assert_array_equal(decode_window(sub, left - x, top - y, w, h),
                                  whole[top:top + h, left:left + w])
    np.testing.assert_array_equal(decode_window(cut_short, left, top, w, h),
                                  whole[top:top + h, left:left + w])
    assert region.sub_image(cut_short, 100, HEIGHT - 60, 200, HEIGHT - 10) is None
    with pytest.raises(ValueError):
        decode_window(cut_short, 100, HEIGHT - 60, 100, 50)
