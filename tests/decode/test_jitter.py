"""Decode-stage colour jitter: torchvision's ColorJitter formulas on uint8 pixels, factors drawn
per (seed, epoch, record) in torchvision's ranges, applied on the decode threads after the crop;
crops and flips are unchanged by turning it on; validation never jitters."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from jpeg_samples import encode as jpeg
from jpeg_samples import upload_photos
from PIL import Image

from trainfeed import DecodeOptions, LocalSource, PipelineOptions, dist
from trainfeed.decode.crops import CropOptions, record_uniforms
from trainfeed.decode.jitter import color_jitter
from trainfeed.decode.pixels import ImageDecoder

RRC = ((0.08, 1.0), (3 / 4, 4 / 3))


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    from sklearn.datasets import load_sample_image
    source = Image.fromarray(load_sample_image("china.jpg" if seed % 2 else "flower.jpg"))
    return np.asarray(source.resize((width, height), Image.Resampling.BICUBIC))


def grey_of(image: np.ndarray) -> np.ndarray:
    """torchvision's rgb_to_grayscale of a uint8 image: the weighted sum, truncated to uint8."""
    weighted = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    return weighted.astype(np.uint8)


def reference(image: np.ndarray, factors: tuple[float, float, float]) -> np.ndarray:
    """torchvision's adjust_brightness, adjust_contrast, adjust_saturation on uint8 tensors
    (blend in float, clamp to [0, 255], truncate to uint8), in that order."""
    brightness, contrast, saturation = factors
    out = image.copy()

    def blend(a: np.ndarray, b: np.ndarray | float, ratio: float) -> np.ndarray:
        return np.clip(ratio * a.astype(np.float64) + (1 - ratio) * b, 0, 255).astype(np.uint8)

    out = blend(out, 0.0, brightness)
    grey = grey_of(out) if out.shape[2] == 3 else out[:, :, 0]
    out = blend(out, float(grey.mean()), contrast)
    if out.shape[2] == 3:
        out = blend(out, grey_of(out)[:, :, None].astype(np.float64), saturation)
    return out


@pytest.mark.parametrize("channels", [3, 1])
def test_the_formulas_are_torchvisions_within_a_grey_level_or_two(channels: int) -> None:
    rng = np.random.default_rng(3)
    base = photo(224, 224)
    if channels == 1:
        base = grey_of(base)[:, :, None]
    for _ in range(20):
        factors = tuple(float(f) for f in rng.uniform(0.55, 1.45, 3))
        got = base.copy()
        color_jitter(got, factors)  # type: ignore[arg-type]
        want = reference(base, factors)  # type: ignore[arg-type]
        diff = np.abs(got.astype(int) - want.astype(int))
        # Grey values and the contrast mean round in OpenCV, truncate in torchvision.
        assert diff.max() <= 2 and diff.mean() < 0.5, (factors, diff.max(), diff.mean())
        assert np.abs(got.astype(int) - base.astype(int)).mean() > 2  # it did something
    unchanged = base.copy()
    color_jitter(unchanged, (1.0, 1.0, 1.0))
    np.testing.assert_array_equal(unchanged, base)


def kolmogorov_smirnov_uniform(values: np.ndarray, lo: float, hi: float) -> float:
    """The one-sample KS statistic against uniform(lo, hi): the largest gap between the
    empirical CDF and the uniform one, on either side of each step."""
    cdf = (np.sort(values) - lo) / (hi - lo)
    n = len(cdf)
    above = np.arange(1, n + 1) / n - cdf
    below = cdf - np.arange(n) / n
    return float(max(above.max(), below.max()))


def ks_critical(n: int, alpha: float) -> float:
    """The asymptotic critical value of the KS statistic (fine for n in the thousands)."""
    return float(np.sqrt(-np.log(alpha / 2) / 2) / np.sqrt(n))


def test_ks_statistic_tells_uniform_from_skewed() -> None:
    """The helper above must be able to fail: a squared uniform is far from uniform."""
    rng = np.random.default_rng(0)
    flat = rng.uniform(0.6, 1.4, 20_000)
    assert kolmogorov_smirnov_uniform(flat, 0.6, 1.4) < ks_critical(20_000, 1e-3)
    skewed = 0.6 + 0.8 * rng.uniform(0, 1, 20_000) ** 2
    assert kolmogorov_smirnov_uniform(skewed, 0.6, 1.4) > ks_critical(20_000, 1e-3)


