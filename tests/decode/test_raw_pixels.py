"""Raw pixel records (trainfeed.decode.raw, `upload --raw-below`): read without a decode, with the
crops, seeding, resize and channels of the same pixels stored losslessly (a PNG); a record whose
header disagrees with its length, or declares too many pixels, is refused before any array is
made, naming the record (issue 39, item 3)."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from trainfeed.decode import raw
from trainfeed.decode.crops import DEFAULT_RATIO, DEFAULT_SCALE, CropOptions
from trainfeed.decode.image import decode_whole
from trainfeed.decode.pixels import ImageDecoder
from trainfeed.errors import DecodeError, PixelBudgetError

BUDGET = 1 << 20


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients with noise: resizes and crops of it differ wherever they differ."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    return np.clip(ramp + rng.normal(0, 30, (height, width, 3)), 0, 255).astype(np.uint8)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels).save(out, "PNG")
    return out.getvalue()


def test_a_record_round_trips_and_is_a_view_of_its_bytes() -> None:
    pixels = photo(37, 53)
    record = raw.encode(pixels)
    assert len(record) == raw.HEADER_BYTES + 37 * 53 * 3 and raw.is_raw(record)
    view = raw.pixels(record, BUDGET)
    assert np.array_equal(view, pixels) and not view.flags.owndata
    whole, decoder = decode_whole(record)  # an array of its own, as for any image
    assert decoder == "raw pixels" and np.array_equal(whole, pixels) and whole.flags.writeable
    assert not raw.is_raw(png(pixels)) and not raw.is_raw(b"\xff\xd8\xff")


@pytest.mark.parametrize("random", [True, False])
def test_crops_of_a_raw_record_equal_those_of_the_same_pixels_as_a_png(random: bool) -> None:
    """Same window, same seeding per (seed, epoch, id), same resize and flip: pixel for pixel."""
    images = [photo(40 + 7 * i, 90 - 5 * i, seed=i) for i in range(12)]
    crops = CropOptions((24, 24), random_resized_crop=(DEFAULT_SCALE, DEFAULT_RATIO)
                        if random else None, flip=0.5 if random else 0.0)
    decoder = ImageDecoder(crops=crops, threads=1)
    ids = list(range(100, 112))
    where = [f"record {i}" for i in ids]
    as_raw = decoder.decode([raw.encode(p) for p in images], where, ids, seed=3, epoch=2)
    as_png = decoder.decode([png(p) for p in images], where, ids, seed=3, epoch=2)
    assert np.array_equal(as_raw.images, as_png.images)
    assert decoder.backend_counts["raw pixels"] == 12
    other_epoch = decoder.decode([raw.encode(p) for p in images], where, ids, seed=3, epoch=3)
    assert not np.array_equal(other_epoch.images, as_raw.images) or not random


@pytest.mark.parametrize("channels", [3, 1])
def test_resize_and_channels_of_a_raw_record_equal_the_png_path(channels: int) -> None:
    images = [photo(50, 70, seed=1), photo(31, 29, seed=2)]
    for size in ((16, 16), (64, 96)):  # shrinking (area average) and enlarging (bilinear)
        decoder = ImageDecoder(image_size=size, channels=channels, threads=1)
        for p in images:
            assert np.array_equal(decoder.decode_one(raw.encode(p)), decoder.decode_one(png(p)))
    grey = photo(20, 30)[:, :, :1]
    decoder = ImageDecoder(channels=3, threads=1)
    assert np.array_equal(decoder.decode_one(raw.encode(grey)), decoder.decode_one(png(grey)))


def header(height: int, width: int, channels: int = 3, zero: int = 0) -> bytes:
    return struct.pack("<8sHHHH", raw.MAGIC, height, width, channels, zero)


@pytest.mark.parametrize(("data", "said"), [
    (header(10, 10) + bytes(299), "holds 315 bytes: truncated"),
    (header(10, 10) + bytes(301), "holds 317 bytes: truncated"),
    (raw.MAGIC + b"\x01", "shorter than its 16-byte header"),
    (header(10, 10, channels=4) + bytes(400), "of 4 channel(s)"),
    (header(0, 10) + b"", "declares 10x0 pixels"),
    (header(10, 10, zero=1) + bytes(300), "damaged header"),
])
def test_a_record_whose_header_disagrees_with_it_is_refused(data: bytes, said: str) -> None:
    with pytest.raises(ValueError, match="raw pixel record|damaged") as e:
        raw.pixels(data, BUDGET)
    assert said in str(e.value)


def test_a_record_over_the_pixel_budget_is_refused_from_its_header() -> None:
    """65,535² pixels declared in 16 bytes: refused by the budget before its length or any
    allocation (12.9 GB if it were made)."""
    with pytest.raises(PixelBudgetError, match="over the pixel budget of 1,048,576"):
        raw.pixels(header(0xFFFF, 0xFFFF), BUDGET)
    with pytest.raises(PixelBudgetError):
        decode_whole(header(2000, 2000) + bytes(12_000_000), max_pixels=BUDGET)


def test_a_damaged_record_in_a_batch_is_a_decode_error_naming_it() -> None:
    good = raw.encode(photo(20, 20))
    decoder = ImageDecoder(crops=CropOptions((8, 8)), threads=1)
    with pytest.raises(DecodeError, match=r"record 5 of shard-00000.parquet \(images/5.jpg, "
                                          r"line 6\): cannot decode image: .*truncated"):
        decoder.decode([good, good[:-1]], ["record 4", "record 5 of shard-00000.parquet "
                                                       "(images/5.jpg, line 6)"], [4, 5])
    skip = ImageDecoder(crops=CropOptions((8, 8)), threads=1, errors="skip")
    out = skip.decode([good, good + b"\x00"], ["record 4", "record 5"], [4, 5])
    assert out.ok.tolist() == [True, False] and "record 5" in out.errors[0]


def test_encode_refuses_what_a_record_cannot_hold() -> None:
    with pytest.raises(ValueError, match="uint8"):
        raw.encode(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="1 or 3"):
        raw.encode(np.zeros((4, 4, 4), np.uint8))
