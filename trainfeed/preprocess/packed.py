"""Packed datasets: MADlib's `training_preprocessor_dl` / `validation_preprocessor_dl` output.

A packed dataset is a trainfeed dataset (kind "packed") whose records are buffers: each row
holds, per independent variable, the stacked normalized float32 array of many instances, per
dependent variable their one-hot int16 array, the shapes, and the buffer id (the record id).
Its manifest carries the MADlib summary. A reader serves it buffer by buffer: each buffer is one
ready mini-batch (see `decode_buffer`).

Buffers are encoded and written a shard at a time into a fresh data folder, and the manifest
goes last, atomically, as with uploads: a run that meets a bad row removes what it wrote and
publishes nothing.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from trainfeed.cores import usable_cores
from trainfeed.formats import shards as shard_format
from trainfeed.formats.labels import NUMERIC_ORDER
from trainfeed.formats.manifest import (
    PACKED_KIND,
    FieldSpec,
    Manifest,
    check_name_is_free,
    dataset_storage,
    read_manifest,
    write_manifest,
)
from trainfeed.formats.packed import SHAPE_SUFFIX
from trainfeed.names import validate_dataset_name
from trainfeed.preprocess.arguments import (
    Arguments,
    check_arguments,
    class_widths,
    split_names,
)
from trainfeed.preprocess.buffers import plan_buffers
from trainfeed.preprocess.encoding import (
    ONE_HOT_DTYPE,
    PreprocessError,
    class_values,
    one_hot,
    real_classes,
    stack_arrays,
    unknown_classes,
)
from trainfeed.preprocess.sqltypes import arrow_sql_type, is_array_type
from trainfeed.redaction import redact_url, scrub, url_secrets
from trainfeed.storage import Storage, open_storage
from trainfeed.upload import remove_stale_data

# Buffers per shard file: each buffer is its own row group (one partition reads whole buffers).
BUFFERS_PER_SHARD = 64
# A shard is built in memory before its atomic write: close it past this many payload bytes, so
# packing a large table (1M rows of 3x32x32 are 12 GB of float32) never holds more than this.
SHARD_TARGET_BYTES = 512 << 20
Columns = dict[str, list[Any]]


def load_source(source: Any, storage: Storage | None = None,
                ordered: bool = True) -> tuple[pa.Table, str]:
    """The source as an Arrow table, and a name for the summary. Accepts a pyarrow Table, a
    pandas DataFrame, a dict of columns, a Parquet or CSV file path or fsspec URL (CSV cells
    holding JSON arrays, "[1, 2, 3]", are decoded), a SQL source (trainfeed.sql; SQLite, which
    has no array type, may hold them as such JSON text too), or the name
    of a trainfeed dataset in `storage` (an uploaded image list: images decoded to uint8
    arrays, labels as written).

    `ordered=False` (training output is shuffled anyway) lets a SQL source with key columns
    be read as one hash partition per core, over parallel connections."""
    if hasattr(source, "read") and hasattr(source, "query"):  # trainfeed.sql.SqlSource
        return _sql_table(source, ordered)
    if isinstance(source, str) and storage is not None and _is_dataset_name(source):
        return _dataset_table(source, storage), f"dataset {source}"
    if isinstance(source, str):
        return _file_table(source)
    return _memory_table(source)


def _sql_table(source: Any, ordered: bool) -> tuple[pa.Table, str]:
    """A SQL source's result, over one connection, or one per core where order does not matter
    (see `load_source`); named by its query."""
    table = source.read(1 if ordered else usable_cores())
    if source.dialect == "sqlite":  # no array type: arrays are kept as JSON text
        table = _decode_json_arrays(table)
    return table, str(source.query)


def _file_table(source: str) -> tuple[pa.Table, str]:
    """A Parquet or CSV file at a path or URL, named by its URL without credentials.

    The URL may carry credentials: neither the error nor the name, which goes into the summary
    (the manifest every reader reads), may show them."""
    storage = open_storage(source.rsplit("/", 1)[0] if "/" in source else ".")
    name = source.rsplit("/", 1)[-1]
    try:
        with storage.fs.open(storage.path(name), "rb") as f:
            table = (pa_csv.read_csv(f) if name.lower().endswith(".csv")
                     else pq.read_table(f))
    except OSError as e:  # the driver's text may quote the URL, credentials and all
        secret = bool(url_secrets(source))
        raise PreprocessError(f"cannot read the source {redact_url(source)}: "
                              f"{scrub(str(e), source)}") from (None if secret else e)
    return _decode_json_arrays(table), redact_url(source, drop=True)


def _memory_table(source: Any) -> tuple[pa.Table, str]:
    """A source already in memory (an Arrow table, a pandas DataFrame, a dict of columns);
    anything else is refused, naming what is accepted."""
    if isinstance(source, pa.Table):
        return source, "arrow table"
    if hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
        return pa.Table.from_pandas(source, preserve_index=False), "DataFrame"
    if isinstance(source, Mapping):
        try:
            return pa.table({str(k): list(v) for k, v in source.items()}), "dict"
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise PreprocessError(f"cannot tabulate the source dict: {e}") from None
    raise TypeError(f"unsupported source {type(source).__name__}: pass a pyarrow Table, a "
                    f"pandas DataFrame, a dict of columns or a Parquet path/URL")


def _is_dataset_name(source: str) -> bool:
    """A name like "flowers" or "public/digits", not a file path or URL."""
    return ("://" not in source and not source.lower().endswith((".parquet", ".csv"))
            and not source.startswith((".", "/")))


def _dataset_table(name: str, storage: Storage) -> pa.Table:
    """A trainfeed dataset as a table: binary (image) fields decoded to uint8 arrays, kept as
    fixed-size lists (no Python object per pixel), other fields as they are."""
    manifest = read_manifest(storage, name)
    images = {f.name for f in manifest.fields if f.type == "binary"}
    parts = _dataset_chunks(name, storage, manifest, images)
    return pa.table({field_name: _image_array(chunks) if field_name in images
                     else pa.array([v for chunk in chunks for v in chunk])
                     for field_name, chunks in parts.items()})


def _dataset_chunks(name: str, storage: Storage, manifest: Manifest,
                    images: set[str]) -> dict[str, list[Any]]:
    """Each field of a dataset as the list of its batches' values, read by a local reader in
    record order: image fields as decoded pixel arrays, labels as the values written."""
    # The reader stack, only for this kind of source.
    from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist

    parts: dict[str, list[Any]] = {f.name: [] for f in manifest.fields}
    pipeline = PipelineOptions(decode=DecodeOptions(bool(images)), batch=BatchOptions(size=1024),
                               mode="score")
    with dist.reader(name, source=LocalSource(storage.url), pipeline=pipeline) as reader:
        labels = _label_values(reader, manifest)
        for batch in reader():
            for field_name, chunk in parts.items():
                chunk.append(_batch_values(batch[field_name], field_name, images,
                                           manifest.label_field, labels))
    return parts


def _label_values(reader: Any, manifest: Manifest) -> Sequence[Any]:
    """The label each class index stands for: the reader's class values, as integers where the
    classes are numbers sorted by value; none for a dataset without labels (whose reader has
    no class values to ask for: it raises)."""
    labels: Sequence[Any] = reader.class_values if manifest.label_field else ()
    if manifest.label_order == NUMERIC_ORDER:  # integers, as classes sorted by value
        labels = [int(v) for v in labels]
    return labels


def _batch_values(values: Any, field_name: str, images: set[str], label_field: str | None,
                  labels: Sequence[Any]) -> Any:
    """One batch's values of one field, as `_dataset_table` gathers them: an image field's
    pixel array as it is (concatenated later, without a Python object per pixel), a label's
    class indexes as the labels they stand for, any other field as a list."""
    if field_name in images:
        return values
    if field_name == label_field:
        return [labels[i] for i in values.tolist()]
    return values.tolist()


def _image_array(chunks: list[np.ndarray]) -> pa.Array:
    """Batches of uint8 pixel arrays (n, ...) as one Arrow column of nested fixed-size lists,
    built on the flat values (no Python object per pixel)."""
    block = np.concatenate(chunks)
    array: pa.Array = pa.array(block.reshape(-1))
    for size in reversed(block.shape[1:]):
        array = pa.FixedSizeListArray.from_arrays(array, size)
    return array


def _decode_json_arrays(table: pa.Table) -> pa.Table:
    """Text columns whose first value is a JSON array ("[1, 2, 3]") decoded to lists: how CSV
    files and SQLite tables hold arrays."""
    for i, c in enumerate(table.column_names):
        values = table.column(c)
        if not pa.types.is_string(values.type):
            continue
        present = pc.drop_null(values)
        if len(present) and str(present[0].as_py()).lstrip().startswith("["):
            decoded = [_json_array(v, c, row) for row, v in enumerate(values.to_pylist())]
            table = table.set_column(i, c, pa.array(decoded))
    return table


def _json_array(value: str | None, column: str, row: int) -> Any:
    try:
        return json.loads(value) if value is not None else None
    except ValueError as e:
        raise PreprocessError(f"column {column!r}, row {row}: not a JSON array ({e})") from None


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise PreprocessError(f"source has no column {name!r} (columns: "
                              f"{sorted(table.column_names)})")
    return table.column(name)


def dense_array(column: pa.ChunkedArray) -> np.ndarray | None:
    """A column of equally shaped numeric (nested) lists as one numpy array (n, ...), without a
    Python object per value; None if it is not that (ragged, nulls, not numeric): the row-wise
    path then names the offending row.

    Chunk by chunk: a large column (1M rows of 3,072 values) has more values than the 32-bit
    offsets of one list array can address, so the chunks are never combined in Arrow."""
    blocks: list[np.ndarray] = []
    for chunk in column.chunks:
        if len(chunk):
            block = _dense_chunk(chunk)
            if block is None or (blocks and block.shape[1:] != blocks[0].shape[1:]):
                return None
            blocks.append(block)
    if not blocks:
        return None
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _dense_chunk(array: pa.Array) -> np.ndarray | None:
    shape = [len(array)]
    while (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)
           or pa.types.is_fixed_size_list(array.type)):
        if array.null_count or not len(array):
            return None
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        if (lengths != lengths[0]).any():
            return None
        shape.append(int(lengths[0]))
        array = pc.list_flatten(array)
    if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        return None
    if array.null_count:
        return None
    values = array.to_numpy(zero_copy_only=False)
    if len(shape) == 1:
        shape.append(1)  # a scalar per row: a 1-element array, as stack_arrays makes it
    return values.reshape(shape)


def training_preprocessor(source: Any, output_table: str,
                          dependent_varname: str | Sequence[str],
                          independent_varname: str | Sequence[str],
                          buffer_size: int | None = None,
                          normalizing_const: float | None = 1.0,
                          num_classes: int | Sequence[int | None] | None = None,
                          distribution_rules: str | Sequence[str] | None = "all",
                          num_workers: int | None = None,
                          storage: str | Storage | None = None, seed: int = 0) -> dict[str, Any]:
    """Packs `source` into buffers for training (shuffled) and returns MADlib's summary.

    As MADlib's `training_preprocessor_dl`: `dependent_varname` and `independent_varname` may
    be comma-separated ('y1, y2'); a NULL dependent value is a class of its own; `num_classes`
    (one value, or one per dependent variable) pads the one-hot width; `distribution_rules` is
    'all' / 'all_segments', 'gpu' / 'gpu_segments' or worker names. `num_workers` (MADlib's
    segment count) defaults to the number of workers named, else 1.
    """
    module = "training_preprocessor"
    args = check_arguments(module, buffer_size, normalizing_const, distribution_rules,
                           num_workers)
    y_names = split_names(dependent_varname, "dependent", module)
    x_names = split_names(independent_varname, "independent", module)
    widths = class_widths(module, num_classes, y_names)
    return _preprocess(source, output_table, y_names, x_names, args, widths, storage,
                       shuffle_seed=seed, training=None)


def validation_preprocessor(source: Any, output_table: str,
                            dependent_varname: str | Sequence[str],
                            independent_varname: str | Sequence[str],
                            training_preprocessor_table: str, buffer_size: int | None = None,
                            distribution_rules: str | Sequence[str] | None = "all",
                            num_workers: int | None = None,
                            storage: str | Storage | None = None) -> dict[str, Any]:
    """Packs a validation set with the training output's class values and normalizing constant,
    so that labels line up even where it lacks classes; not shuffled.

    As MADlib's `validation_preprocessor_dl`, dependent variables are matched to the training
    output's by position, not by name (a column `y_new` takes the classes of the training's
    `y`), and its values must be among the training's classes. `distribution_rules` are this
    output's own (MADlib's default, 'all_segments'); `num_workers` defaults to the number of
    workers named, else to the training output's.
    """
    module = "validation_preprocessor"
    store = storage if isinstance(storage, Storage) else open_storage(storage)
    trained = packed_summary(store, training_preprocessor_table)
    args = check_arguments(module, buffer_size, trained["normalizing_const"],
                           distribution_rules, num_workers, int(trained["num_workers"]))
    y_names = split_names(dependent_varname, "dependent", module)
    x_names = split_names(independent_varname, "independent", module)
    trained_names = list(trained["dependent_varname"])
    if len(y_names) != len(trained_names):
        raise PreprocessError(
            f"{module}: {len(y_names)} dependent variable(s) {y_names}, but "
            f"{training_preprocessor_table!r} was packed with {len(trained_names)} "
            f"{trained_names}; they are matched by position")
    widths = list(trained["num_classes"])
    return _preprocess(source, output_table, y_names, x_names, args, widths, store,
                       shuffle_seed=None, training=trained)


def packed_summary(storage: Storage, name: str) -> dict[str, Any]:
    """The summary stored with a packed dataset."""
    manifest = read_manifest(storage, name)
    if manifest.kind != PACKED_KIND:
        raise PreprocessError(f"dataset {name!r} is not a packed dataset (kind "
                              f"{manifest.kind!r})")
    summary: dict[str, Any] = manifest.extra["summary"]
    return summary


def source_vartypes(source: Any, table: pa.Table) -> dict[str, str]:
    """Each column's SQL type name (MADlib's `dependent_vartype`): PostgreSQL's own for a
    PostgreSQL query, else named from the Arrow type (trainfeed.preprocess.sqltypes)."""
    named = source.column_types() if hasattr(source, "column_types") else {}
    return {field.name: named.get(field.name) or arrow_sql_type(field.type)
            for field in table.schema}


def _dependent_classes(module: str, name: str, values: list[Any], vartype: str,
                       width: int | None, training: dict[str, Any] | None,
                       position: int) -> tuple[list[Any] | None, int | None]:
    """A dependent variable's class values and num_classes; both None for numeric arrays,
    which are taken as already one-hot.

    Training: the column's own sorted classes, NULL included, padded to `width`. Validation:
    the training output's classes at the same position (MADlib matches by position), after
    checking the column holds no other class.

    For arrays, num_classes is NULL as in MADlib's summary (its install check asserts
    `class_values IS NULL AND num_classes IS NULL` for `double precision[]` and `integer[]`
    labels): the width is the arrays' own, and each buffer's `<name>_shape` says it. A
    `width` given anyway must equal the arrays' width."""
    if is_array_type(vartype):
        if training is not None and training["class_values"].get(
                training["dependent_varname"][position]) is not None:
            raise PreprocessError(
                f"{module}: column {name!r} holds arrays ({vartype}), but dependent variable "
                f"{position} of {training['output_table']!r} has class values: pass the "
                f"column of class values")
        one = stack_arrays(values[:1], name, 1.0, None, ONE_HOT_DTYPE)
        size = int(one[0].size)
        if width is not None and width != size:
            raise PreprocessError(
                f"{module}: num_classes is {width} for column {name!r}, but its one-hot "
                f"arrays ({vartype}) have {size} values")
        return None, None
    if training is None:
        classes = class_values(values, name, width)
        return classes, len(classes)
    trained_name = training["dependent_varname"][position]
    trained: list[Any] | None = training["class_values"].get(trained_name)
    if trained is None:
        raise PreprocessError(
            f"{module}: column {name!r} holds class values ({vartype}), but dependent "
            f"variable {trained_name!r} of {training['output_table']!r} was one-hot arrays: "
            f"pass a column of arrays")
    unknown = unknown_classes(values, trained, name)
    if unknown:
        raise PreprocessError(
            f"{module}: the class values in column {name!r} ({unknown[:10]}) should be a "
            f"subset of the class values of {trained_name!r} in "
            f"{training['output_table']!r} ({real_classes(trained)[:10]})")
    return list(trained), len(trained)


