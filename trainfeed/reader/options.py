"""What the input pipeline does to records, as small frozen option groups a user can hold.

`dist.reader(name, pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(64, 64))))`
passes them whole. Each group validates itself in `__post_init__`; defaults say where they came
from. One table derived from the groups' fields (`KEYWORDS`) maps the flat keyword names
(`decode=True, image_size=(64, 64)`) to them, for `PipelineOptions.from_keywords` and for the
deprecated keyword shortcuts of `dist.reader` (trainfeed.reader.shortcuts): a new option is a
field of its group, with its keyword in the field's metadata when it differs from the field name,
and nothing else to edit.
"""
from __future__ import annotations

import dataclasses
import difflib
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfeed.decode.crops import CropOptions
from trainfeed.decode.pixels import DECODE_POLICIES
from trainfeed.reader.checks import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_target,
)
from trainfeed.reader.resample import Target
from trainfeed.reader.transforms import AugmentStep, Standardize

MODES = ("train", "validation", "score")


def _keyword(name: str) -> dict[str, str]:
    """Field metadata: the flat keyword of a field whose name differs from it."""
    return {"keyword": name}


@dataclass(frozen=True)
class DecodeOptions:
    """Images: JPEG/PNG fields to uint8 HxWxC arrays (float32 once normalized), on all cores.

    The decode-stage crops (`random_resized_crop`, `random_flip`, `color_jitter`,
    `resize_shorter`; docs/imagenet.md) decode, crop, resize to `image_size` and flip each image
    on the decode threads, uint8. The random ones apply in mode "train" only, seeded per
    (seed, epoch, record), so that a re-read makes the same crops; modes "validation" and
    "score" (and training without random_resized_crop) resize the shorter side to
    `resize_shorter` and centre-crop `image_size`.

    Attributes:
        enabled: Decode image fields (keyword `decode`). Every other option needs it.
        image_size: (height, width) every image is resized to. None: as stored.
        crop: Centre-crop each image to image_size's aspect ratio before resizing (nothing
            stretched).
        channels: 3 (RGB) or 1 (grey).
        normalizing_const: Pixels are divided by it, as float32 (e.g. 255.0). None: uint8.
        errors: What an undecodable record does (keyword `decode_errors`): "raise" a
            `trainfeed.DecodeError` naming the record, or "skip" it (counted in
            `reader.decode_failures`).
        threads: Decode threads (keyword `decode_threads`). None: this process's cores, shared
            among the LOCAL_WORLD_SIZE processes torchrun started on the node.
        random_resized_crop: ((min_scale, max_scale), (min_ratio, max_ratio)) of torchvision's
            RandomResizedCrop, e.g. ((0.08, 1.0), (3/4, 4/3)). Needs image_size.
        random_flip: Flip left-right with probability 0.5 (with random_resized_crop or
            resize_shorter).
        resize_shorter: The shorter side before the centre crop of image_size (validation and
            scoring). None: image_size / 0.875.
        color_jitter: (brightness, contrast, saturation) factors of torchvision's ColorJitter,
            e.g. (0.4, 0.4, 0.4), with random_resized_crop.
    """

    enabled: bool = field(default=False, metadata=_keyword("decode"))
    image_size: tuple[int, int] | None = None
    crop: bool = False
    channels: int = 3  # RGB, what image models take; 1 for grey
    normalizing_const: float | None = None
    errors: str = field(default="raise", metadata=_keyword("decode_errors"))
    threads: int | None = field(default=None, metadata=_keyword("decode_threads"))
    # Decode-stage crops (issue 15; trainfeed.decode.crops): ((scale), (ratio)) of torchvision's
    # RandomResizedCrop, a left-right flip with probability 0.5 and colour jitter (all three in
    # training only), and the validation resize of the shorter side before a centre crop of
    # image_size.
    random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
    random_flip: bool = False
    resize_shorter: int | None = None
    # torchvision's ColorJitter (brightness, contrast, saturation), training only.
    color_jitter: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        check_bool("decode", self.enabled)
        check_bool("crop", self.crop)
        check_bool("random_flip", self.random_flip)
        object.__setattr__(self, "channels", check_int("channels", self.channels, 1))
        check_choice("channels", self.channels, [3, 1])  # RGB or grey
        if self.normalizing_const is not None:
            check_number("normalizing_const", self.normalizing_const,
                         "a number > 0 that pixels are divided by (e.g. 255.0), or None",
                         low=0, low_open=True)
        check_choice("decode_errors", self.errors, DECODE_POLICIES)
        object.__setattr__(self, "threads", check_int("decode_threads", self.threads, 1,
                                                      none="this process's cores"))
        object.__setattr__(self, "resize_shorter", check_int(
            "resize_shorter", self.resize_shorter, 1, none="image_size / 0.875"))
        if self.random_resized_crop is not None:
            object.__setattr__(self, "random_resized_crop", _pairs(
                "random_resized_crop", self.random_resized_crop,
                "((min_scale, max_scale), (min_ratio, max_ratio)), e.g. ((0.08, 1.0), (3/4, 4/3))"))
        if self.color_jitter is not None:
            jitter = _numbers("color_jitter", self.color_jitter, 3,
                              "(brightness, contrast, saturation), each a number ≥ 0")
            for name, value in zip(("brightness", "contrast", "saturation"), jitter):
                check_number(f"color_jitter {name}", value, "a number ≥ 0", low=0)
            object.__setattr__(self, "color_jitter", jitter)
        if self.image_size is not None:
            size = _numbers("image_size", self.image_size, 2,
                            "(height, width) of positive ints")
            for name, value in zip(("height", "width"), size):
                check_int(f"image_size {name}", value, 1)
            object.__setattr__(self, "image_size", tuple(operator.index(x) for x in size))
        if ((self.image_size is not None or self.normalizing_const is not None or self.crop)
                and not self.enabled):
            raise ValueError("image_size, crop and normalizing_const apply to decoded images: "
                             "pass decode=True")
        self._check_crops()

    def _check_crops(self) -> None:
        """The decode-stage crop options need decoding and an output size, and replace `crop`."""
        if self.random_resized_crop is None and self.resize_shorter is None:
            if self.random_flip:
                raise ValueError("random_flip is a decode-stage option of random_resized_crop= "
                                 "or resize_shorter=; to mirror whole batches use "
                                 "augment=['trainfeed.augment:random_flip']")
            if self.color_jitter is not None:
                raise ValueError("color_jitter is a decode-stage option of "
                                 "random_resized_crop=: pass it too")
            return
        if not self.enabled or self.image_size is None:
            raise ValueError("random_resized_crop and resize_shorter crop decoded images to "
                             "image_size: pass decode=True and image_size=(height, width)")
        if self.crop:
            raise ValueError("crop=True and random_resized_crop/resize_shorter both choose the "
                             "crop: pass one of them")
        self.crop_options("train")  # CropOptions validates the values

    def crop_options(self, mode: str) -> CropOptions | None:
        """What the decode threads crop in `mode`: a random resized crop and flip in training,
        the resize-shorter-side + centre crop in validation and scoring."""
        if self.image_size is None or (self.random_resized_crop is None
                                       and self.resize_shorter is None):
            return None
        training = mode == "train"
        return CropOptions(self.image_size, self.random_resized_crop if training else None,
                           self.resize_shorter, 0.5 if training and self.random_flip else 0.0,
                           color_jitter=self.color_jitter if training else None)


