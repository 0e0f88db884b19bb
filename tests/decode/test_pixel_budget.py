"""trainfeed.decode.pixel_budget: headers read right (the Python frame parser agrees with libjpeg's
and the region decoder's), every decode path refuses an image over the budget before decoding it,
Pillow's own bomb error and a real MemoryError become decode failures of that record, and no
message shows Pillow's repr of a stream."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from bomb_images import jpeg_bomb, zero_png
from PIL import Image

from trainfeed.decode import roi
from trainfeed.decode.crops import CropOptions
from trainfeed.decode.pixel_budget import (
    PixelBudgetError,
    check_pixels,
    decode_bytes,
    header_size,
    jpeg_frame,
    max_image_pixels,
)
from trainfeed.decode.pixels import DecodeError, ImageDecoder
from trainfeed.errors import ConfigurationError

WHERE = "record 7 (images/x.jpg, train_data.list line 8) of shard s"


def photo(height: int, width: int, **save: object) -> bytes:
    rng = np.random.default_rng((height, width))
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8)).save(
        out, "JPEG", **save)
    return out.getvalue()


JPEGS = {
    "4:2:0": photo(61, 65),
    "4:4:4 with exif": photo(120, 90, subsampling=0, exif=Image.Exif().tobytes() + bytes(3000)),
    "4:2:2": photo(33, 700, subsampling=1),
    "progressive": photo(200, 150, progressive=True),
    "grey": simplejpeg.encode_jpeg(np.zeros((40, 24, 1), np.uint8), colorspace="GRAY"),
    "bomb 28000x30000": jpeg_bomb(28000, 30000, 3, data_bytes=480),
    "bomb progressive": jpeg_bomb(16384, 16384, 3, progressive=True),
    "bomb 4:2:0": jpeg_bomb(8000, 8000, 3, subsampled=True),
}


@pytest.mark.parametrize("name", list(JPEGS))
def test_the_frame_parser_agrees_with_libjpeg_and_the_region_decoder(name: str) -> None:
    data = JPEGS[name]
    frame = jpeg_frame(data)
    assert frame is not None
    height, width, _, subsampling = simplejpeg.decode_jpeg_header(data)
    assert (frame.height, frame.width) == (height, width)
    assert roi._jpeg_region.image_size(data) == (height, width) == header_size(data)
    assert frame.progressive == (name.endswith("progressive"))
    if subsampling == "420":
        assert frame.sampling[0] == (2, 2) and frame.sampling[1:] == ((1, 1), (1, 1))


def test_coefficient_bytes_count_whole_mcus() -> None:
    frame = jpeg_frame(JPEGS["bomb 4:2:0"])
    assert frame is not None  # 500x500 MCUs of 4 Y + 1 Cb + 1 Cr blocks, 128 bytes each
    assert frame.coefficient_bytes == 500 * 500 * 6 * 128
    grey = jpeg_frame(jpeg_bomb(9, 17))
    assert grey is not None and grey.coefficient_bytes == 2 * 3 * 128


def test_damaged_headers_have_no_frame() -> None:
    data = JPEGS["4:2:0"]
    assert jpeg_frame(data[:20]) is None  # cut inside the header
    assert jpeg_frame(b"\xff\xd8\xff\xda\x00\x02") is None  # a scan before any frame
    assert jpeg_frame(b"not a jpeg at all") is None
    assert header_size(zero_png(3, 5)) == (3, 5)


def test_check_pixels_names_the_size_the_budget_and_the_setting() -> None:
    check_pixels(100, 100, 10_000)
    with pytest.raises(PixelBudgetError, match=r"declares 101x100 pixels \(10,100\), over the "
                                               r"pixel budget of 10,000.*"
                                               r"TRAINFEED_MAX_IMAGE_PIXELS"):
        check_pixels(100, 101, 10_000)


BOMBS = {"jpeg": JPEGS["bomb 28000x30000"], "progressive": JPEGS["bomb progressive"],
         "valid jpeg": jpeg_bomb(16384, 16384), "png": zero_png(12000, 12000)}


@pytest.mark.parametrize("crops", [None, CropOptions((16, 16), ((0.08, 1.0), (0.75, 4 / 3)))],
                         ids=["whole", "crops"])
@pytest.mark.parametrize("name", list(BOMBS))
def test_every_path_refuses_a_bomb_before_decoding(name: str, crops: CropOptions | None) -> None:
    good = photo(40, 30)
    decoder = ImageDecoder((16, 16), threads=1, errors="raise", crops=crops)
    with pytest.raises(DecodeError, match=rf"{re.escape(WHERE)}: cannot decode image: it "
                                          r"declares .* over the pixel budget of 89,478,485"):
        decoder.decode([good, BOMBS[name]], ["first", WHERE], ids=[1, 7])
    assert decoder.backend_counts.total() <= 1  # the good image only: the bomb never decoded
    decoder.close()


def test_the_budget_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFEED_MAX_IMAGE_PIXELS", "1000")
    assert max_image_pixels() == 1000
    decoder = ImageDecoder(threads=1, errors="skip")
    result = decoder.decode([photo(40, 30), photo(20, 20)], ["a", "b"])
    assert result.ok.tolist() == [False, True] and "budget of 1,000" in result.errors[0]
    monkeypatch.setenv("TRAINFEED_MAX_IMAGE_PIXELS", "0")
    with pytest.raises(ConfigurationError, match="TRAINFEED_MAX_IMAGE_PIXELS='0'"):
        ImageDecoder(threads=1)


def gif_declaring(side: int) -> bytes:
    """A 1-pixel GIF whose logical screen is side x side: what Pillow takes as its size."""
    out = io.BytesIO()
    Image.new("L", (1, 1)).save(out, "GIF")
    gif = bytearray(out.getvalue())
    gif[6:10] = side.to_bytes(2, "little") * 2
    return bytes(gif)


def test_pillow_s_own_bomb_error_is_a_decode_failure() -> None:
    """A format the budget does not parse itself (GIF): Pillow refuses a huge screen at open
    (above twice its MAX_IMAGE_PIXELS), and that refusal is a decode failure of the record."""
    decoder = ImageDecoder(threads=1, errors="skip", max_pixels=10**10)
    result = decoder.decode([gif_declaring(20000)], [WHERE])
    assert result.errors == (f"{WHERE}: cannot decode image: Pillow refused it as a possible "
                             f"decompression bomb (Image size (400000000 pixels) exceeds limit "
                             f"of 178956970 pixels, could be decompression bomb DOS attack.); "
                             f"PIL.Image.MAX_IMAGE_PIXELS sets Pillow's own limit",)



def test_pillow_s_bomb_warning_precedes_the_budget_s_refusal() -> None:
    """Between Pillow's MAX_IMAGE_PIXELS and twice it, Pillow only warns at open: the budget
    (by default the same figure) refuses the image before its pixels are read."""
    decoder = ImageDecoder(threads=1, errors="skip")
    with pytest.warns(Image.DecompressionBombWarning):
        result = decoder.decode([gif_declaring(10000)], [WHERE])
    assert result.errors == (f"{WHERE}: cannot decode image: it declares 10,000x10,000 pixels "
                             f"(100,000,000), over the pixel budget of 89,478,485: refused "
                             f"before decoding, as a possible decompression bomb (raise "
                             f"$TRAINFEED_MAX_IMAGE_PIXELS if such images are meant to be "
                             f"data)",)


def test_a_non_image_is_named_without_pillow_s_repr() -> None:
    decoder = ImageDecoder(threads=1, errors="skip")
    (message,) = decoder.decode([b"these are notes, not a photo"], [WHERE]).errors
    assert message == (f"{WHERE}: cannot decode image: not an image format trainfeed can "
                       f"decode (JPEG, PNG, GIF, BMP, TIFF, WebP...); its first bytes are "
                       f"b'these ar'")


def test_decode_bytes_bounds_what_a_decode_holds() -> None:
    budget = max_image_pixels()
    assert decode_bytes(JPEGS["4:2:0"], budget) == 3 * 61 * 65
    frame = jpeg_frame(JPEGS["progressive"])
    assert frame is not None
    assert decode_bytes(JPEGS["progressive"], budget) == 3 * 200 * 150 + frame.coefficient_bytes
    assert decode_bytes(zero_png(30, 20), budget) == 8 * 600
    assert decode_bytes(BOMBS["png"], budget) == 0  # refused from its header, never decoded
    assert decode_bytes(b"notes", budget) == 8 * budget  # unknown: as large as allowed


def test_a_real_memory_error_is_a_decode_failure_of_that_record(tmp_path: Path) -> None:
    """The budget raised far above what the process may allocate (1 GiB of address space):
    simplejpeg's 2.5 GB output fails with MemoryError, which fails that record only."""
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        import numpy as np, simplejpeg
        from bomb_images import jpeg_bomb
        from trainfeed.decode.pixels import ImageDecoder
        good = simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8))
        decoder = ImageDecoder(threads=1, errors="skip", max_pixels=10**10)
        result = decoder.decode([jpeg_bomb(28000, 30000, 3, data_bytes=480), good],
                                [{WHERE!r}, "good"])
        print(result.ok.tolist(), result.errors[0])
    """)
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (f"[False, True] {WHERE}: cannot decode image: out of memory "
                                  f"while decoding it: lower $TRAINFEED_MAX_IMAGE_PIXELS (the "
                                  f"most pixels an image may declare) or the decode threads")


def test_a_restart_rewrite_leaves_an_image_over_the_budget_as_it_is() -> None:
    data = jpeg_bomb(64, 64)
    assert roi.with_restarts(data, max_pixels=64 * 63) is data
    assert roi._jpeg_region.restart_interval(roi.with_restarts(data, max_pixels=64 * 64)) > 0



def test_the_region_decoder_s_own_budget_check_is_not_taken_for_damage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: should the Python reading of a header ever say less than the
    extension's, the extension's own PixelBudgetError refuses the image: it is not mistaken
    for damage and handed to a whole-image decoder (which would allocate it)."""
    from trainfeed.decode import image
    from trainfeed.decode.crops import Plan, Window

    if roi._jpeg_region is None:
        pytest.skip("the region decoder is not built")
    data = photo(64, 48)
    monkeypatch.setattr(image, "header_size", lambda _data: (8, 8))  # a reading that says less
    monkeypatch.setattr(roi, "header_size", lambda _data: (8, 8))
    dst = np.empty((16, 16, 3), np.uint8)
    with pytest.raises(PixelBudgetError, match="budget"):
        image.decode_into(data, Plan(lambda h, w: Window(0, 0, 8, 8)), dst, max_pixels=1000)
    assert roi.with_restarts(data, max_pixels=1000) == data  # bytes kept, not rewritten
    assert roi.with_restarts(data) != data