def _preprocess(source: Any, output_table: str, y_names: list[str], x_names: list[str],
                args: Arguments, widths: list[int | None], storage: str | Storage | None,
                shuffle_seed: int | None, training: dict[str, Any] | None) -> dict[str, Any]:
    module = "training_preprocessor" if training is None else "validation_preprocessor"
    validate_dataset_name(output_table)
    store = storage if isinstance(storage, Storage) else open_storage(storage)
    check_name_is_free(store, output_table)
    table, source_name = load_source(source, store, ordered=shuffle_seed is None)
    for name in y_names + x_names:
        _column(table, name)  # every missing column is named before any work
    all_vartypes = source_vartypes(source, table)
    vartypes = {n: all_vartypes[n] for n in y_names}
    ys = {n: _column(table, n).to_pylist() for n in y_names}
    rows = table.num_rows
    dense, xs = _independent_columns(table, x_names)
    del table  # the source's columns: the dense blocks hold what is needed, once
    if rows == 0:
        raise PreprocessError(f"source {source_name} has no rows")
    classes, num_classes = _all_dependent_classes(module, y_names, ys, vartypes, widths,
                                                  training)
    order = (np.random.default_rng(shuffle_seed).permutation(rows) if shuffle_seed is not None
             else np.arange(rows))
    values_per_row = [int(stack_arrays(xs[n][:1], n)[0].size) for n in x_names]
    sizes = plan_buffers(rows, args.num_workers, args.buffer_size, values_per_row)

    summary = {
        "source_table": source_name, "output_table": output_table,
        "dependent_varname": y_names, "independent_varname": x_names,
        "dependent_vartype": [vartypes[n] for n in y_names],
        "class_values": {n: classes[n] for n in y_names},
        # MADlib's summary has one "<dependent>_class_values" column per dependent variable.
        **{f"{n}_class_values": classes[n] for n in y_names},
        "buffer_size": sizes[0], "normalizing_const": args.normalizing_const,
        "num_classes": num_classes,
        "distribution_rules": args.rules.madlib_value,
        "__internal_gpu_config__": args.rules.gpu_config,
        "num_workers": args.num_workers, "num_buffers": len(sizes), "num_rows": rows,
    }
    tensors = _tensor_dtypes(x_names, y_names)
    encoder = _BufferEncoder(x_names, y_names, dense, xs, ys, classes, args.normalizing_const)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    buffers = (encoder.encode(order[bounds[i]:bounds[i + 1]]) for i in range(len(sizes)))
    _write(store, output_table, x_names + y_names, buffers, summary, tensors)
    return summary


