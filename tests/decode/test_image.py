"""The one decode call (trainfeed/decode/image.py) on the whole-image path: `image_size=`
without crop options goes through `decode_into` like the crops, resized by OpenCV instead of
Pillow, and stays within stated tolerances of what Pillow's resize made before."""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from jpeg_samples import encode as jpeg
from jpeg_samples import photo
from PIL import Image

from trainfeed.decode import roi
from trainfeed.decode.crops import Plan, Window, aspect_crop
from trainfeed.decode.image import decode_into, decode_whole
from trainfeed.decode.pixels import DecodeError, ImageDecoder

PACKAGE = Path(__file__).resolve().parents[2] / "trainfeed"


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def pillow_resized(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """What the whole-image path made before it used decode_into: Pillow's bilinear resize,
    which averages over the footprint when shrinking (an antialiased resize)."""
    return np.asarray(Image.fromarray(pixels).resize((size[1], size[0]),
                                                     Image.Resampling.BILINEAR))


# Measured on both of scikit-learn's sample photos at 413x474, 375x500 and 300x420, JPEG and
# PNG: mean differences 0.2-3.1 grey levels at 64x64 and 224x224, up to 5.6 at 8x12-32x32
# (the two filters weigh a footprint differently: a triangle against a box), 99th percentiles
# up to 24 and 40; the worst pixels sit on sharp edges. Enlarging: within 1 level (rounding).
TOLERANCES = {(224, 224): (2.0, 16), (64, 64): (3.5, 30), (32, 32): (6.0, 45),
              (800, 900): (1.0, 2)}


@pytest.mark.parametrize("size", sorted(TOLERANCES))
@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_whole_image_resizes_stay_close_to_pillow_s(size: tuple[int, int], fmt: str) -> None:
    mean_limit, p99_limit = TOLERANCES[size]
    decoder = ImageDecoder(size, threads=1)
    for sample in ("flower.jpg", "china.jpg"):
        for source in ((413, 474), (300, 420)):
            pixels = photo(*source, sample)
            data = jpeg(pixels) if fmt == "jpeg" else png(pixels)
            before = pillow_resized(decode_whole(data)[0], size)
            diff = np.abs(decoder.decode_one(data).astype(int) - before.astype(int))
            assert diff.mean() < mean_limit, (sample, source, diff.mean())
            assert np.percentile(diff, 99) <= p99_limit, (sample, source,
                                                          np.percentile(diff, 99))


def test_an_image_already_of_image_size_decodes_exactly() -> None:
    pixels = photo(120, 160)
    data = jpeg(pixels)
    for decoder in (ImageDecoder((120, 160), threads=1), ImageDecoder((120, 160), crop=True,
                                                                     threads=1)):
        np.testing.assert_array_equal(decoder.decode_one(data), simplejpeg.decode_jpeg(data))
        np.testing.assert_array_equal(decoder.decode_one(png(pixels)), pixels)
    grey = ImageDecoder((120, 160), channels=1, threads=1).decode_one(data)
    np.testing.assert_array_equal(grey, simplejpeg.decode_jpeg(data, colorspace="GRAY"))


def test_the_whole_image_path_is_decode_into_with_the_whole_window() -> None:
    """The same call as the crops: the region decoder (DCT-scaled) takes a resized JPEG, and
    the batch equals decode_into with the whole image (or its centre, `crop`) as the window."""
    blobs = [jpeg(photo(300 + 9 * i, 420 - 7 * i)) for i in range(20)]
    for crop in (False, True):
        decoder = ImageDecoder((48, 64), threads=2, crop=crop)
        batch = decoder.decode(blobs, [f"record {i}" for i in range(20)])
        expected = roi.region_decoder() and "libjpeg-turbo region" or "simplejpeg"
        assert decoder.backend_counts == {expected: 20}
        for i in (0, 13, 19):
            height, width = 300 + 9 * i, 420 - 7 * i
            want = aspect_crop(height, width, (48, 64)) if crop else Window(0, 0, height, width)
            assert decoder._resize_plan.window(height, width) == want
            one = np.empty((48, 64, 3), np.uint8)
            decode_into(blobs[i], Plan(lambda h, w, want=want: want, antialias=True), one)
            np.testing.assert_array_equal(batch.images[i], one)


def test_aspect_crop_keeps_the_largest_centred_window_of_the_target_s_ratio() -> None:
    assert aspect_crop(10, 30, (5, 5)) == Window(0, 10, 10, 10)
    assert aspect_crop(30, 10, (5, 5)) == Window(10, 0, 10, 10)
    assert aspect_crop(375, 500, (224, 224)) == Window(0, 62, 375, 375)
    assert aspect_crop(1, 1000, (100, 1)) == Window(0, 499, 1, 1)  # never empty


def test_undecodable_records_of_the_whole_image_path_are_named_or_skipped() -> None:
    good = jpeg(photo(60, 80))
    bad = b"\xff\xd8not a jpeg at all"
    with pytest.raises(DecodeError, match="record 1: cannot decode image"):
        ImageDecoder((16, 16), threads=1).decode([good, bad], ["record 0", "record 1"])
    decoded = ImageDecoder((16, 16), threads=1, errors="skip").decode(
        [good, bad, png(photo(40, 50))], ["a", "b", "c"])
    assert decoded.ok.tolist() == [True, False, True]
    assert decoded.images.shape == (2, 16, 16, 3) and len(decoded.errors) == 1
    assert decoded.errors[0].startswith("b: cannot decode image")


def test_the_jpeg_signature_and_the_pillow_fallback_are_written_once() -> None:
    """One chain of decoders (issue 27): the JPEG header constant is defined in one module and
    Pillow is called as a fallback from one place of the decode package."""
    sources = {p: p.read_text() for p in PACKAGE.rglob("*.py") if "v1" not in p.parts}
    signature = [p for p, text in sources.items() if re.search(r"\\xff\\xd8[\"']", text)]
    assert [p.name for p in signature] == ["pixel_budget.py"], signature
    callers = [p.name for p, text in sources.items()
               if "pillow_decode(" in text.replace("def pillow_decode(", "")]
    assert callers == ["image.py"], callers
