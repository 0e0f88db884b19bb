"""Framework adapters: a reader's batches as a `tf.data.Dataset` or a torch `IterableDataset`.

The reader already does the work a framework's input pipeline would (it reads, decodes, shuffles
and batches ahead on background threads), so an adapter only re-types what comes out: a reader
batch is a dict of numpy arrays with a leading batch dimension, described up front by
`reader.output_spec()`. Numpy stays the default; TensorFlow and PyTorch are imported only when an
adapter is called, so that `import trainfeed` works without either (extras `trainfeed[tf]`,
`trainfeed[torch]`).

Every iteration of an adapter's dataset is one new pass of the reader: `model.fit(ds, epochs=3)`
reads three epochs, and in a cluster each pass is this worker's share of one epoch of the job.
"""
from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf
    import torch.utils.data

logger = logging.getLogger(__name__)

# The field Keras gets as its target by default (what `dist.reader` calls a file list's label).
LABEL_FIELD = "label"
# Keras (3.x, and tf.keras since TF 2.2: tensorflow/tensorflow#41571) ends every epoch after the
# first one at the first epoch's step count when a dataset's length is unknown. A worker's share
# of an epoch varies, so a longer share is cut off and its pass abandoned: hence this warning.
ABANDONED = (
    "a pass of reader %r was abandoned after %d batches (in a cluster, its unread tasks go "
    "back to the master). If Keras did this at an epoch's end, it capped the epoch at the "
    "first epoch's step count: call model.fit(ds, initial_epoch=e, epochs=e + 1) once per "
    "epoch instead")
# Fields starting with this are bookkeeping (`_id`): never model inputs unless asked for by name.
PRIVATE_PREFIX = "_"

FieldSpec = tuple[tuple[int | None, ...], Any]
# Which fields make up an input or target: one field, a tuple of them, or named ones (a dict
# from a Keras input/output name to a field); nested as (inputs, targets) for an element.
Structure: TypeAlias = 'str | tuple["Structure", ...] | dict[str, "Structure"]'
Selection: TypeAlias = "str | Sequence[str] | Mapping[str, str] | None"


class BatchReader(Protocol):
    """What the adapters need of a reader (`trainfeed.Reader` built with `batch_size`)."""

    name: str

    def __call__(self) -> Iterable[Any]:
        """One pass: dicts of numpy arrays, one entry per field of `output_spec()`."""
        ...

    def output_spec(self) -> Mapping[str, FieldSpec]:
        """Per field: the shape of one batch (None for the batch dimension) and its dtype."""
        ...


class StatefulReader(BatchReader, Protocol):
    """A reader whose position can be saved and restored (`trainfeed.Reader`)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _stateful(reader: BatchReader) -> StatefulReader:
    if not hasattr(reader, "state_dict") or not hasattr(reader, "load_state_dict"):
        raise TypeError(f"reader {reader.name!r} ({type(reader).__name__}) has no "
                        "state_dict()/load_state_dict(): it cannot be checkpointed")
    return reader  # type: ignore[return-value]


def _import(module: str, extra: str, caller: str) -> ModuleType:
    """Imports a framework on first use, or says which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{caller}() needs {module}, which cannot be imported ({exc}); install it with "
            f"pip install 'trainfeed[{extra}]'") from exc


def _spec(reader: BatchReader) -> dict[str, tuple[tuple[int | None, ...], np.dtype[Any]]]:
    spec = {name: (tuple(shape), np.dtype(dtype))
            for name, (shape, dtype) in reader.output_spec().items()}
    if not spec:
        raise ValueError(f"reader {reader.name!r} describes no fields: build it with "
                         "batch_size=... so that it yields batches with an output_spec()")
    return spec


