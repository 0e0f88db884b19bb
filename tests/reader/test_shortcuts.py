"""The keyword spellings of earlier releases (trainfeed.reader.shortcuts): each still builds the
same reader for one release, with one DeprecationWarning that prints the grouped spelling; and the
grouped spelling itself reads a whole epoch, checkpoints and resumes without any warning."""
from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_data import make_image_list

import trainfeed
from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LabelOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    SamplingOptions,
    SyncOptions,
    dist,
)
from trainfeed.reader.options import KEYWORDS
from trainfeed.reader.shortcuts import SOURCE_KEYWORDS, SYNC_KEYWORDS
from trainfeed.upload import UploadOptions, upload

NOWHERE = LocalSource("/nonexistent")  # nothing is read: the dataset does not even exist
ENVIRONMENT = ("; leave source= out to let the environment choose, with the default seed and "
               "prefetch)")

# (case, the keywords passed, the warning's whole text). Pipeline keywords are passed
# beside source=NOWHERE, so that no environment decides anything.
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("decode", {"decode": True},
     "dist.reader(decode=True) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True))"),
    ("image_size", {"decode": True, "image_size": (8, 8)},
     "dist.reader(decode=True, image_size=(8, 8)) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, image_size=(8, 8)))"),
    ("crop", {"decode": True, "image_size": (8, 8), "crop": True},
     "dist.reader(decode=True, image_size=(8, 8), crop=True) is deprecated: use pipeline="
     "PipelineOptions(decode=DecodeOptions(enabled=True, image_size=(8, 8), crop=True))"),
    ("channels", {"decode": True, "channels": 1},
     "dist.reader(decode=True, channels=1) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, channels=1))"),
    ("normalizing_const", {"decode": True, "normalizing_const": 255.0},
     "dist.reader(decode=True, normalizing_const=255.0) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, normalizing_const=255.0))"),
    ("decode_errors", {"decode": True, "decode_errors": "skip"},
     "dist.reader(decode=True, decode_errors='skip') is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, errors='skip'))"),
    ("decode_threads", {"decode": True, "decode_threads": 2},
     "dist.reader(decode=True, decode_threads=2) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, threads=2))"),
    ("random_resized_crop", {"decode": True, "image_size": (8, 8),
                             "random_resized_crop": ((0.08, 1.0), (0.75, 1.25))},
     "dist.reader(decode=True, image_size=(8, 8), random_resized_crop=((0.08, 1.0), (0.75, "
     "1.25))) is deprecated: use pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, "
     "image_size=(8, 8), random_resized_crop=((0.08, 1.0), (0.75, 1.25))))"),
    ("random_flip", {"decode": True, "image_size": (8, 8), "resize_shorter": 10,
                     "random_flip": True},
     "dist.reader(decode=True, image_size=(8, 8), resize_shorter=10, random_flip=True) is "
     "deprecated: use pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, "
     "image_size=(8, 8), resize_shorter=10, random_flip=True))"),
    ("resize_shorter", {"decode": True, "image_size": (8, 8), "resize_shorter": 10},
     "dist.reader(decode=True, image_size=(8, 8), resize_shorter=10) is deprecated: use "
     "pipeline=PipelineOptions(decode=DecodeOptions(enabled=True, image_size=(8, 8), "
     "resize_shorter=10))"),
    ("color_jitter", {"decode": True, "image_size": (8, 8),
                      "random_resized_crop": ((0.5, 1.0), (1.0, 1.0)),
                      "color_jitter": (0.4, 0.4, 0.4)},
     "dist.reader(decode=True, image_size=(8, 8), random_resized_crop=((0.5, 1.0), (1.0, 1.0)), "
     "color_jitter=(0.4, 0.4, 0.4)) is deprecated: use pipeline=PipelineOptions(decode="
     "DecodeOptions(enabled=True, image_size=(8, 8), random_resized_crop=((0.5, 1.0), (1.0, "
     "1.0)), color_jitter=(0.4, 0.4, 0.4)))"),
    ("one_hot", {"one_hot": True},
     "dist.reader(one_hot=True) is deprecated: use "
     "pipeline=PipelineOptions(labels=LabelOptions(one_hot=True))"),
    ("class_values", {"class_values": ["cat", "dog"]},
     "dist.reader(class_values=['cat', 'dog']) is deprecated: use "
     "pipeline=PipelineOptions(labels=LabelOptions(class_values=['cat', 'dog']))"),
    ("class_weights", {"class_weights": "uniform"},
     "dist.reader(class_weights='uniform') is deprecated: use "
     "pipeline=PipelineOptions(labels=LabelOptions(class_weights='uniform'))"),
    ("shuffle_buffer", {"shuffle_buffer": 100},
     "dist.reader(shuffle_buffer=100) is deprecated: use "
     "pipeline=PipelineOptions(sampling=SamplingOptions(shuffle_buffer=100))"),
    ("resample", {"resample": {"cat": 1, "dog": 2}},
     "dist.reader(resample={'cat': 1, 'dog': 2}) is deprecated: use "
     "pipeline=PipelineOptions(sampling=SamplingOptions(resample={'cat': 1, 'dog': 2}))"),
    ("batch_size", {"batch_size": 32},
     "dist.reader(batch_size=32) is deprecated: use "
     "pipeline=PipelineOptions(batch=BatchOptions(size=32))"),
    ("prefetch_batches", {"prefetch_batches": 4},
     "dist.reader(prefetch_batches=4) is deprecated: use "
     "pipeline=PipelineOptions(batch=BatchOptions(prefetch=4))"),
    ("transform", {"transform": "standardize"},
     "dist.reader(transform='standardize') is deprecated: use "
     "pipeline=PipelineOptions(transform=TransformOptions(transform='standardize'))"),
    ("augment", {"augment": ["trainfeed.augment:random_flip"]},
     "dist.reader(augment=['trainfeed.augment:random_flip']) is deprecated: use "
     "pipeline=PipelineOptions(transform=TransformOptions(augment=["
     "'trainfeed.augment:random_flip']))"),
    ("mode", {"mode": "validation"},
     "dist.reader(mode='validation') is deprecated: use pipeline=PipelineOptions("
     "mode='validation')"),
    # dist.reader's own former keywords: where and how it reads.
    ("local", {"local": True},
     "dist.reader(local=True) is deprecated: use source=LocalSource()"),
    ("storage", {"local": True, "storage": "/data"},
     "dist.reader(local=True, storage='/data') is deprecated: use "
     "source=LocalSource(storage='/data')"),
    ("seed", {"local": True, "seed": 3},
     "dist.reader(local=True, seed=3) is deprecated: use source=LocalSource(seed=3)"),
    ("prefetch_partitions", {"local": False, "prefetch_partitions": 4},
     "dist.reader(local=False, prefetch_partitions=4) is deprecated: use "
     "source=MasterSource(prefetch_partitions=4)"),
    ("master", {"master": "host:50051"},
     "dist.reader(master='host:50051') is deprecated: use "
     "source=MasterSource(address='host:50051') (TRAIN_LOCAL is not set here" + ENVIRONMENT),
    ("job", {"local": False, "job": "resnet"},
     "dist.reader(local=False, job='resnet') is deprecated: use source=MasterSource(job='resnet')"),
    ("distribution_rules", {"local": False, "distribution_rules": "gpu"},
     "dist.reader(local=False, distribution_rules='gpu') is deprecated: use "
     "source=MasterSource(distribution_rules='gpu')"),
    ("lost_partitions", {"local": False, "lost_partitions": "skip"},
     "dist.reader(local=False, lost_partitions='skip') is deprecated: use "
     "source=MasterSource(lost_partitions='skip')"),
    ("sync", {"local": True, "batch_size": 4, "sync": True},
     "dist.reader(local=True, batch_size=4, sync=True) is deprecated: use "
     "source=LocalSource(), pipeline=PipelineOptions(batch=BatchOptions(size=4)), "
     "sync=SyncOptions()"),
    ("world_size-rank", {"local": True, "batch_size": 4, "sync": True, "world_size": 2,
                         "rank": 1},
     "dist.reader(local=True, batch_size=4, world_size=2, rank=1, sync=True) is deprecated: use "
     "source=LocalSource(), pipeline=PipelineOptions(batch=BatchOptions(size=4)), "
     "sync=SyncOptions(world_size=2, rank=1)"),
    ("sync-false", {"local": True, "sync": False},
     "dist.reader(local=True, sync=False) is deprecated: use source=LocalSource(), "
     "sync=None (the default)"),
]