@dataclass(frozen=True)
class LabelOptions:
    """Labels become int64 class ids 0..K-1 (with a pipeline; raw records keep them as written).

    Attributes:
        one_hot: float32 (n, K) one-hot rows instead of ids.
        class_values: The labels behind ids 0..K-1, in this order, e.g. a training reader's
            `class_values` given to a validation reader, so that ids agree even where it lacks
            classes. None: the dataset version's class ids (its labels sorted, integer labels
            by value, trainfeed.formats.labels; an append's new labels after them). A dataset
            label outside them is refused when the reader opens the dataset, and a restored
            state whose reader delivered other ids at creation (trainfeed.reader.label_ids).
        class_weights: A per-record loss weight in the batch field "_weight" (Keras's
            sample_weight), instead of or with resampling: "uniform" weights each class as
            resampling toward uniform would, a dict class -> weight, or a power of the source
            distribution. None: no weights.
    """

    one_hot: bool = False
    class_values: tuple[str, ...] | None = None
    class_weights: Target | None = None

    def __post_init__(self) -> None:
        check_bool("one_hot", self.one_hot)
        check_target("class_weights", self.class_weights)
        if self.class_values is not None:
            object.__setattr__(self, "class_values", _class_values(self.class_values))


@dataclass(frozen=True)
class SamplingOptions:
    """Which records come, in which order (mode "train" only).

    Attributes:
        shuffle_buffer: Records shuffled together, beyond the per-epoch partition order.
            0: the partition order alone.
        resample: Rebalances classes toward "uniform", a dict class -> weight, or a power p of
            the source distribution (p < 1 under-samples the large classes, p > 1
            over-samples them). None: as stored.
    """

    shuffle_buffer: int = 0  # 0: the partition order alone (the master's per-epoch shuffle)
    resample: Target | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shuffle_buffer",
                           check_int("shuffle_buffer", self.shuffle_buffer, 0))
        check_target("resample", self.resample)