def _structure(selection: Selection, fields: Mapping[str, Any], role: str) -> Structure:
    """The fields `selection` names, checked against the reader's fields."""
    if isinstance(selection, str):
        names: Iterable[str] = [selection]
        structure: Structure = selection
    elif isinstance(selection, Mapping):
        names = selection.values()
        structure = dict(selection)
    elif isinstance(selection, Sequence):
        names = list(selection)
        structure = tuple(names)
    else:
        raise TypeError(f"{role} must be a field name, a list/tuple of names or a dict of "
                        f"Keras names to field names, got {type(selection).__name__}")
    for name in names:
        if not isinstance(name, str) or name not in fields:
            raise ValueError(f"{role} names field {name!r}, but the reader's fields are "
                             f"{sorted(fields)}")
    return structure


def keras_structure(fields: Mapping[str, Any], inputs: Selection = None,
                    targets: Selection = None) -> tuple[Structure, Structure | None]:
    """Which fields form Keras's (inputs, targets); targets None: the model gets no targets.

    Defaults, matching a file list's (image, label): `targets` is "label" when there is one
    (and `inputs` does not name it); `inputs` is every field but "label", the targets and
    bookkeeping ones ("_id"), a single tensor when that leaves one. An empty list/tuple for
    `targets` means none.

    Example:
        >>> fields = {"image": None, "label": None, "_id": None}
        >>> keras_structure(fields)
        ('image', 'label')
        >>> keras_structure(fields, inputs={"pixels": "image", "id": "_id"}, targets=())
        ({'pixels': 'image', 'id': '_id'}, None)
    """
    x = _structure(inputs, fields, "inputs") if inputs is not None else None
    y = _targets(fields, targets, x)
    return (x if x is not None else _default_inputs(fields, y)), y


def _targets(fields: Mapping[str, Any], targets: Selection,
             inputs: Structure | None) -> Structure | None:
    """Keras's targets: those given, none for an empty list/tuple, else "label" when the
    reader has one that `inputs` does not already feed the model."""
    if targets is None:
        given = set(_names(inputs)) if inputs is not None else set()
        return LABEL_FIELD if LABEL_FIELD in fields and LABEL_FIELD not in given else None
    if isinstance(targets, Sequence) and not isinstance(targets, str) and not targets:
        return None
    return _structure(targets, fields, "targets")


def _default_inputs(fields: Mapping[str, Any], targets: Structure | None) -> Structure:
    """Keras's inputs when none are named: every field but "label", the targets and the
    bookkeeping ones ("_id"), a single tensor when that leaves one.

    Raises:
        ValueError: no field is left.
    """
    taken = set(_names(targets)) if targets is not None else set()
    rest = tuple(f for f in fields if f not in taken and f != LABEL_FIELD
                 and not f.startswith(PRIVATE_PREFIX))
    if not rest:
        raise ValueError(f"no fields left for the model's inputs (fields {sorted(fields)}, "
                         f"targets {targets!r}): pass inputs=...")
    return rest[0] if len(rest) == 1 else rest


def _names(structure: Structure) -> Iterator[str]:
    if isinstance(structure, str):
        yield structure
    elif isinstance(structure, dict):
        for value in structure.values():
            yield from _names(value)
    else:
        for item in structure:
            yield from _names(item)


def _map(structure: Structure, leaf: Any) -> Any:
    """`structure` with each field name replaced by `leaf(name)` (a tiny `tf.nest.map`)."""
    if isinstance(structure, str):
        return leaf(structure)
    if isinstance(structure, dict):
        return {key: _map(value, leaf) for key, value in structure.items()}
    return tuple(_map(item, leaf) for item in structure)


