"""The region decoder (trainfeed/decode/_jpeg_region.c): a window decoded alone is bit-exact with
the same window of a whole decode, at every DCT scale, chroma subsampling, baseline or
progressive, RGB or grey; damaged data and bad arguments raise ValueError, never wrong pixels."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import simplejpeg
from jpeg_samples import decode_window, encode, photo
from PIL import Image

from trainfeed.decode import roi
from trainfeed.decode.crops import Plan, Window
from trainfeed.decode.image import decode_into

region = roi._jpeg_region


def test_the_region_decoder_is_built() -> None:
    """setup.py builds it wherever libjpeg-turbo's headers are (CI installs them): without it,
    training crops silently decode whole images (docs/imagenet.md)."""
    assert region is not None, "trainfeed.decode._jpeg_region was not built: see setup.py"
    assert roi.region_decoder() is not None


@pytest.mark.parametrize("options", [{}, {"subsampling": 0}, {"subsampling": 1},
                                     {"progressive": True}, {"grey": True}],
                         ids=["4:2:0", "4:4:4", "4:2:2", "progressive", "grey"])
def test_windows_are_bit_exact_with_a_whole_decode(options: dict) -> None:
    pixels = photo(403, 474)
    if options.pop("grey", False):
        pixels = np.asarray(Image.fromarray(pixels).convert("L"))
    data = encode(pixels, **options)
    rng = np.random.default_rng(7)
    for scale in (1, 2, 4, 8):
        whole = simplejpeg.decode_jpeg(data, min_height=-(-403 // scale),
                                       min_width=-(-474 // scale))
        height, width = whole.shape[:2]
        assert (height, width) == (-(-403 // scale), -(-474 // scale))
        windows = [(0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, 1, 1),
                   (width - 17, 0, 17, height)]
        for _ in range(12):
            w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
            windows.append((int(rng.integers(0, width - w + 1)),
                            int(rng.integers(0, height - h + 1)), w, h))
        for left, top, w, h in windows:
            got = decode_window(data, left, top, w, h, scale)
            np.testing.assert_array_equal(got, whole[top:top + h, left:left + w],
                                          err_msg=f"window {(left, top, w, h)} at 1/{scale}")


def test_grey_output_equals_simplejpegs_grey_decode() -> None:
    data = encode(photo(300, 420))
    whole = simplejpeg.decode_jpeg(data, colorspace="GRAY")
    np.testing.assert_array_equal(decode_window(data, 33, 41, 250, 200, channels=1),
                                  whole[41:241, 33:283])


def test_damaged_data_and_bad_windows_raise_value_error() -> None:
    data = encode(photo(300, 420))
    with pytest.raises(ValueError, match="[Pp]remature end"):
        decode_window(data[:len(data) // 2], 0, 200, 100, 90)  # rows past the cut
    with pytest.raises(ValueError):
        decode_window(b"\xff\xd8\xff\xe0 not a jpeg at all", 0, 0, 10, 10)
    damaged = bytearray(data)
    damaged[len(data) // 2:len(data) // 2 + 2] = b"\xff\xd0"  # a stray restart marker
    with pytest.raises(ValueError, match="[Cc]orrupt"):
        decode_window(bytes(damaged), 0, 0, 420, 300)
    with pytest.raises(ValueError, match="outside"):
        decode_window(data, 400, 0, 21, 10)
    with pytest.raises(ValueError, match="outside"):
        decode_window(data, 0, 0, 0, 10)
    for bad in ((-1, 0, 10, 10), (2**32 - 1, 0, 2, 10), (0, 0, 2**31, 10)):  # no wraparound
        with pytest.raises((ValueError, OverflowError)):
            region.decode_region(data, np.empty(10**6, np.uint8), *bad, 1, 3, False)
    with pytest.raises(ValueError, match="scale"):
        region.decode_region(data, np.empty(10**6, np.uint8), 0, 0, 10, 10, 3, 3, False)
    with pytest.raises(ValueError, match="too small"):
        region.decode_region(data, np.empty(100, np.uint8), 0, 0, 100, 100, 1, 3, False)
    with pytest.raises(TypeError):  # a read-only output buffer
        region.decode_region(data, b"\0" * 10**6, 0, 0, 10, 10, 1, 3, False)


def test_decode_crop_falls_back_to_a_whole_decode_on_what_the_region_decoder_refuses() -> None:
    """A CMYK JPEG: the region decoder refuses it, simplejpeg converts it."""
    pixels = photo(300, 420)
    cmyk = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG", quality=95)
    with pytest.raises(ValueError, match="CMYK"):
        decode_window(cmyk.getvalue(), 0, 0, 100, 100)
    out = np.empty((64, 64, 3), np.uint8)
    assert decode_into(cmyk.getvalue(), Plan(lambda h, w: Window(10, 10, 200, 200)),
                       out) == "simplejpeg"


def test_a_missing_region_decoder_is_said_once_and_in_doctor(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An install without libjpeg-turbo's headers still works, slower: never silently."""
    from trainfeed.decode.crops import CropOptions
    from trainfeed.decode.pixels import ImageDecoder, decoders
    monkeypatch.setattr(roi, "_jpeg_region", None)
    monkeypatch.setattr(roi, "_warned", threading.Event())
    crops = CropOptions((32, 32), ((0.08, 1.0), (3 / 4, 4 / 3)))
    with caplog.at_level("WARNING", logger="trainfeed.decode.roi"):
        ImageDecoder(threads=1, crops=crops)
        ImageDecoder(threads=1, crops=crops)
        ImageDecoder(threads=1)  # no crops: nothing to say
    said = [r for r in caplog.records if "region decoder was not built" in r.getMessage()]
    assert len(said) == 1 and "libjpeg-dev" in said[0].getMessage()
    assert decoders()["jpeg crops"].startswith("NOT BUILT")
    out = np.empty((32, 32, 3), np.uint8)
    data = encode(photo(100, 120))
    assert decode_into(data, Plan(lambda h, w: Window(0, 0, 50, 60)), out) == "simplejpeg"


