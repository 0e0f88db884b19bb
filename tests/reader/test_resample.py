"""Class rebalancing: target distributions, ratio factors and per-record copy counts.

The end-to-end frequency test (4σ over real reads) lives in tests/reader/test_pipeline.py; these
pin what it cannot see: which target gives which factors, that every record flips its own coin,
and that the coins come from (seed, epoch, partition) alone.

Equivalent mutants (mutmut, tools/mutation.py), left alive on purpose:
- `Resampler.copies`: `random() < frac` → `random() <= frac`: differs only when a draw equals
  the fraction exactly (probability 2^-53 per record).
- `Resampler.__init__`: `np.asarray(factors, dtype=np.float64)` → `np.asarray(factors)` (two
  mutants): integer or boolean factors then stay integers, and floor, subtraction and the
  comparison with float draws give the same counts.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from trainfeed.errors import ConfigurationError
from trainfeed.reader.resample import Resampler, ratio_factors, target_distribution


def test_uniform_over_and_under_samples_and_keeps_the_epoch_size() -> None:
    source = {"a": 1, "b": 3}
    assert target_distribution(source, "uniform") == {"a": 0.5, "b": 0.5}
    factors = ratio_factors(source, "uniform")
    assert factors == pytest.approx({"a": 2.0, "b": 2 / 3})
    assert sum(source[c] * factors[c] for c in source) == pytest.approx(4)  # same expected size


def test_uniform_leaves_out_a_class_without_records() -> None:
    # Half of B on an empty class would halve every epoch instead of rebalancing it.
    source = {"a": 1, "b": 3, "empty": 0}
    assert target_distribution(source, "uniform") == {"a": 0.5, "b": 0.5, "empty": 0.0}
    assert ratio_factors(source, "uniform") == pytest.approx({"a": 2.0, "b": 2 / 3, "empty": 0})


def test_a_dict_target_is_normalized_and_drops_the_classes_it_leaves_out() -> None:
    source = {"a": 2, "b": 2, "c": 4}
    assert target_distribution(source, {"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75, "c": 0.0}
    factors = ratio_factors(source, {"a": 1, "b": 3})
    assert factors == {"a": 1.0, "b": 3.0, "c": 0.0}
    resampler = Resampler(np.array([factors[c] for c in "abc"]), seed=0)
    copies = resampler.copies(np.array([2] * 100 + [0] * 10 + [1] * 10), epoch=0, partition=0)
    assert (copies[:100] == 0).all()  # c: never emitted
    assert (copies[100:110] == 1).all() and (copies[110:] == 3).all()
    # A class given weight 0 explicitly is dropped the same way.
    assert target_distribution(source, {"a": 1, "b": 1, "c": 0}) == {"a": 0.5, "b": 0.5,
                                                                     "c": 0.0}


def test_a_power_target_interpolates_between_the_source_and_uniform() -> None:
    source = {"a": 1, "b": 4, "empty": 0}
    assert target_distribution(source, 1) == {"a": 0.2, "b": 0.8, "empty": 0.0}  # unchanged
    assert target_distribution(source, 0) == {"a": 0.5, "b": 0.5, "empty": 0.0}  # uniform
    assert target_distribution(source, 0.5) == pytest.approx(  # sqrt(1) : sqrt(4) = 1 : 2
        {"a": 1 / 3, "b": 2 / 3, "empty": 0.0})
    assert target_distribution(source, -1.0) == pytest.approx(  # past uniform: 1 : 1/4
        {"a": 0.8, "b": 0.2, "empty": 0.0})
    assert ratio_factors(source, 0.5) == pytest.approx({"a": 5 / 3, "b": 5 / 6, "empty": 0.0})
    assert ratio_factors(source, 1.0) == pytest.approx({"a": 1.0, "b": 1.0, "empty": 0.0})


def test_a_class_with_a_single_record() -> None:
    source = {"rare": 1, "common": 7}
    factors = ratio_factors(source, "uniform")
    assert factors == {"rare": 4.0, "common": 4 / 7}
    resampler = Resampler(np.array([factors["common"], factors["rare"]]), seed=3)
    ids = np.array([0] * 7 + [1])  # ids follow the sorted class values: common 0, rare 1
    for epoch in range(20):
        copies = resampler.copies(ids, epoch, partition=0)
        assert copies[-1] == 4  # an integer factor: exactly that many copies, no coin
        assert set(copies[:-1].tolist()) <= {0, 1}


@pytest.mark.parametrize("target, message", [
    ({"a": 1, "zebra": 1, "yak": 2}, r"names classes \['yak', 'zebra'\] that the dataset does "
                                     r"not have \(classes: \['a', 'b', 'none'\]\)"),
    ({"a": 1, "b": -0.5}, r"weight of class 'b' is -0.5: weights must be finite numbers ≥ 0"),
    ({"a": math.nan}, r"weight of class 'a' is nan"),
    ({"a": math.inf}, r"weight of class 'a' is inf"),
    ({"a": "2"}, r"weight of class 'a' is '2'"),
    ({"a": 0, "b": 0}, r"^resample target gives every class weight 0$"),
    ({"a": 1, "none": 1}, r"gives class 'none' weight 1, but the dataset has no record of it"),
    ("balanced", r"resample target 'balanced': expected 'uniform', a dict"),
    (math.nan, r"resample target power nan: expected a finite number"),
    (math.inf, r"resample target power inf"),
])
def test_bad_targets_are_refused_naming_the_class_or_value(target: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as e:
        ratio_factors({"a": 3, "b": 1, "none": 0}, target)  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError)


def test_a_zero_weight_for_a_class_without_records_is_fine() -> None:
    assert ratio_factors({"a": 2, "none": 0}, {"a": 1, "none": 0}) == {"a": 1.0, "none": 0.0}


def test_a_histogram_of_one_record() -> None:
    assert target_distribution({"a": 1}, "uniform") == {"a": 1.0}
    assert ratio_factors({"a": 1, "b": 0}, "uniform") == {"a": 1.0, "b": 0.0}


def test_long_lists_in_errors_are_cut() -> None:
    classes = {f"c{i:02d}": 1 for i in range(12)}
    unknown = {f"x{i}": 1.0 for i in range(7)}
    with pytest.raises(ConfigurationError) as e:
        target_distribution(classes, unknown)
    assert str(e.value) == (
        "resample target names classes ['x0', 'x1', 'x2', 'x3', 'x4'] that the dataset does not "
        "have (classes: ['c00', 'c01', 'c02', 'c03', 'c04', 'c05', 'c06', 'c07', 'c08', "
        "'c09'])")
    with pytest.raises(ValueError) as e:
        Resampler(np.array([1.0] * 11 + [-1.0]), seed=0)
    assert str(e.value).endswith("got [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]")


@pytest.mark.parametrize("source, message", [
    ({}, "^resampling needs a label histogram with at least one record$"),
    ({"a": 0, "b": 0}, "at least one record"),
    ({"a": 5, "b": -1}, r"^label histogram: class 'b' has a negative count -1$"),
])
def test_bad_histograms_are_refused(source: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        target_distribution(source, "uniform")


def test_copies_depend_on_seed_epoch_and_partition_alone() -> None:
    """A re-leased partition (another worker, after a crash) makes the same decisions; another
    epoch, partition or seed makes other ones. An unseeded generator fails the first check."""
    ids = np.zeros(2000, np.int64)
    first = Resampler(np.array([0.5]), seed=11).copies(ids, epoch=2, partition=5)
    again = Resampler(np.array([0.5]), seed=11).copies(ids, epoch=2, partition=5)
    assert np.array_equal(first, again)
    others = [Resampler(np.array([0.5]), seed=11).copies(ids, epoch=3, partition=5),
              Resampler(np.array([0.5]), seed=11).copies(ids, epoch=2, partition=6),
              Resampler(np.array([0.5]), seed=12).copies(ids, epoch=2, partition=5)]
    for other in others:
        assert not np.array_equal(first, other)
    # Two of the three coordinates swapped is another stream too (the tuple is ordered).
    swapped = Resampler(np.array([0.5]), seed=11).copies(ids, epoch=5, partition=2)
    assert not np.array_equal(first, swapped)


def test_golden_copies() -> None:
    # Pins numpy's PCG64 draws for (seed, stream, epoch, partition): a change here changes which
    # records every resampled job emits after an upgrade. Update only on purpose, with a note in
    # the changelog.
    resampler = Resampler(np.array([0.5, 1.25, 0.0, 2.0]), seed=7)
    copies = resampler.copies(np.array([0, 1, 2, 3] * 6), epoch=1, partition=3)
    assert copies.dtype == np.int64
    assert copies.tolist() == [0, 2, 0, 2, 0, 1, 0, 2, 0, 2, 0, 2,
                               0, 2, 0, 2, 0, 1, 0, 2, 1, 1, 0, 2]


def test_each_record_flips_its_own_coin() -> None:
    """One flip per partition would emit all or none of a class's records in a partition; the
    4σ test over whole epochs cannot tell, the spread within one partition can."""
    ids = np.zeros(1000, np.int64)
    resampler = Resampler(np.array([0.5, 2.25]), seed=0)
    kept = resampler.copies(ids, epoch=0, partition=0)
    assert set(kept.tolist()) == {0, 1}
    assert 400 <= kept.sum() <= 600  # Binomial(1000, 0.5): σ ≈ 16
    over = resampler.copies(ids + 1, epoch=0, partition=1)
    assert set(over.tolist()) == {2, 3}
    assert 150 <= (over == 3).sum() <= 350  # Binomial(1000, 0.25): σ ≈ 14


def test_copy_counts_average_to_the_factor() -> None:
    factors = np.array([0.3, 1.7, 3.0])
    resampler = Resampler(factors, seed=5)
    n, partitions = 1000, 40
    for k, p in enumerate(factors):
        copies = np.concatenate([resampler.copies(np.full(n, k), epoch=0, partition=i)
                                 for i in range(partitions)])
        frac = p - math.floor(p)
        sigma = math.sqrt(frac * (1 - frac) / (n * partitions))
        assert abs(copies.mean() - p) <= 4 * sigma + 1e-12, (p, copies.mean())
        assert copies.min() >= math.floor(p) and copies.max() <= math.ceil(p)


def test_an_empty_partition_and_zero_factors() -> None:
    resampler = Resampler(np.array([0.0, 1.0]), seed=0)
    assert resampler.copies(np.array([], np.int64), 0, 0).tolist() == []
    assert resampler.copies([], 0, 0).tolist() == []  # type: ignore[arg-type]
    assert resampler.copies(np.array([0, 1, 0, 1]), 0, 0).tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("factors", [[0.5, -0.1], [math.nan], [math.inf, 1.0], [[1.0, 2.0]]])
def test_bad_factors_are_refused(factors: list[float]) -> None:
    with pytest.raises(ValueError, match="finite numbers ≥ 0"):
        Resampler(np.array(factors), seed=0)


@pytest.mark.parametrize("bad", [-1, 2])
def test_a_class_id_outside_the_factors_is_an_error_not_a_wraparound(bad: int) -> None:
    resampler = Resampler(np.array([1.0, 2.0]), seed=0)
    with pytest.raises(ValueError, match=rf"class id {bad} of partition 4 is not one of the 2 "
                                         r"classes \[0, 2\)"):
        resampler.copies(np.array([0, 1, bad, 0]), epoch=0, partition=4)