def _all_dependent_classes(module: str, y_names: list[str], ys: dict[str, list[Any]],
                           vartypes: dict[str, str], widths: list[int | None],
                           training: dict[str, Any] | None
                           ) -> tuple[dict[str, list[Any] | None], list[int | None]]:
    """`_dependent_classes` of every dependent variable, in order: their class values by
    name, and the summary's `num_classes` list."""
    classes: dict[str, list[Any] | None] = {}
    num_classes: list[int | None] = []
    for i, name in enumerate(y_names):
        classes[name], width = _dependent_classes(module, name, ys[name], vartypes[name],
                                                  widths[i], training, i)
        num_classes.append(width)
    return classes, num_classes


def _tensor_dtypes(x_names: list[str], y_names: list[str]) -> dict[str, str]:
    """The dtype of each variable's arrays, for the manifest: normalized float32 independent
    variables, one-hot dependent ones."""
    return {**{n: "float32" for n in x_names},
            **{n: np.dtype(ONE_HOT_DTYPE).name for n in y_names}}


def _independent_columns(table: pa.Table, x_names: list[str]
                         ) -> tuple[dict[str, np.ndarray | None],
                                    dict[str, Sequence[Any] | np.ndarray]]:
    """Each independent column as a dense block where it is one (`dense_array`, else None),
    and as the values `_BufferEncoder` stacks: the block itself, or row-wise lists only where
    the fast path does not apply (they give row-level errors; a dense block's own rows serve
    that purpose for it)."""
    dense: dict[str, np.ndarray | None] = {}
    xs: dict[str, Sequence[Any] | np.ndarray] = {}
    for name in x_names:
        block = dense[name] = dense_array(_column(table, name))
        xs[name] = _column(table, name).to_pylist() if block is None else block
    return dense, xs