def _is_text(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "OSU"


def _column(batch: Mapping[str, Any], name: str, spec: FieldSpec, reader: str) -> np.ndarray:
    """One field of a batch as an array, checked against the spec so that a broken batch is
    named here rather than deep inside TensorFlow's generator op."""
    shape, dtype = spec
    try:
        value = batch[name]
    except KeyError:
        raise ValueError(f"reader {reader!r} yielded a batch without field {name!r} (it has "
                         f"{sorted(batch)}), which its output_spec() promised") from None
    # Text stays object: a fixed-width bytes array would drop trailing NUL bytes.
    array = np.asarray(value, dtype=object if _is_text(dtype) else None)
    if not _is_text(dtype) and array.dtype != dtype:
        raise TypeError(f"reader {reader!r}: field {name!r} has dtype {array.dtype} in a "
                        f"batch, but {dtype} in its output_spec()")
    if array.ndim != len(shape) or any(want is not None and got != want
                                       for got, want in zip(array.shape, shape)):
        raise ValueError(f"reader {reader!r}: field {name!r} has shape {array.shape} in a "
                         f"batch, but {shape} in its output_spec()")
    return array


def as_tf_dataset(reader: BatchReader, inputs: Selection = None,
                  targets: Selection = None,
                  sample_weights: Selection = None) -> tf.data.Dataset:
    """The reader as a `tf.data.Dataset` of `(inputs, targets)` batches that `model.fit` takes.

    The element spec is complete (shapes with a None batch dimension and dtypes, from
    `reader.output_spec()`), so Keras can build the model before the first batch. Which fields
    go where is decided by `inputs` and `targets` (see `keras_structure`): a field name gives a
    tensor, a list/tuple of names a tuple, a dict `{keras_name: field}` the named inputs or
    outputs of a multi-input/multi-output model. Without targets, elements are `(inputs,)`.

    Each iteration (each Keras epoch) calls `reader()` again: one new pass. But Keras caps every
    epoch after the first at the first one's step count when, as here, the length is unknown;
    in a cluster a worker's share of an epoch varies, so with `epochs > 1` call
    `model.fit(ds, initial_epoch=e, epochs=e + 1)` once per epoch (a pass cut short is logged).
    For the same reason Keras warns "Your input ran out of data" at the first epoch's end:
    expected, harmless.

    No prefetch is added, and tf.data's automatic one is switched off: the reader already
    prepares batches ahead, and it acknowledges a batch to the master once the trainer asks for
    the next one; a prefetch buffer would count batches as consumed before the model saw them,
    so a crash would lose up to that many. Add `.prefetch(n)` yourself if that trade is worth it.

    Args:
        reader: a `dist.reader(...)` with a batch size (anything with `__call__` yielding dicts
            of arrays and `output_spec()`).
        inputs: the model's inputs; default: every field but "label", the targets and
            "_"-fields ("_id").
        targets: the model's targets; default: "label" if the reader has it; () for none.
        sample_weights: the field(s) of per-record loss weights, e.g. "_weight" of a reader
            with LabelOptions(class_weights=...); elements are then (inputs, targets, weights).

    Raises:
        ImportError: TensorFlow is not installed (`pip install 'trainfeed[tf]'`).
        ValueError: `inputs` or `targets` name a field the reader does not have.

    Example:
        >>> reader = dist.reader("flowers", pipeline=PipelineOptions(  # doctest: +SKIP
        ...     decode=DecodeOptions(True, image_size=(32, 32), normalizing_const=255.0),
        ...     labels=LabelOptions(one_hot=True), batch=BatchOptions(size=16)))
        >>> model.fit(as_tf_dataset(reader), epochs=3)  # doctest: +SKIP
    """
    tf_module: Any = _import("tensorflow", "tf", "as_tf_dataset")
    spec = _spec(reader)
    x, y = keras_structure(spec, inputs, targets)
    element: Structure = (x, y) if y is not None else (x,)
    if sample_weights is not None:
        if y is None:
            raise ValueError("sample_weights need targets")
        element = (x, y, _structure(sample_weights, spec, "sample_weights"))

    def tensor_spec(name: str) -> Any:
        shape, dtype = spec[name]
        return tf_module.TensorSpec(shape, tf_module.string if _is_text(dtype)
                                    else tf_module.as_dtype(dtype))

    def arrays(batch: Mapping[str, Any]) -> Any:
        return _map(element, lambda name: _column(batch, name, spec[name], reader.name))

    def one_pass() -> Iterator[Any]:
        handed = 0
        try:
            for batch in reader():
                handed += 1
                yield arrays(batch)
        except GeneratorExit:  # the consumer dropped the iterator before the pass ended
            logger.warning(ABANDONED, reader.name, handed)
            raise

    dataset = tf_module.data.Dataset.from_generator(
        one_pass, output_signature=_map(element, tensor_spec))
    steps = getattr(reader, "steps_per_epoch", None)
    if steps is not None:
        # A synchronous reader's passes all have this length: Keras then knows its epochs'
        # step count (no "ran out of data", no epoch capped at the first one's count).
        dataset = dataset.apply(tf_module.data.experimental.assert_cardinality(steps))
    options = tf_module.data.Options()
    # tf.data would otherwise put a prefetch after the generator, pulling one batch ahead of
    # the model: the reader would count it as consumed before training saw it.
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def _torch_batch(torch: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
    """A batch with its numeric arrays as tensors (sharing memory); text columns stay arrays."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        array = np.asarray(value)
        if _is_text(array.dtype):
            out[name] = value
            continue
        if not array.flags.writeable:  # torch may write to it; a read-only view must be copied
            array = array.copy()
        out[name] = torch.from_numpy(array)
    return out


def _normalizer(torch: Any, spec: Mapping[str, FieldSpec], device: Any,
                mean: Sequence[float] | None, std: Sequence[float] | None,
                pin_memory: bool | None) -> Any:
    """What `as_torch(device=, mean=, std=)` does to a batch of tensors, or None for nothing.

    Images stay uint8 until they are on the device (4x fewer bytes to copy, no float work on
    the CPU); there they become float32 NCHW (in channels-last memory order, what convolutions
    under mixed precision prefer), (x / 255 - mean) / std per channel.
    """
    if (mean is None) != (std is None):
        raise ValueError("pass mean and std together (per channel, on the 0-1 scale, e.g. "
                         "ImageNet's (0.485, 0.456, 0.406) and (0.229, 0.224, 0.225))")
    if device is None and mean is None:
        return None
    target = torch.device(device if device is not None else "cpu")
    scale = _scales(torch, spec, target, mean, std) if mean is not None and std is not None \
        else {}
    pin = target.type == "cuda" if pin_memory is None else pin_memory
    return _mover(torch, target, pin, scale)


def _scales(torch: Any, spec: Mapping[str, FieldSpec], target: Any, mean: Sequence[float],
            std: Sequence[float]) -> dict[str, tuple[Any, Any]]:
    """Per uint8 image field (N, H, W, C): the (shift, factor) on `target` that turn its 0-255
    pixels into (x / 255 - mean) / std, as (x - 255 mean) * 1 / (255 std), one multiply-add.

    Raises:
        ValueError: the reader yields no such field, or mean/std do not fit its channels.
    """
    images = [name for name, (shape, dtype) in spec.items()
              if len(shape) == 4 and np.dtype(dtype) == np.uint8]
    if not images:
        raise ValueError("mean/std normalize uint8 image batches (N, H, W, C), but the "
                         "reader yields none: build it with decode=True and no "
                         "normalizing_const")
    scale: dict[str, tuple[Any, Any]] = {}
    for name in images:
        channels = spec[name][0][3]
        if len(mean) != channels or len(std) != channels or min(std) <= 0:
            raise ValueError(f"mean and std need {channels} values (std > 0) for field "
                             f"{name!r}, got {tuple(mean)} and {tuple(std)}")
        shape = (1, channels, 1, 1)
        scale[name] = (torch.tensor([m * 255.0 for m in mean], device=target).view(shape),
                       torch.tensor([1.0 / (s * 255.0) for s in std],
                                    device=target).view(shape))
    return scale


def _mover(torch: Any, target: Any, pin: bool,
           scale: Mapping[str, tuple[Any, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function that moves a batch's tensors to `target` (through pinned memory, without
    blocking, when `pin`) and there normalizes the image fields of `scale` to float32 NCHW;
    other values pass as they are."""

    def apply(batch: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if not isinstance(value, torch.Tensor):
                out[name] = value
                continue
            if pin:
                value = value.pin_memory()
            value = value.to(target, non_blocking=pin)
            if name in scale:
                shift, factor = scale[name]
                value = value.permute(0, 3, 1, 2).float().sub_(shift).mul_(factor)
            out[name] = value
        return out
    return apply


def as_torch(reader: BatchReader, device: Any = None, mean: Sequence[float] | None = None,
             std: Sequence[float] | None = None, pin_memory: bool | None = None,
             ) -> torch.utils.data.IterableDataset[dict[str, Any]]:
    """The reader as a torch `IterableDataset` of batches: dicts of tensors (text columns, which
    torch has no tensor for, stay numpy object arrays).

    `device` (e.g. "cuda"): tensors are moved there, through pinned memory (`pin_memory`,
    default: for CUDA devices) with non-blocking copies, so the copy of batch k+1 overlaps the
    step on batch k. `mean`/`std` (per channel, 0-1 scale): uint8 image fields (N, H, W, C)
    become float32 (N, C, H, W), (x / 255 - mean) / std, computed on the device: the reader's
    CPU cores only decode (see docs/imagenet.md).

    The reader already batches, so use it with `DataLoader(ds, batch_size=None)` or iterate it
    directly. Each `iter()` is one new pass. The dataset is Stateful (`state_dict()` /
    `load_state_dict()`, the reader's): `torchdata.stateful_dataloader.StatefulDataLoader(ds,
    batch_size=None)` checkpoints and resumes it exactly, without replaying batches, and so does
    `torch.distributed.checkpoint` given `{"data": ds}`. It refuses DataLoader worker
    processes: the reader reads, decodes and batches on background threads already, and each
    worker would hold its own copy of the reader (every record once per worker when reading
    locally, and a checkpoint's `reader.state_dict()` would miss what the workers consumed).

    Raises:
        ImportError: PyTorch is not installed (`pip install 'trainfeed[torch]'`).
    """
    torch: Any = _import("torch", "torch", "as_torch")
    spec = _spec(reader)
    normalize = _normalizer(torch, spec, device, mean, std, pin_memory)

    class ReaderDataset(torch.utils.data.IterableDataset):
        """One pass of the reader per iteration, as dicts of tensors."""

        output_spec = spec

        def __iter__(self) -> Iterator[dict[str, Any]]:
            if torch.utils.data.get_worker_info() is not None:
                raise RuntimeError(
                    f"as_torch({reader.name!r}) was iterated in a DataLoader worker process: use "
                    "DataLoader(dataset, batch_size=None, num_workers=0); the reader already "
                    "decodes and batches in the background, and each worker would read again")
            for batch in reader():
                tensors = _torch_batch(torch, batch)
                yield normalize(tensors) if normalize is not None else tensors

        def __len__(self) -> int:
            """Batches per pass, for a synchronous reader (`sync=SyncOptions()`: the same on
            every rank, what a DDP loop or a scheduler's steps_per_epoch needs); other readers'
            passes vary, and have no length (TypeError, as for any IterableDataset without
            one)."""
            steps = getattr(reader, "steps_per_epoch", None)
            if steps is None:
                raise TypeError(f"as_torch({reader.name!r}) has no length: its passes vary; "
                                "a synchronous reader (sync=SyncOptions()) has one")
            return int(steps)

        def state_dict(self) -> dict[str, Any]:
            """The reader's `state_dict()` (torchdata's Stateful protocol): what
            `StatefulDataLoader.state_dict()` and `torch.distributed.checkpoint` save."""
            return _stateful(reader).state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            """Restores the reader before its next pass (see Reader.load_state_dict)."""
            _stateful(reader).load_state_dict(state)

        def __repr__(self) -> str:
            return f"as_torch({reader.name!r})"

    return ReaderDataset()
