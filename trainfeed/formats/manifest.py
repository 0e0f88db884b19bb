"""The dataset manifest: the single source of truth for what a dataset is.

A dataset folder holds Parquet shards and `manifest.json`. The manifest is written last and
atomically, so a dataset exists for readers exactly when its manifest does: an interrupted upload
is invisible. It records the schema, every shard with its row-group boundaries, row and byte
counts, per-shard SHA-256, the label histogram and the order of its labels (which class ids follow).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trainfeed.errors import CorruptDatasetError, DatasetNotFoundError, InvalidNameError
from trainfeed.formats.labels import STRING_ORDER, sorted_labels
from trainfeed.names import validate_dataset_name
from trainfeed.storage import Storage

MANIFEST_NAME = "manifest.json"
FORMAT = "trainfeed.dataset"
VERSION = 1
# Dataset kinds beyond uploaded lists: records are MADlib-style buffers (trainfeed.preprocess),
# or rows of a SQL query read from its database in hash buckets (trainfeed.sql.dataset).
PACKED_KIND = "packed"
SQL_KIND = "sql"
# Reserved Parquet column with the stable record id (the instance's ordinal in the .list file).
ID_COLUMN = "_id"


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str  # "binary" (raw file bytes) or "string"


@dataclass(frozen=True)
class RowGroupInfo:
    num_rows: int
    num_bytes: int  # payload bytes (file bytes and UTF-8 text) of its rows
    first_id: int


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset folder
    num_rows: int
    num_bytes: int  # size of the Parquet file
    sha256: str
    row_groups: tuple[RowGroupInfo, ...]
    # A .npy beside the shard: per row and binary field, the byte offset and length of the
    # value inside the shard file, so that a reader can fetch chosen payloads by byte range.
    # None for shards written before it existed (they are read by whole row groups).
    payload_index: str | None = None


@dataclass(frozen=True)
class Manifest:
    """What a published dataset holds. Immutable; build a new one to change anything."""

    name: str
    kind: str
    fields: tuple[FieldSpec, ...]
    label_field: str | None
    num_records: int
    num_bytes: int  # payload bytes
    shards: tuple[ShardInfo, ...]
    label_histogram: dict[str, int]
    fingerprint: str
    source: str
    created_at: str
    skipped: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # Path (in the dataset folder) of the records' sources: file and list line per record id
    # (trainfeed.formats.sources); None for datasets uploaded before it existed, or not from a list.
    sources: str | None = None
    # The order of the labels that class ids follow (trainfeed.formats.labels): "numeric" for a
    # dataset uploaded with integer labels, "string" otherwise and for manifests written before
    # the field existed, so that their class ids stay what their models were trained with.
    label_order: str = STRING_ORDER

    def to_json(self) -> bytes:
        body = {"format": FORMAT, "version": VERSION, **asdict(self)}
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "manifest") -> Manifest:
        try:
            raw = json.loads(data)
            if raw.pop("format", None) != FORMAT:
                raise ValueError(f"not a {FORMAT} manifest")
            version = raw.pop("version", None)
            if version != VERSION:
                raise ValueError(f"manifest version {version!r}, this trainfeed reads {VERSION}")
            raw["fields"] = tuple(FieldSpec(**f) for f in raw["fields"])
            raw["shards"] = tuple(
                ShardInfo(**{**s, "row_groups": tuple(RowGroupInfo(**g) for g in s["row_groups"])})
                for s in raw["shards"])
            raw["skipped"] = tuple(raw.get("skipped", ()))
            manifest = cls(**raw)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptDatasetError(f"{where}: unreadable manifest: {e}") from e
        manifest.check()
        return manifest

    def check(self) -> None:
        """Raises CorruptDatasetError if the counts do not add up, or the label order is
        unknown or does not fit the labels."""
        try:
            sorted_labels(self.label_histogram, self.label_order)
        except ValueError as e:
            raise CorruptDatasetError(f"dataset {self.name!r}: manifest label_order: {e}") from None
        if self.kind == SQL_KIND:  # rows live in a database; the count is the query's at the time
            return
        rows = sum(s.num_rows for s in self.shards)
        if rows != self.num_records or any(
                sum(g.num_rows for g in s.row_groups) != s.num_rows for s in self.shards):
            raise CorruptDatasetError(
                f"dataset {self.name!r}: manifest row counts do not add up ({rows} rows in shards, "
                f"{self.num_records} declared)")

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def num_row_groups(self) -> int:
        return sum(len(s.row_groups) for s in self.shards)


def dataset_storage(storage: Storage, name: str) -> Storage:
    """The folder of dataset `name` (validated, so it cannot escape the storage root)."""
    return storage.child(validate_dataset_name(name))


def read_manifest(storage: Storage, name: str) -> Manifest:
    """Loads the manifest of dataset `name`, raising DatasetNotFoundError if it is not published."""
    folder = dataset_storage(storage, name)
    try:
        data = folder.read_bytes(MANIFEST_NAME)
    except FileNotFoundError:
        known = list_datasets(storage)
        hint = f"; datasets here: {', '.join(known)}" if known else "; this storage has none"
        raise DatasetNotFoundError(
            f"no dataset {name!r} in {storage.url} (no {MANIFEST_NAME}; an upload that did not "
            f"finish is not published){hint}") from None
    return Manifest.from_json(data, where=f"{folder.url}/{MANIFEST_NAME}")


def check_name_is_free(storage: Storage, name: str) -> None:
    """Refuses a dataset name that would nest inside another dataset's folder, or hold one.

    `dup/data` once landed inside dataset `dup` (its data folder) and was deleted when `dup` was
    re-uploaded. A name's first segment is either a dataset or a namespace, never both.
    """
    head, _, tail = name.partition("/")
    if tail and storage.exists(f"{head}/{MANIFEST_NAME}"):
        raise InvalidNameError(f"dataset name {name!r} would lie inside dataset {head!r}'s "
                               f"folder; choose a name outside it")
    if not tail:
        nested = [n for n in list_datasets(storage) if n.startswith(f"{name}/")]
        if nested:
            raise InvalidNameError(f"{name!r} is a namespace holding dataset(s) "
                                   f"{', '.join(nested[:5])}; choose another dataset name")


def write_manifest(storage: Storage, manifest: Manifest) -> None:
    """Publishes `manifest` atomically: the last step of an upload. Writers check the name
    before writing any data (check_name_is_free); this is the last guard."""
    check_name_is_free(storage, manifest.name)
    dataset_storage(storage, manifest.name).write_atomic(MANIFEST_NAME, manifest.to_json())


def list_datasets(storage: Storage) -> list[str]:
    """Names of the published datasets (one namespace deep, e.g. `public/digits`), sorted."""
    fs = storage.fs
    names = []
    for pattern in (f"*/{MANIFEST_NAME}", f"*/*/{MANIFEST_NAME}"):
        try:
            found = fs.glob(storage.path(pattern))
        except FileNotFoundError:
            found = []
        for path in found:
            rel = path[len(storage.root):].strip("/")
            names.append(rel.rsplit("/", 1)[0])
    return sorted(set(names))
