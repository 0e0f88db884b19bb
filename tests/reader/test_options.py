"""Option groups: passed whole or as keyword shortcuts, validated with clear errors."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from sample_data import make_image_list

import trainfeed
from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    SamplingOptions,
    SyncOptions,
    dist,
)
from trainfeed.errors import InvalidNameError
from trainfeed.reader.options import GROUPS, KEYWORDS, keyword_defaults
from trainfeed.upload import UploadOptions, upload


def test_every_group_field_has_one_keyword_and_the_shortcuts_build_the_same_options() -> None:
    fields = sum(len(dataclasses.fields(kind)) for kind in GROUPS.values()) + 1  # + mode
    assert len(KEYWORDS) == fields
    assert keyword_defaults()["prefetch_batches"] == 2
    whole = PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8)),
                            sampling=SamplingOptions(shuffle_buffer=10),
                            batch=BatchOptions(size=4), mode="train")
    assert PipelineOptions.from_keywords(decode=True, image_size=[8, 8], shuffle_buffer=10,
                                         batch_size=4) == whole
    # Shortcuts apply on top of a held value.
    tweaked = PipelineOptions.from_keywords(whole, batch_size=32)
    assert tweaked.batch.size == 32 and tweaked.decode == whole.decode
    assert whole.shuffles and not PipelineOptions().active


def test_the_package_face_exports_the_groups_sorted() -> None:
    assert trainfeed.__all__ == sorted(trainfeed.__all__)
    for name in ("PipelineOptions", "DecodeOptions", "LabelOptions", "SamplingOptions",
                 "BatchOptions", "TransformOptions"):
        assert name in trainfeed.__all__ and hasattr(trainfeed, name)


@pytest.mark.parametrize("make,message", [
    (lambda: DecodeOptions(image_size=(8, 8)), "pass decode=True"),
    (lambda: DecodeOptions(True, image_size=(8,)), r"image_size must be \(height, width\)"),
    (lambda: DecodeOptions(True, random_flip=True), "random_flip is a decode-stage option"),
    (lambda: DecodeOptions(True, crop=True, image_size=(8, 8),
                           random_resized_crop=((0.1, 1), (1, 1))), "crop=True and"),
])
def test_groups_check_options_that_go_together(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


# Every reader option by type and range (issue 26: batch_size="32" was a "'<' not supported"
# from inside the first pass, 32.0 failed only there): (option, bad value, error, message). A
# value of the wrong type is a TypeError, one out of range or not among the choices a ValueError;
# each names the option and the value. Pipeline options are set with decode=True and an
# image_size where they need them.
BAD_OPTIONS: list[tuple[str, object, type, str]] = [
    ("decode", 1, TypeError, r"decode must be True or False, got 1 \(int\)"),
    ("decode", "yes", TypeError, r"decode must be True or False, got 'yes' \(str\)"),
    ("image_size", (8, 8.0), TypeError, r"image_size width must be an int ≥ 1, got 8.0"),
    ("image_size", (0, 8), ValueError, r"image_size height must be an int ≥ 1, got 0"),
    ("image_size", "8x8", ValueError, r"image_size must be \(height, width\)"),
    ("image_size", (True, 8), TypeError, r"image_size height must be an int ≥ 1, got True"),
    ("crop", "no", TypeError, r"crop must be True or False, got 'no'"),
    ("channels", 4, ValueError, r"channels is 4 \(int\), expected one of \[3, 1\]"),
    ("channels", 3.0, TypeError, r"channels must be an int ≥ 1, got 3.0 \(float\)"),
    ("normalizing_const", 0, ValueError, r"normalizing_const must be a number > 0"),
    ("normalizing_const", -255.0, ValueError, r"normalizing_const must be a number > 0.*-255"),
    ("normalizing_const", float("nan"), ValueError, r"normalizing_const must be a number > 0"),
    ("normalizing_const", "255", TypeError, r"normalizing_const must be a number > 0.*'255'"),
    ("decode_errors", "ignore", ValueError,
     r"decode_errors is 'ignore' \(str\), expected one of \['raise', 'skip'\]"),
    ("decode_threads", 0, ValueError, r"decode_threads must be an int ≥ 1 or None .*got 0"),
    ("decode_threads", "4", TypeError, r"decode_threads must be an int ≥ 1 or None"),
    ("random_resized_crop", ((0.08, 1.0),), ValueError, r"random_resized_crop must be"),
    ("random_resized_crop", (("a", 1.0), (0.75, 1.33)), TypeError, r"random_resized_crop must be"),
    ("random_resized_crop", ((0.0, 1.0), (0.75, 1.33)), ValueError, r"scale must satisfy 0 <"),
    ("random_flip", 0.5, TypeError, r"random_flip must be True or False, got 0.5"),
    ("resize_shorter", 0, ValueError, r"resize_shorter must be an int ≥ 1"),
    ("resize_shorter", 256.0, TypeError, r"resize_shorter must be an int ≥ 1.*256.0"),
    ("color_jitter", (0.4, 0.4), ValueError, r"color_jitter must be \(brightness, contrast"),
    ("color_jitter", (0.4, -0.1, 0.4), ValueError, r"color_jitter contrast must be a number ≥ 0"),
    ("one_hot", "true", TypeError, r"one_hot must be True or False, got 'true'"),
    ("class_values", "cat", TypeError, r"class_values must be a sequence of labels"),
    ("class_values", ["cat", None], TypeError, r"class_values\[1\] must be a label"),
    ("class_values", ["cat", "dog", "cat"], ValueError, r"class_values\[2\] is 'cat' again"),
    ("class_values", [], ValueError, r"class_values is empty"),
    ("class_weights", "balanced", ValueError,
     r"class_weights is 'balanced' \(str\), expected one of \['uniform'\]"),
    ("class_weights", {"cat": -1}, ValueError, r"class_weights\['cat'\] must be a weight ≥ 0"),
    ("class_weights", [1, 2], TypeError, r"class_weights must be \"uniform\", a dict"),
    ("shuffle_buffer", -1, ValueError, r"shuffle_buffer must be an int ≥ 0, got -1"),
    ("shuffle_buffer", 1e3, TypeError, r"shuffle_buffer must be an int ≥ 0, got 1000.0"),
    ("resample", "flat", ValueError, r"resample is 'flat' \(str\), expected one of"),
    ("resample", float("inf"), ValueError, r"resample must be \"uniform\", a dict"),
    ("resample", {"cat": "1"}, TypeError, r"resample\['cat'\] must be a weight ≥ 0"),
    ("batch_size", "32", TypeError, r"batch_size must be an int ≥ 1 or None .*got '32' \(str\)"),
    ("batch_size", 32.0, TypeError, r"batch_size must be an int ≥ 1 or None .*got 32.0 \(float\)"),
    ("batch_size", 0, ValueError, r"batch_size must be an int ≥ 1 or None .*got 0"),
    ("batch_size", True, TypeError, r"batch_size must be an int ≥ 1.*got True \(bool\)"),
    ("prefetch_batches", 0, ValueError, r"prefetch_batches must be an int ≥ 1, got 0"),
    ("prefetch_batches", "2", TypeError, r"prefetch_batches must be an int ≥ 1, got '2'"),
    ("transform", 3, TypeError, r"transform must be the name of a saved transformer.*got int"),
    ("augment", "trainfeed.augment:random_flip", TypeError, r"augment must be a sequence"),
    ("augment", [3], TypeError, r"augment\[0\] must be \"module:function\""),
    ("augment", [("m:f", 1)], TypeError, r"augment\[0\] must be"),
    ("mode", "predict", ValueError,
     r"mode is 'predict' \(str\), expected one of \['train', 'validation', 'score'\]"),
    ("mode", None, ValueError, r"mode is None \(NoneType\), expected one of"),
]
# What some options need beside them to be checked at all.
NEEDS: dict[str, dict[str, object]] = {
    "image_size": {"decode": True}, "crop": {"decode": True},
    "normalizing_const": {"decode": True},
    **{k: {"decode": True, "image_size": (8, 8)} for k in (
        "random_resized_crop", "resize_shorter", "color_jitter")},
    "random_flip": {"decode": True, "image_size": (8, 8), "resize_shorter": 10},
}


def test_the_table_covers_every_option() -> None:
    assert {option for option, *_ in BAD_OPTIONS} == set(KEYWORDS)


@pytest.mark.parametrize("option,value,error,message", BAD_OPTIONS,
                         ids=[f"{o}={v!r}" for o, v, _, _ in BAD_OPTIONS])
def test_every_option_is_checked_by_type_and_range_when_it_is_built(
        option: str, value: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):  # nothing read: the dataset does not even exist
        dist.reader("nowhere", source=LocalSource("/nonexistent"),
                    pipeline=PipelineOptions.from_keywords(**{**NEEDS.get(option, {}),
                                                              option: value}))


# Every field of the source and sync values, and every dist.reader parameter: (what, the call
# that builds it wrong, error, message). Each message names the value's type and field.
BAD_VALUES: list[tuple[str, Callable[[], object], type, str]] = [
    ("LocalSource.storage", lambda: LocalSource(storage=3), TypeError,
     r"LocalSource.storage must be a string or None \(\$TRAINFEED_STORAGE, else "
     r"./trainfeed-data\), got 3 \(int\)"),
    ("LocalSource.seed", lambda: LocalSource(seed=-1), ValueError,
     r"LocalSource.seed must be an int ≥ 0, got -1"),
    ("LocalSource.seed", lambda: LocalSource(seed="7"), TypeError,
     r"LocalSource.seed must be an int ≥ 0, got '7' \(str\)"),
    ("LocalSource.prefetch_partitions", lambda: LocalSource(prefetch_partitions=0), ValueError,
     r"LocalSource.prefetch_partitions must be an int ≥ 1 or None .*got 0"),
    ("MasterSource.address", lambda: MasterSource(("host", 1)), TypeError,
     r"MasterSource.address must be a string or None \(\$TRAINFEED_MASTER\)"),
    ("MasterSource.job", lambda: MasterSource(job=3), TypeError,
     r"MasterSource.job must be a string or None"),
    ("MasterSource.seed", lambda: MasterSource(seed=1.5), TypeError,
     r"MasterSource.seed must be an int ≥ 0, got 1.5 \(float\)"),
    ("MasterSource.prefetch_partitions", lambda: MasterSource(prefetch_partitions=2.0),
     TypeError, r"MasterSource.prefetch_partitions must be an int ≥ 1"),
    ("MasterSource.distribution_rules", lambda: MasterSource(distribution_rules=["gpu"]),
     TypeError, r"MasterSource.distribution_rules must be a string or None"),
    ("MasterSource.job", lambda: MasterSource(job="a/b"), InvalidNameError,
     r"invalid job name 'a/b': use 1-128 letters"),
    ("MasterSource.distribution_rules", lambda: MasterSource(distribution_rules="gpu,"),
     ValueError, r"invalid distribution rules"),
    ("MasterSource.lost_partitions", lambda: MasterSource(lost_partitions="ignore"), ValueError,
     r"MasterSource.lost_partitions is 'ignore' \(str\), expected one of \['raise', 'skip'\]"),
    ("SyncOptions.world_size", lambda: SyncOptions(world_size=0, rank=0), ValueError,
     r"SyncOptions.world_size must be an int ≥ 1 or None .*got 0"),
    ("SyncOptions.rank", lambda: SyncOptions(world_size=2, rank="0"), TypeError,
     r"SyncOptions.rank must be an int ≥ 0 or None .*got '0' \(str\)"),
    ("SyncOptions.rank", lambda: SyncOptions(world_size=2, rank=2), ValueError,
     r"SyncOptions.rank must be < world_size \(2\), got 2"),
    ("SyncOptions.world_size", lambda: SyncOptions(world_size=2), ValueError,
     r"SyncOptions: pass world_size and rank together .*got world_size=2, rank=None"),
    ("source", lambda: dist.reader("x", source="local"), TypeError,  # type: ignore[arg-type]
     r"source must be a LocalSource\(...\), a MasterSource\(...\) or None .*got str"),
    ("pipeline", lambda: dist.reader("x", pipeline={}), TypeError,  # type: ignore[arg-type]
     r"pipeline must be a PipelineOptions\(...\) or None \(raw records\), got dict"),
    ("sync", lambda: dist.reader("x", sync=1), TypeError,  # type: ignore[arg-type]
     r"sync must be a SyncOptions\(world_size, rank\) or None, got int"),
    ("state", lambda: dist.reader("x", state="{}"), TypeError,  # type: ignore[arg-type]
     r"state must be a reader.state_dict\(\) .*got str"),
]


def test_the_value_table_covers_every_field_and_parameter() -> None:
    fields = {f"{kind.__name__}.{f.name}" for kind in (LocalSource, MasterSource, SyncOptions)
              for f in dataclasses.fields(kind)}
    assert {what for what, *_ in BAD_VALUES} == fields | {"source", "pipeline", "sync", "state"}


@pytest.mark.parametrize("what,make,error,message", BAD_VALUES,
                         ids=[f"{w}-{i}" for i, (w, *_) in enumerate(BAD_VALUES)])
def test_every_source_and_sync_field_is_checked_naming_the_field_and_value(
        what: str, make: Callable[[], object], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_good_values_of_each_kind_pass_and_are_normalized() -> None:
    options = PipelineOptions.from_keywords(
        decode=True, image_size=[np.int64(8), 8], random_resized_crop=([0.5, 1], [1, 1]),
        color_jitter=[0.4, 0, 1], batch_size=np.int32(4), class_values=["b", 2, "a"],
        augment=[("trainfeed.augment:random_flip", {})], resample={"a": 1, "b": 0.5})
    assert options.decode.image_size == (8, 8) and type(options.decode.image_size[0]) is int
    assert options.decode.random_resized_crop == ((0.5, 1.0), (1.0, 1.0))
    assert options.decode.color_jitter == (0.4, 0, 1)
    assert options.labels.class_values == ("b", "2", "a")  # the given order: ids 0, 1, 2
    assert type(options.batch.size) is int  # JSON-able, as numpy's ints are not
    assert DecodeOptions(True, channels=np.int64(1)).channels == 1  # type: ignore[arg-type]
    assert type(LocalSource(seed=np.uint32(3)).seed) is int  # type: ignore[arg-type]
    assert MasterSource(prefetch_partitions=np.int64(2)).prefetch_partitions == 2  # type: ignore[arg-type]
    sync = SyncOptions(np.int64(4), np.int32(1))  # type: ignore[arg-type]
    assert (type(sync.world_size), type(sync.rank)) == (int, int)


def test_unknown_keywords_and_wrong_group_types_are_named() -> None:
    with pytest.raises(TypeError, match="unknown reader option 'batchsize'; did you mean "
                                        "'batch_size'"):
        dist.reader("x", source=LocalSource(), batchsize=4)
    with pytest.raises(TypeError, match="PipelineOptions.batch must be a BatchOptions"):
        PipelineOptions(batch=4)  # type: ignore[arg-type]


def test_dist_reader_takes_held_options_and_refuses_the_retired_prefetch(tmp_path) -> None:
    source = make_image_list(tmp_path / "source", 20)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    options = PipelineOptions(decode=DecodeOptions(True, image_size=(4, 4)),
                              batch=BatchOptions(size=5))
    reader = dist.reader("flowers", source=LocalSource(storage=storage, prefetch_partitions=2),
                         pipeline=options)
    assert reader.options == options
    ids = np.concatenate([b["_id"] for b in reader()])
    assert sorted(ids.tolist()) == list(range(20))
    with pytest.raises(TypeError, match=r"dist.reader\(prefetch=...\) was retired: it is the "
                                        r"source's prefetch_partitions"):
        dist.reader("flowers", source=LocalSource(storage=storage), prefetch=2)
    with pytest.raises(ValueError, match="prefetch_partitions must be an int ≥ 1"):
        dist.reader("flowers", source=LocalSource(storage=storage, prefetch_partitions=0))


def test_a_master_source_is_checked_once_and_goes_down_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of a MasterSource's options is checked where the source is built, once (issue 36:
    the job name and the distribution rules were checked again by dist.reader, the lost
    partitions policy by the backend), and the reader's backend takes the source whole. A job
    named by $TRAINFEED_JOB is checked as a given one, when the reader is built."""
    from trainfeed.planning import distribution
    from trainfeed.reader import sources

    monkeypatch.setenv("TRAINFEED_JOB", "bad/job")
    with pytest.raises(InvalidNameError, match="invalid job name 'bad/job'"):
        dist.reader("flowers", source=MasterSource("127.0.0.1:1"))
    parsed: list[str] = []
    parse = distribution.DistributionRules.parse.__func__  # type: ignore[attr-defined]

    def counted(cls: type, text: str) -> object:
        parsed.append(text)
        return parse(cls, text)
    monkeypatch.setattr(distribution.DistributionRules, "parse", classmethod(counted))
    named: list[str] = []
    monkeypatch.setattr(sources, "validate_job_name",
                        lambda name: named.append(name) or name)
    source = MasterSource("127.0.0.1:1", "train", distribution_rules="gpu",
                          lost_partitions="skip")
    reader = dist.reader("flowers", source=source)
    try:
        backend = reader._backend  # (connects nothing: the session opens on the first pass)
        assert backend.session.join.job == "train"
        assert backend.session.join.distribution_rules == "gpu"
        assert backend.lost_policy == "skip"
    finally:
        reader.close()
    assert parsed == ["gpu"] and named == ["train"]
