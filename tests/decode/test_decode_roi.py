"""Decode-stage crops: the pixels equal a full decode cropped and resized, PNG and odd JPEGs fall
back to Pillow correctly, and a seed gives the same crops in any batch, thread or run."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from jpeg_samples import encode as jpeg
from jpeg_samples import photo as sample_photo
from jpeg_samples import upload_photos
from PIL import Image

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LocalSource,
    PipelineOptions,
    SamplingOptions,
    dist,
)
from trainfeed.decode import roi
from trainfeed.decode.crops import CropOptions, Plan, Window, record_uniforms
from trainfeed.decode.image import decode_into
from trainfeed.decode.pixels import DecodeError, ImageDecoder
from trainfeed.decode.resize import cv2_module, resize_into
from trainfeed.decode.roi import dct_reduction

RRC = ((0.08, 1.0), (3 / 4, 4 / 3))


def photo(height: int, width: int) -> np.ndarray:
    return sample_photo(height, width, "china.jpg")


def reference(data: bytes, window: Window, size: tuple[int, int]) -> np.ndarray:
    """A full decode, cropped, resized with OpenCV's area average (an antialiased resize)."""
    full = simplejpeg.decode_jpeg(data)
    crop = full[window.top:window.top + window.height, window.left:window.left + window.width]
    return cv2_module().resize(crop, (size[1], size[0]), interpolation=cv2_module().INTER_AREA)


def fixed(window: Window, flip: bool = False, antialias: bool = False) -> Plan:
    """A plan whose window is always `window`, with libjpeg's accurate IDCT."""
    return Plan(lambda height, width: window, flip=flip, antialias=antialias)