class _BufferEncoder:
    """Encodes the source rows of one buffer: per variable its stacked array's bytes, then
    per variable its shape as JSON (the buffer's record, fields in `_write`'s order).

    Independent variables come from their dense block, normalized at once, where there is one
    and every value is finite; else row by row, which names the first bad source row.
    Dependent variables become one-hot arrays over their classes, or are stacked as they are
    where they are arrays already (no classes)."""

    def __init__(self, x_names: list[str], y_names: list[str],
                 dense: dict[str, np.ndarray | None], xs: dict[str, Sequence[Any] | np.ndarray],
                 ys: dict[str, list[Any]], classes: dict[str, list[Any] | None],
                 normalizing_const: float) -> None:
        self.x_names, self.y_names = x_names, y_names
        self.dense, self.xs, self.ys = dense, xs, ys
        self.classes = classes
        self.normalizing_const = normalizing_const

    def encode(self, picked: np.ndarray) -> list[bytes | str]:
        """The record of the buffer holding source rows `picked`, in that order."""
        row_ids = picked.tolist()  # source rows, for errors
        arrays = ([self._independent(name, picked, row_ids) for name in self.x_names]
                  + [self._dependent(name, picked, row_ids) for name in self.y_names])
        values: list[bytes | str] = [array.tobytes() for array in arrays]
        shapes: list[bytes | str] = [json.dumps(list(array.shape)) for array in arrays]
        return values + shapes

    def _independent(self, name: str, picked: np.ndarray, row_ids: list[int]) -> np.ndarray:
        block = self.dense[name]
        if block is not None:
            array = normalize(block[picked], self.normalizing_const)
            if np.isfinite(array).all():
                return array
            # else the row-wise path names the row
        return stack_arrays([self.xs[name][i] for i in picked], name, self.normalizing_const,
                            row_ids)

    def _dependent(self, name: str, picked: np.ndarray, row_ids: list[int]) -> np.ndarray:
        picked_values = [self.ys[name][i] for i in picked]
        known = self.classes[name]
        if known is None:
            return stack_arrays(picked_values, name, 1.0, row_ids, ONE_HOT_DTYPE)
        return one_hot(picked_values, known, name, row_ids)