@dataclass(frozen=True)
class BatchOptions:
    """Batches: dicts of arrays keyed by field name, plus "_id".

    Attributes:
        size: Records per batch (keyword `batch_size`). None: one instance at a time, a tuple.
        prefetch: Batches prepared ahead of the trainer (keyword `prefetch_batches`).
    """

    size: int | None = field(default=None, metadata=_keyword("batch_size"))
    # Two: one in the trainer's hands, one ready; more only buys memory when decoding keeps up.
    prefetch: int = field(default=2, metadata=_keyword("prefetch_batches"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "size",
                           check_int("batch_size", self.size, 1, none="one instance at a time"))
        object.__setattr__(self, "prefetch", check_int("prefetch_batches", self.prefetch, 1))


@dataclass(frozen=True)
class TransformOptions:
    """Functions applied to whole batches.

    Attributes:
        transform: A fitted transformer (trainfeed.reader.transforms.Standardize) or the name
            of one saved with the dataset, applied to every batch. None: none.
        augment: Importable functions, "module:function" or ("module:function", {params}),
            e.g. "trainfeed.augment:random_flip", applied to training batches only, in order.
    """

    transform: str | Standardize | None = None
    augment: tuple[AugmentStep, ...] = ()

    def __post_init__(self) -> None:
        if self.transform is not None and not isinstance(self.transform, str) and not callable(
                getattr(self.transform, "apply", None)):
            raise TypeError(f"transform must be the name of a saved transformer, a fitted one "
                            f"(with an apply(batch) method, e.g. Standardize) or None, got "
                            f"{type(self.transform).__name__}")
        if isinstance(self.augment, str):
            raise TypeError(f"augment must be a sequence of steps, not the string "
                            f"{self.augment!r}: pass [{self.augment!r}]")
        if not isinstance(self.augment, Sequence):
            raise TypeError(f"augment must be a sequence of steps, got "
                            f"{type(self.augment).__name__}")
        for i, step in enumerate(self.augment):
            if not (isinstance(step, str) or (
                    isinstance(step, Sequence) and len(step) == 2
                    and isinstance(step[0], str) and isinstance(step[1], Mapping))):
                raise TypeError(f"augment[{i}] must be \"module:function\" or (\"module:"
                                f"function\", {{params}}), got {str(repr(step))[:80]}")
        object.__setattr__(self, "augment", tuple(self.augment))


@dataclass(frozen=True)
class PipelineOptions:
    """What `dist.reader(...)` does to records before handing them over, by group.

    Without any option the reader yields raw Paddle-style tuples.

    Attributes:
        decode: Image decoding, resizing and decode-stage crops.
        labels: Class ids, one-hot rows, loss weights.
        sampling: Shuffling and class resampling.
        batch: Batch size and batches prepared ahead.
        transform: Transformers and augmentations of whole batches.
        mode: "train", or "validation" and "score", which never shuffle, resample or augment.

    Example:
        >>> options = PipelineOptions(decode=DecodeOptions(True, image_size=(32, 32)),
        ...                           batch=BatchOptions(size=64))
        >>> options.batch.size, options.active
        (64, True)
        >>> PipelineOptions.from_keywords(batch_size=64) == PipelineOptions(
        ...     batch=BatchOptions(size=64))
        True
    """

    decode: DecodeOptions = DecodeOptions()
    labels: LabelOptions = LabelOptions()
    sampling: SamplingOptions = SamplingOptions()
    batch: BatchOptions = BatchOptions()
    transform: TransformOptions = TransformOptions()
    mode: str = "train"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = GROUPS.get(f.name)
            if kind is not None and not isinstance(value, kind):
                raise TypeError(f"PipelineOptions.{f.name} must be a {kind.__name__}, got "
                                f"{type(value).__name__}")
        check_choice("mode", self.mode, MODES)

    @classmethod
    def from_keywords(cls, base: PipelineOptions | None = None,
                      **keywords: Any) -> PipelineOptions:
        """`base` (default: no options) with flat keywords applied (`batch_size=64`,
        `decode=True`: the names of `KEYWORDS`).

        Args:
            base: The options the keywords change.
            **keywords: Option names, flat: a field's keyword metadata, else its name.

        Returns:
            The options, each group validated.

        Raises:
            TypeError: a keyword that is no pipeline option (the message suggests one).
        """
        options = base or cls()
        changes: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for keyword, value in keywords.items():
            if keyword not in KEYWORDS:
                close = difflib.get_close_matches(keyword, KEYWORDS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"unknown reader option {keyword!r}{hint} (options: "
                                f"{', '.join(sorted(KEYWORDS))})")
            group, name = KEYWORDS[keyword]
            if group:
                changes.setdefault(group, {})[name] = value
            else:
                top[name] = value
        for group, values in changes.items():
            top[group] = dataclasses.replace(getattr(options, group), **values)
        return dataclasses.replace(options, **top) if top else options

    @property
    def active(self) -> bool:
        """Whether any option asks for more than the raw Paddle-style records."""
        return self != PipelineOptions()

    @property
    def shuffles(self) -> bool:
        """Over-sampled copies are shuffled too (within the buffer, at least within the batches'
        window), so that replicas of a record do not sit together."""
        return self.mode == "train" and (self.sampling.shuffle_buffer > 1
                                         or self.sampling.resample is not None)

    @property
    def resamples(self) -> bool:
        return self.mode == "train" and self.sampling.resample is not None

    @property
    def augments(self) -> bool:
        return self.mode == "train" and bool(self.transform.augment)


def _numbers(option: str, value: Any, length: int, rule: str) -> tuple[Any, ...]:
    """`value` as a tuple of `length` items (a list or tuple of them)."""
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != length:
        raise ValueError(f"{option} must be {rule}, got {str(repr(value))[:80]}")
    return tuple(value)


def _pairs(option: str, value: Any, rule: str) -> tuple[tuple[float, float], ...]:
    """Two (low, high) pairs of numbers, as floats (CropOptions checks their ranges)."""
    pairs = _numbers(option, value, 2, rule)
    out = []
    for pair in pairs:
        for x in _numbers(option, pair, 2, rule):
            check_number(option, x, rule)
        out.append((float(pair[0]), float(pair[1])))
    return tuple(out)


def _class_values(values: Any) -> tuple[str, ...]:
    """The labels behind class ids 0..K-1, in the given order: distinct strings (ints are taken
    as their decimal text, as labels are stored)."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"class_values must be a sequence of labels (e.g. a training reader's "
                        f"class_values), got {str(repr(values))[:80]}")
    labels = []
    for i, label in enumerate(values):
        if isinstance(label, bool) or not isinstance(label, str | numbers.Integral):
            raise TypeError(f"class_values[{i}] must be a label (a string, or an int for its "
                            f"decimal text), got {str(repr(label))[:80]}")
        labels.append(str(label))
    if not labels:
        raise ValueError("class_values is empty: give the labels behind class ids 0..K-1")
    seen: set[str] = set()
    for i, label in enumerate(labels):
        if label in seen:
            raise ValueError(f"class_values[{i}] is {label!r} again: each label once")
        seen.add(label)
    return tuple(labels)


GROUPS: dict[str, type] = {"decode": DecodeOptions, "labels": LabelOptions,
                           "sampling": SamplingOptions, "batch": BatchOptions,
                           "transform": TransformOptions}


def _keywords() -> dict[str, tuple[str, str]]:
    """`dist.reader` keyword -> (group field of PipelineOptions, or "" for its own; field)."""
    table: dict[str, tuple[str, str]] = {}
    for group, kind in GROUPS.items():
        for f in dataclasses.fields(kind):
            keyword = f.metadata.get("keyword", f.name)
            assert keyword not in table, f"two options answer to keyword {keyword!r}"
            table[keyword] = (group, f.name)
    for f in dataclasses.fields(PipelineOptions):
        if f.name not in GROUPS:
            table[f.name] = ("", f.name)
    return table


KEYWORDS: Mapping[str, tuple[str, str]] = _keywords()


def keyword_defaults() -> dict[str, Any]:
    """Every keyword shortcut with its default (for documentation and tests)."""
    defaults = PipelineOptions()
    return {keyword: getattr(getattr(defaults, group), name) if group
            else getattr(defaults, name) for keyword, (group, name) in KEYWORDS.items()}


__all__: Sequence[str] = ["BatchOptions", "DecodeOptions", "LabelOptions", "PipelineOptions",
                          "SamplingOptions", "TransformOptions"]