@pytest.fixture(params=["region", "whole"])
def jpeg_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both JPEG crop paths: the region decoder (built by the install, see setup.py) and the
    whole-image decode it replaces where it was not built. Returns the backend name."""
    if request.param == "whole":
        monkeypatch.setattr(roi, "_jpeg_region", None)
        return "simplejpeg"
    assert roi.region_decoder(), "the region decoder was not built: see setup.py"
    return "libjpeg-turbo region"


def test_dct_scaled_crops_equal_a_full_decode_cropped_and_resized(jpeg_path: str) -> None:
    """A window at least 2x the target is decoded at 1/2, 1/4 or 1/8 (its edges moved to that
    grid, at most k/2 source pixels) and equals a full decode of that window, area-resized."""
    data = jpeg(photo(1200, 1600))
    for window, k in ((Window(100, 200, 800, 1000), 4), (Window(0, 0, 1200, 1600), 8),
                      (Window(333, 517, 460, 470), 4), (Window(50, 61, 300, 400), 2),
                      (Window(40, 33, 200, 210), 1)):
        assert dct_reduction(window, (112, 112)) == k
        used = window.on_grid(k, 1200, 1600)
        assert max(abs(used.top - window.top), abs(used.left - window.left),
                   abs(used.height - window.height), abs(used.width - window.width)) <= k
        for antialias in (True, False):
            out = np.empty((112, 112, 3), np.uint8)
            assert decode_into(data, fixed(window, antialias=antialias), out) == jpeg_path
            diff = np.abs(out.astype(int) - reference(data, used, (112, 112)).astype(int))
            # Within a few grey levels on average (measured: 0.4-2.6, and 4.5 where the
            # decoded window is within 3 % of the target, so the last resize only blurs); the
            # worst pixels sit on sharp edges. A one-pixel shift of the window would cost ~10.
            assert diff.mean() < 5, (window, antialias, diff.mean())
            assert np.percentile(diff, 99) < 32, (window, antialias, np.percentile(diff, 99))


def test_unscaled_crops_are_exactly_a_full_decode_cropped_and_resized(jpeg_path: str) -> None:
    data = jpeg(photo(375, 500))
    window = Window(40, 70, 300, 330)
    assert dct_reduction(window, (224, 224)) == 1
    out = np.empty((224, 224, 3), np.uint8)
    assert decode_into(data, fixed(window), out) == jpeg_path
    full = simplejpeg.decode_jpeg(data)
    expected = np.empty_like(out)
    resize_into(full[40:340, 70:400], expected)
    np.testing.assert_array_equal(out, expected)
    flipped = np.empty_like(out)
    decode_into(data, fixed(window, flip=True), flipped)
    np.testing.assert_array_equal(flipped, out[:, ::-1])


def test_dct_reduction_uses_only_the_simd_scales_and_only_at_twice_the_target() -> None:
    assert dct_reduction(Window(0, 0, 448, 448), (224, 224)) == 2
    assert dct_reduction(Window(0, 0, 447, 1000), (224, 224)) == 1
    assert dct_reduction(Window(0, 0, 895, 900), (224, 224)) == 2
    assert dct_reduction(Window(0, 0, 896, 900), (224, 224)) == 4
    assert dct_reduction(Window(0, 0, 1792, 1800), (224, 224)) == 8
    assert dct_reduction(Window(0, 0, 9000, 9000), (224, 224)) == 8
    # Edges to the nearest multiple of k, the bottom/right kept inside; then the 1/k pixels.
    assert Window(10, 21, 31, 41).on_grid(2, 100, 100) == Window(10, 22, 32, 40)
    assert Window(11, 21, 31, 41).on_grid(4, 42, 61) == Window(12, 20, 30, 41)
    assert Window(12, 20, 30, 41).divided(4) == Window(3, 5, 8, 11)  # 61 px -> 16 at 1/4
    assert Window(5, 5, 9, 9).on_grid(1, 10, 10) == Window(5, 5, 9, 9)


def test_png_and_odd_jpegs_fall_back_to_pillow_with_the_same_crop(
        monkeypatch: pytest.MonkeyPatch, jpeg_path: str) -> None:
    pixels = simplejpeg.decode_jpeg(jpeg(photo(375, 500)))
    window = Window(40, 70, 300, 330)
    want = np.empty((224, 224, 3), np.uint8)
    decode_into(jpeg(photo(375, 500)), fixed(window), want)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, "PNG")
    got = np.empty_like(want)
    assert decode_into(png.getvalue(), fixed(window), got) == "pillow"
    np.testing.assert_array_equal(got, want)  # the same pixels, losslessly stored
    cmyk = io.BytesIO()  # simplejpeg converts CMYK itself
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG", quality=95)
    decode_into(cmyk.getvalue(), fixed(window), got)
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 3

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("Unsupported JPEG process: SOF type 0xc9")  # arithmetic coding

    monkeypatch.setattr(simplejpeg, "decode_jpeg", refuse)
    monkeypatch.setattr(roi, "_jpeg_region", None)
    assert decode_into(jpeg(photo(375, 500)), fixed(window), got) == "pillow"
    assert np.abs(got.astype(int) - want.astype(int)).mean() < 1.5  # Pillow's libjpeg-turbo
    monkeypatch.undo()
    if jpeg_path == "simplejpeg":
        monkeypatch.setattr(roi, "_jpeg_region", None)
    grey = np.empty((224, 224, 1), np.uint8)
    assert decode_into(jpeg(photo(375, 500)), fixed(window), grey) == jpeg_path
    assert abs(float(grey.mean()) - float(want.mean())) < 10


def test_undecodable_records_are_named_or_skipped() -> None:
    good = jpeg(photo(120, 160))
    crops = CropOptions((32, 32), RRC, flip=0.5)
    bad = b"\xff\xd8not a jpeg at all"
    with pytest.raises(DecodeError, match="record 1"):
        ImageDecoder(threads=1, crops=crops).decode([good, bad], ["record 0", "record 1"],
                                                    ids=[0, 1])
    decoded = ImageDecoder(threads=1, crops=crops, errors="skip").decode(
        [good, bad, good], ["a", "b", "c"], ids=[0, 1, 2])
    assert decoded.ok.tolist() == [True, False, True] and decoded.images.shape == (2, 32, 32, 3)
    with pytest.raises(ValueError, match="ids"):
        ImageDecoder(threads=1, crops=crops).decode([good], ["a"])


def test_a_seed_gives_the_same_crops_in_any_batch_thread_or_run(jpeg_path: str) -> None:
    blobs = [jpeg(photo(300 + 7 * i, 420 - 5 * i)) for i in range(24)]
    ids = np.arange(100, 124)
    crops = CropOptions((64, 64), RRC, flip=0.5)
    one = ImageDecoder(threads=1, crops=crops).decode(blobs, ["x"] * 24, ids, seed=4, epoch=2)
    many = ImageDecoder(threads=3, crops=crops)
    order = np.random.default_rng(0).permutation(24)
    shuffled = many.decode([blobs[i] for i in order], ["x"] * 24, ids[order], seed=4, epoch=2)
    np.testing.assert_array_equal(shuffled.images, one.images[order])
    assert many.backend_counts == {jpeg_path: 24}
    other_epoch = many.decode(blobs, ["x"] * 24, ids, seed=4, epoch=3)
    assert not np.array_equal(other_epoch.images, one.images)
    # What each image is: its record's window and flip, resized.
    u = record_uniforms(4, 2, ids)
    for i in (0, 5, 23):
        expected = np.empty((64, 64, 3), np.uint8)
        decode_into(blobs[i], crops.plan(u[i]), expected)
        np.testing.assert_array_equal(one.images[i], expected)


@pytest.fixture
def photos(tmp_path: Path) -> str:
    """A stored dataset of 40 photo JPEGs of assorted sizes, in partitions of 8."""
    return upload_photos(tmp_path, (photo(120 + 3 * i, 200 - 2 * i) for i in range(40)))


def images_by_id(batches: object) -> dict[int, np.ndarray]:
    return {int(i): image for b in batches for i, image in zip(b["_id"], b["image"])}


def test_reader_crops_are_the_same_on_a_re_read_and_after_a_restore(photos: str) -> None:
    options = dict(source=LocalSource(storage=photos, seed=9), pipeline=PipelineOptions(
        decode=DecodeOptions(True, image_size=(48, 48), random_resized_crop=RRC,
                             random_flip=True),
        batch=BatchOptions(size=8), sampling=SamplingOptions(shuffle_buffer=16)))
    first = dist.reader("photos", **options)  # type: ignore[arg-type]
    epoch0 = images_by_id(first())
    assert len(epoch0) == 40 and first.output_spec()["image"][1] == np.uint8
    epoch1 = images_by_id(first())
    assert sum(np.array_equal(epoch0[i], epoch1[i]) for i in epoch0) < 5  # new epoch, new crops
    # Another reader (another run) of epoch 0 makes the same crops, batch order aside.
    again = images_by_id(dist.reader("photos", **options)())  # type: ignore[arg-type]
    assert all(np.array_equal(epoch0[i], again[i]) for i in epoch0)
    # A restore mid-epoch re-reads partitions: every record it yields has its epoch-0 crop.
    reader = dist.reader("photos", **options)  # type: ignore[arg-type]
    stream = iter(reader())
    seen = images_by_id([next(stream), next(stream)])
    state = reader.state_dict()
    reader.close()
    restored = images_by_id(dist.reader("photos", state=state, **options)())  # type: ignore
    assert set(seen) | set(restored) == set(range(40))
    assert all(np.array_equal(epoch0[i], image) for i, image in {**seen, **restored}.items())


def test_validation_mode_centre_crops_without_randomness(photos: str) -> None:
    pipeline = PipelineOptions(
        decode=DecodeOptions(True, image_size=(48, 48), random_resized_crop=RRC,
                             random_flip=True),
        batch=BatchOptions(size=8), mode="validation")
    val = dist.reader("photos", source=LocalSource(storage=photos), pipeline=pipeline)
    a, b = images_by_id(val()), images_by_id(val())
    assert all(np.array_equal(a[i], b[i]) for i in a)
    other_seed = images_by_id(dist.reader("photos", source=LocalSource(storage=photos, seed=1),
                                          pipeline=pipeline)())
    assert all(np.array_equal(a[i], other_seed[i]) for i in a)


def test_reader_refuses_crop_options_it_cannot_honour(photos: str) -> None:
    with pytest.raises(ValueError, match="image_size"):
        dist.reader("photos", source=LocalSource(storage=photos),
                    pipeline=PipelineOptions(decode=DecodeOptions(True, random_resized_crop=RRC)))
    with pytest.raises(ValueError, match="random_flip"):
        dist.reader("photos", source=LocalSource(storage=photos),
                    pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8),
                                                                  random_flip=True)))
    with pytest.raises(ValueError, match="crop=True"):
        dist.reader("photos", source=LocalSource(storage=photos),
                    pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8),
                                                                  crop=True, resize_shorter=10)))
    with pytest.raises(ValueError, match="scale"):
        dist.reader("photos", source=LocalSource(storage=photos),
                    pipeline=PipelineOptions(decode=DecodeOptions(
                        True, image_size=(8, 8), random_resized_crop=((0.5, 2.0), (1.0, 1.0)))))


def test_binary_views_are_the_column_values_without_copies() -> None:
    import pyarrow as pa

    from trainfeed.decode.pixels import binary_views
    values = [b"\xff\xd8abc", b"", b"xyz" * 1000, b"q"]
    column = pa.chunked_array([pa.array(values[:2], pa.binary()),
                               pa.array(values, pa.binary()).slice(2)])
    views = binary_views(column)
    assert [bytes(v) for v in views] == values[:2] + values[2:]
    assert isinstance(views[2], memoryview)
    with_null = pa.chunked_array([pa.array([b"a", None], pa.binary())])
    assert binary_views(with_null) == [b"a", None]
    jpeg_bytes = jpeg(photo(60, 80))
    view = binary_views(pa.chunked_array([pa.array([jpeg_bytes], pa.binary())]))[0]
    decoder = ImageDecoder(threads=1, crops=CropOptions((16, 16)))
    np.testing.assert_array_equal(decoder.decode([view], ["x"]).images,
                                  decoder.decode([jpeg_bytes], ["x"]).images)


def test_batches_the_trainer_holds_are_never_written_over(photos: str) -> None:
    """Crop batches are written into recycled arrays (trainfeed/io/array_pool.py): every
    batch (and every image taken out of one) that is still held keeps its pixels while the
    reader goes on, over a second epoch too."""
    reader = dist.reader("photos", source=LocalSource(storage=photos, seed=3),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(32, 32),
                                                                       random_resized_crop=RRC,
                                                                       random_flip=True),
                                                  batch=BatchOptions(size=8),
                                                  sampling=SamplingOptions(shuffle_buffer=16)))
    held, copies = [], []
    for batch in reader():
        held.append(batch["image"])
        copies.append(batch["image"].copy())
    singles = [(image, image.copy()) for image in held.pop()]  # images out of a dropped batch
    copies.pop()
    for _ in range(2):
        assert len(images_by_id(reader())) == 40
    assert len(held) == 4
    for batch, copy in zip(held, copies):
        np.testing.assert_array_equal(batch, copy)
    for image, copy in singles:
        np.testing.assert_array_equal(image, copy)


def test_the_decoder_reuses_a_batch_nobody_holds() -> None:
    blobs = [jpeg(photo(60 + i, 80)) for i in range(4)]
    decoder = ImageDecoder(threads=1, crops=CropOptions((16, 16)))
    first = decoder.decode(blobs, ["x"] * 4).images
    address = first.__array_interface__["data"][0]
    expected = first.copy()
    del first
    again = decoder.decode(blobs, ["x"] * 4).images
    assert again.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(again, expected)