def normalize(block: np.ndarray, normalizing_const: float) -> np.ndarray:
    """`block / normalizing_const` as float32, equal to dividing in float64 and rounding once.

    When the values and the constant are exact in float32 (8- and 16-bit integers, float32),
    dividing in float32 is that same correctly rounded result (double rounding is harmless for
    a division when the wider format has at least 2p+2 bits, 53 ≥ 2·24+2) without a float64
    temporary twice the output's size; otherwise the division goes through float64.
    """
    const32 = np.float32(normalizing_const)
    if block.dtype in _EXACT_IN_FLOAT32 and float(const32) == float(normalizing_const):
        return np.divide(block, const32, dtype=np.float32)
    return np.divide(block, normalizing_const, dtype=np.float64).astype(np.float32)


_EXACT_IN_FLOAT32 = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.float32)}


def _write(store: Storage, name: str, tensor_names: list[str],
           buffers: Iterable[list[bytes | str]], summary: dict[str, Any],
           tensors: dict[str, str]) -> None:
    """Writes buffers as they are encoded, a shard at a time, then the manifest.

    Memory stays at one shard's buffers however large the output. A bad row found while
    encoding stops the run before the manifest: the shards already written, in this run's own
    fresh folder that no manifest names, are removed, so nothing is published.
    """
    fields = tuple([FieldSpec(n, "binary") for n in tensor_names]
                   + [FieldSpec(n + SHAPE_SUFFIX, "string") for n in tensor_names])
    folder = dataset_storage(store, name)
    # A fresh folder per run; the fingerprint comes from the shards' checksums (computed anyway)
    # rather than from hashing every buffer once more.
    data_dir = f"data/{uuid.uuid4().hex[:16]}"
    try:
        infos = _write_shards(folder, data_dir, fields, buffers)
    except BaseException:
        if folder.exists(data_dir):
            folder.fs.rm(folder.path(data_dir), recursive=True)
        raise
    manifest = Manifest(
        name=name, kind=PACKED_KIND, fields=fields, label_field=None,
        num_records=sum(s.num_rows for s in infos),
        num_bytes=sum(g.num_bytes for s in infos for g in s.row_groups),
        shards=tuple(infos), label_histogram={}, fingerprint=_fingerprint(summary, infos),
        source=str(summary["source_table"]),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        extra={"summary": summary, "tensors": tensors})
    manifest.check()
    write_manifest(store, manifest)
    remove_stale_data(folder, keep=data_dir)  # an earlier packing of the same name


