"""Option groups: passed whole or as keyword shortcuts, validated with clear errors."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sample_data import make_image_list

import trainfeed
from trainfeed import BatchOptions, DecodeOptions, PipelineOptions, SamplingOptions, dist
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
    (lambda: DecodeOptions(True, channels=4), "channels must be 3"),
    (lambda: DecodeOptions(True, errors="ignore"), "decode_errors must be one of"),
    (lambda: BatchOptions(size=0), "batch_size must be ≥ 1"),
    (lambda: BatchOptions(prefetch=0), "prefetch_batches must be ≥ 1"),
    (lambda: SamplingOptions(shuffle_buffer=-1), "shuffle_buffer must be ≥ 0"),
    (lambda: PipelineOptions(mode="predict"), "mode must be one of"),
])
def test_groups_validate_themselves(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_unknown_keywords_and_wrong_group_types_are_named() -> None:
    with pytest.raises(TypeError, match="unknown reader option 'batchsize'; did you mean "
                                        "'batch_size'"):
        dist.reader("x", local=True, batchsize=4)
    with pytest.raises(TypeError, match="PipelineOptions.batch must be a BatchOptions"):
        PipelineOptions(batch=4)  # type: ignore[arg-type]


def test_dist_reader_takes_held_options_and_the_renamed_prefetch(tmp_path) -> None:
    source = make_image_list(tmp_path / "source", 20)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    options = PipelineOptions(decode=DecodeOptions(True, image_size=(4, 4)),
                              batch=BatchOptions(size=5))
    reader = dist.reader("flowers", local=True, storage=storage, pipeline=options,
                         prefetch_partitions=2)
    assert reader.options == options
    ids = np.concatenate([b["_id"] for b in reader()])
    assert sorted(ids.tolist()) == list(range(20))
    with pytest.warns(DeprecationWarning, match="prefetch_partitions"):
        old = dist.reader("flowers", local=True, storage=storage, prefetch=2)
    assert sum(1 for _ in old()) == 20
    with pytest.raises(ValueError, match="prefetch_partitions must be ≥ 1"):
        dist.reader("flowers", local=True, storage=storage, prefetch_partitions=0)