def test_every_former_keyword_has_a_case() -> None:
    covered = {keyword for _, keywords, _ in CASES for keyword in keywords}
    assert covered == set(KEYWORDS) | set(SOURCE_KEYWORDS) | set(SYNC_KEYWORDS) | {"sync"}
    assert len(KEYWORDS) == 21  # the pipeline's shortcuts, as issue 27 counted them


@pytest.mark.parametrize("keyword,keywords,text", CASES, ids=[k for k, *_ in CASES])
def test_each_former_keyword_warns_with_its_grouped_spelling(
        monkeypatch: pytest.MonkeyPatch, keyword: str, keywords: dict[str, Any],
        text: str) -> None:
    for name in ("TRAIN_LOCAL", "WORLD_SIZE", "RANK", "SLURM_NTASKS", "SLURM_PROCID",
                 "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    sourced = any(k in SOURCE_KEYWORDS for k in keywords)
    with pytest.warns(DeprecationWarning) as caught:
        reader = dist.reader("flowers", **({} if sourced else {"source": NOWHERE}), **keywords)
    ours = [w for w in caught if "dist.reader(" in str(w.message)]
    assert [str(w.message) for w in ours] == [text]
    assert ours[0].filename == __file__  # the caller's line, where the spelling is to change
    reader.close()


def test_the_former_keywords_build_the_values_the_grouped_spelling_names() -> None:
    """What the warning says to write builds the same options (one case per group)."""
    with pytest.warns(DeprecationWarning):
        old = dist.reader("flowers", local=True, storage="/nonexistent", decode=True,
                          image_size=(8, 8), one_hot=True, shuffle_buffer=10, batch_size=4,
                          mode="validation")
    new = dist.reader("flowers", source=NOWHERE, pipeline=PipelineOptions(
        decode=DecodeOptions(True, image_size=(8, 8)), labels=LabelOptions(one_hot=True),
        sampling=SamplingOptions(shuffle_buffer=10), batch=BatchOptions(size=4),
        mode="validation"))
    assert old.options == new.options and old.mode == new.mode == "local"
    # Shortcuts apply on top of a pipeline given beside them, as they did.
    with pytest.warns(DeprecationWarning, match=r"those fields set on the pipeline= given"):
        tweaked = dist.reader("flowers", source=NOWHERE, pipeline=new.options, batch_size=8)
    assert tweaked.options.batch.size == 8 and tweaked.options.decode == new.options.decode


@pytest.mark.parametrize("call,match", [
    (lambda: dist.reader("x", source=NOWHERE, seed=3),
     r"dist.reader\(source=..., seed=...\): set seed inside the source"),
    (lambda: dist.reader("x", source=NOWHERE, batch_size=4, sync=SyncOptions(), world_size=2,
                         rank=0), r"set them inside SyncOptions, not beside it"),
    (lambda: dist.reader("x", local="yes"), r"local must be True or False, got 'yes'"),
])
def test_a_former_keyword_beside_the_value_that_holds_it_is_refused(
        call: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        call()


def test_the_values_are_exported_from_the_package_and_dist() -> None:
    for name in ("LocalSource", "MasterSource", "SyncOptions"):
        assert name in trainfeed.__all__ and name in dist.__all__
        assert getattr(trainfeed, name) is getattr(dist, name)
    assert dist.__all__ == sorted(dist.__all__)
    assert MasterSource("host:1", "job").address == "host:1"


def test_the_grouped_spelling_reads_checkpoints_and_resumes_without_a_warning(
        tmp_path: Path) -> None:
    """A representative read in the new spelling: decoding, labels, shuffling, batches, a
    mid-epoch state_dict() and a resume from it, with every warning an error."""
    listing = make_image_list(tmp_path / "source", 40)
    storage = str(tmp_path / "storage")
    upload(str(listing), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    source = LocalSource(storage, seed=4, prefetch_partitions=2)
    pipeline = PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8)),
                               labels=LabelOptions(one_hot=True),
                               sampling=SamplingOptions(shuffle_buffer=16),
                               batch=BatchOptions(size=5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dist.reader("flowers", source=source, pipeline=pipeline) as reader:
            batches = reader()
            before = [i for b in itertools.islice(batches, 3) for i in b["_id"].tolist()]
            saved = reader.state_dict()
        with dist.reader("flowers", source=source, pipeline=pipeline, state=saved) as restored:
            after = [i for b in restored() for i in b["_id"].tolist()]
            assert restored.output_spec()["label"][1] == np.float32
    assert sorted(before + after) == list(range(40))