def _write_shards(folder: Storage, data_dir: str, fields: tuple[FieldSpec, ...],
                  buffers: Iterable[list[bytes | str]]) -> list[shard_format.ShardInfo]:
    """Writes the buffers into shards under `data_dir`, each buffer its own row group (record
    id: its position), closing a shard at BUFFERS_PER_SHARD buffers or SHARD_TARGET_BYTES of
    payload, whichever comes first; their infos, in order."""
    schema = shard_format.arrow_schema(fields)
    infos: list[shard_format.ShardInfo] = []
    groups: list[shard_format.RowGroupBuffer] = []

    def flush() -> None:
        infos.append(shard_format.write_shard(
            folder, f"{data_dir}/shard-{len(infos):05d}.parquet", schema, groups))
        groups.clear()

    for buffer_id, values in enumerate(buffers):
        group = shard_format.RowGroupBuffer.empty(len(fields))
        group.add(buffer_id, values, sum(len(v) for v in values if isinstance(v, bytes)))
        groups.append(group)
        if (len(groups) == BUFFERS_PER_SHARD
                or sum(g.payload_bytes for g in groups) >= SHARD_TARGET_BYTES):
            flush()
    if groups:
        flush()
    return infos


def _fingerprint(summary: dict[str, Any], infos: list[shard_format.ShardInfo]) -> str:
    """The packed dataset's fingerprint: its summary and its shards' checksums, so a packing
    of other rows or with other settings differs."""
    digest = hashlib.sha256(json.dumps(summary, sort_keys=True).encode())
    for info in infos:
        digest.update(info.sha256.encode())
    return digest.hexdigest()