def test_factors_are_uniform_in_torchvisions_ranges_and_reproducible() -> None:
    options = CropOptions((8, 8), RRC, color_jitter=(0.4, 0.25, 0.0))
    u = record_uniforms(11, 2, np.arange(20_000))
    factors = np.array([options.jitter_factors(row) for row in u])
    for column, (lo, hi) in ((0, (0.6, 1.4)), (1, (0.75, 1.25))):
        values = factors[:, column]
        assert lo <= values.min() and values.max() <= hi
        assert kolmogorov_smirnov_uniform(values, lo, hi) < ks_critical(len(values), alpha=1e-3)
    assert (factors[:, 2] == 1.0).all()  # saturation 0: off
    again = CropOptions((8, 8), RRC, color_jitter=(0.4, 0.25, 0.0))
    assert again.jitter_factors(record_uniforms(11, 2, [7])[0]) == tuple(factors[7])
    assert CropOptions((8, 8), RRC, color_jitter=(1.5, 0, 0)).jitter_factors(u[0])[0] >= 0.0
    assert CropOptions((8, 8), RRC).jitter_factors(u[0]) is None
    with pytest.raises(ValueError, match="color_jitter"):
        CropOptions((8, 8), RRC, color_jitter=(0.4, -0.1, 0.0))


def test_decoded_batches_are_the_crops_jittered_and_the_crops_do_not_change() -> None:
    blobs = [jpeg(photo(300 + 5 * i, 400 - 3 * i, i)) for i in range(16)]
    ids = np.arange(500, 516)
    plain = CropOptions((64, 64), RRC, flip=0.5)
    jittered = CropOptions((64, 64), RRC, flip=0.5, color_jitter=(0.4, 0.4, 0.4))
    crops = ImageDecoder(threads=2, crops=plain).decode(blobs, ["x"] * 16, ids, seed=5, epoch=1)
    both = ImageDecoder(threads=2, crops=jittered).decode(blobs, ["x"] * 16, ids, seed=5,
                                                          epoch=1)
    u = record_uniforms(5, 1, ids)
    for i in range(16):
        assert plain.plan(u[i]).flip == jittered.plan(u[i]).flip  # the same flips
        want = crops.images[i].copy()
        factors = jittered.jitter_factors(u[i])
        assert factors is not None
        color_jitter(want, factors)
        np.testing.assert_array_equal(both.images[i], want)  # the same crops, then jittered
    assert not np.array_equal(both.images, crops.images)


@pytest.fixture
def photos(tmp_path: Path) -> str:
    return upload_photos(tmp_path, (photo(120 + 3 * i, 160, i) for i in range(24)))


def read_all(storage: str, mode: str, **options: object) -> dict[int, np.ndarray]:
    with dist.reader("photos", source=LocalSource(storage=storage, seed=3),
                     pipeline=PipelineOptions.from_keywords(
                         decode=True, image_size=(32, 32), random_resized_crop=RRC,
                         batch_size=8, mode=mode, **options)) as reader:
        return {int(i): image for batch in reader() for i, image in
                zip(batch["_id"], batch["image"])}


def test_the_reader_jitters_in_training_only(photos: str) -> None:
    jitter = (0.4, 0.4, 0.4)
    trained = read_all(photos, "train", color_jitter=jitter)
    plain = read_all(photos, "train")
    assert trained.keys() == plain.keys() and len(trained) == 24
    assert sum(not np.array_equal(trained[i], plain[i]) for i in trained) >= 20
    assert read_all(photos, "train", color_jitter=jitter).keys() == trained.keys()
    again = read_all(photos, "train", color_jitter=jitter)
    assert all(np.array_equal(again[i], trained[i]) for i in trained)  # seeded
    validated = read_all(photos, "validation", color_jitter=jitter)
    unjittered = read_all(photos, "validation")
    assert all(np.array_equal(validated[i], unjittered[i]) for i in validated)
    with pytest.raises(ValueError, match="color_jitter"):
        dist.reader("photos", source=LocalSource(storage=photos),
                    pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(32, 32),
                                                                  color_jitter=jitter)))