@pytest.mark.parametrize("options", [{}, {"subsampling": 0}, {"progressive": True},
                                     {"grey": True}, {"restarts": True}],
                         ids=["4:2:0", "4:4:4", "progressive", "grey", "restart-indexed"])
def test_image_size_reads_the_frame_header_as_libjpeg_does(options: dict) -> None:
    grey, restarts = options.pop("grey", False), options.pop("restarts", False)
    for height, width in ((403, 474), (1, 17), (333, 8)):
        pixels = photo(height, width)
        if grey:
            pixels = np.asarray(Image.fromarray(pixels).convert("L"))
        data = encode(pixels, **options)
        if restarts:
            data = roi.with_restarts(data)
        assert region.image_size(data) == simplejpeg.decode_jpeg_header(data)[:2] == \
            (height, width)
        assert region.image_size(memoryview(data)) == (height, width)


def test_image_size_is_none_for_what_is_not_a_jpeg_frame() -> None:
    data = encode(photo(40, 60))
    png = io.BytesIO()
    Image.fromarray(photo(40, 60)).save(png, format="PNG")
    frame = data.index(b"\xff\xc0")
    for bad in (b"", b"\xff\xd8", png.getvalue(), data[:frame + 6],  # cut inside the frame
                data[:2] + b"\xff\xd0" + data[2:],  # a restart marker among the headers
                data[:frame + 5] + b"\x00\x00" + data[frame + 7:],  # height 0 (DNL)
                b"\xff\xd8\xff\xe0\xff\xff"):  # a segment longer than the data
        assert region.image_size(bad) is None, bad[:16]
    with pytest.raises(TypeError):
        region.image_size("not bytes")  # type: ignore[arg-type]
