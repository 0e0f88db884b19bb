"""The dataset manifest: the single source of truth for what a dataset is.

A dataset folder holds Parquet shards and `manifest.json`. The manifest is written last and
atomically, so a dataset exists for readers exactly when its manifest does: an interrupted upload
is invisible. It records the schema, every shard with its row-group boundaries, row and byte
counts, per-shard SHA-256, the label histogram and the order of its labels (which class ids follow).
Class ids are stable across versions: an append keeps every label's id and gives a new label the
next one (`class_values`, written where it is not the label order's own: see `classes`).

Versions. A dataset grows by appends (`trainfeed upload --append`), each a new version numbered
1, 2, ...: its manifest lists the previous version's shards, unchanged, plus the new ones. Every
version's manifest is kept, immutable, as `versions/<n>.json`; `manifest.json` is the current
version, written after it (both atomically), so a version exists for readers exactly when
`manifest.json` names it or a later one. A reader or job pins the version it opened
(`read_manifest(..., version=n)`), and keeps reading it while later versions are published:
their shards are never rewritten. `--overwrite` publishes the next number too (numbers are never
reused, so a checkpoint of replaced content cannot restore into the new one); the versions it
replaced are deleted with their shards. Datasets published before versions are version 1, and
have no `versions/` folder until their first append.

    <dataset>/manifest.json            the current version (n)
    <dataset>/versions/<k>.json        version k, for every k still readable (≤ n)
    <dataset>/data/<fingerprint>/...   each upload's or append's shards, never rewritten
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainfeed.errors import CorruptDatasetError, DatasetNotFoundError, InvalidNameError
from trainfeed.formats.confine import path_problem
from trainfeed.formats.labels import STRING_ORDER, sorted_labels
from trainfeed.names import check_new_dataset_name, validate_dataset_name
from trainfeed.storage import Storage

MANIFEST_NAME = "manifest.json"
# The folder of the immutable per-version manifests: versions/<n>.json.
VERSIONS_DIR = "versions"
FORMAT = "trainfeed.dataset"
# The manifest format's version: 1, or 2 for a dataset with raw pixel records (`extra` has
# RAW_PIXELS: `upload --raw-below`), which readers before version 2 cannot read: they refuse
# it by its version ("manifest version 2, this trainfeed reads 1") instead of handing raw
# records to a JPEG decoder. A dataset without raw records stays version 1, readable by all.
VERSION = 1
RAW_PIXELS_VERSION = 2
READABLE_VERSIONS = (VERSION, RAW_PIXELS_VERSION)
RAW_PIXELS = "raw_pixels"
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
class VersionInfo:
    """One published version of a dataset, as its history in later manifests lists it."""

    version: int
    created_at: str
    added_records: int  # records this version added (all of them for the first)
    source: str  # the basename of the list it came from
    sources: str | None  # its records' sources file (trainfeed.formats.sources)
    fingerprint: str  # the dataset's fingerprint at this version


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
    # This manifest's version of the dataset (see the module docstring): 1 for manifests written
    # before versions existed.
    dataset_version: int = 1
    # One past the largest record id (an append numbers its records from here, so that ids stay
    # unique and stable across versions); None for manifests written before it (`id_limit`).
    next_id: int | None = None
    # The readable versions up to this one, oldest first (() before versions existed).
    versions: tuple[VersionInfo, ...] = ()
    # The labels behind class ids 0..K-1, where an append made them differ from the label
    # order's sort (its new labels come after the old ones, whose ids stay); None: the labels
    # sorted by `label_order` (a fresh upload, and every manifest written before this field).
    class_values: tuple[str, ...] | None = None

    def to_json(self) -> bytes:
        """The manifest's bytes. The version fields are left out where they say what a reader
        infers without them (`dataset_version` 1, `next_id` of `id_limit`, `versions` of
        `history`): a dataset never appended to is read by trainfeed releases before versions
        too, which refuse a manifest with keys they do not know."""
        body = {"format": FORMAT, "version": self.format_version, **asdict(self)}
        if self.dataset_version == 1:
            del body["dataset_version"]
        if self.next_id is None or self.next_id == self.num_records + len(self.skipped):
            del body["next_id"]
        if self.versions == () or self.versions == replace(self, versions=()).history:
            del body["versions"]
        if self.class_values is None:
            del body["class_values"]
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @property
    def format_version(self) -> int:
        """The manifest format version its bytes carry: RAW_PIXELS_VERSION for a dataset with
        raw pixel records, which older readers must refuse, else VERSION."""
        return RAW_PIXELS_VERSION if RAW_PIXELS in self.extra else VERSION

    @classmethod
    def from_json(cls, data: bytes, where: str = "manifest") -> Manifest:
        try:
            raw = json.loads(data)
            if raw.pop("format", None) != FORMAT:
                raise ValueError(f"not a {FORMAT} manifest")
            version = raw.pop("version", None)
            if version not in READABLE_VERSIONS:
                raise ValueError(f"manifest version {version!r}, this trainfeed reads "
                                 f"{', '.join(map(str, READABLE_VERSIONS))}: upgrade trainfeed "
                                 f"to read this dataset")
            if (version == RAW_PIXELS_VERSION) != (RAW_PIXELS in raw.get("extra", {})):
                raise ValueError(f"manifest version {version} "
                                 f"{'without' if version == RAW_PIXELS_VERSION else 'with'} "
                                 f"extra.{RAW_PIXELS}: version {RAW_PIXELS_VERSION} is exactly "
                                 f"a dataset with raw pixel records")
            raw["fields"] = tuple(FieldSpec(**f) for f in raw["fields"])
            raw["shards"] = tuple(
                ShardInfo(**{**s, "row_groups": tuple(RowGroupInfo(**g) for g in s["row_groups"])})
                for s in raw["shards"])
            raw["skipped"] = tuple(raw.get("skipped", ()))
            raw["versions"] = tuple(VersionInfo(**v) for v in raw.get("versions", ()))
            if raw.get("class_values") is not None:
                values = raw["class_values"]
                if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                    raise ValueError(f"class_values must be a list of labels, got "
                                     f"{str(values)[:80]}")
                raw["class_values"] = tuple(values)
            manifest = cls(**raw)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptDatasetError(f"{where}: unreadable manifest: {e}") from e
        manifest.check()
        manifest.check_paths(where)
        return manifest

    @property
    def named_paths(self) -> list[tuple[str, object]]:
        """Every file path this manifest names, with what names it (for errors): the files a
        reader or the master opens because the manifest said so."""
        named: list[tuple[str, object]] = []
        for i, s in enumerate(self.shards):
            named.append((f"shards[{i}].path", s.path))
            if s.payload_index is not None:
                named.append((f"shards[{i}].payload_index", s.payload_index))
        if self.sources is not None:
            named.append(("sources", self.sources))
        named += [(f"versions[{i}].sources", v.sources) for i, v in enumerate(self.versions)
                  if v.sources is not None]
        return named

    def check_paths(self, where: str = "manifest") -> None:
        """Raises CorruptDatasetError, naming the dataset, the manifest (`where`) and the
        path, unless every path it names lies inside the dataset's folder
        (trainfeed.formats.confine): checked at load, before any of them is opened."""
        for key, path in self.named_paths:
            problem = path_problem(path)
            if problem is not None:
                shown = repr(path)[:200] if isinstance(path, str) else repr(path)[:80]
                raise CorruptDatasetError(
                    f"dataset {self.name!r}: {where}: {key} is {shown}: {problem}; a manifest "
                    f"names files inside its dataset's folder only (was it edited by hand? "
                    f"upload the dataset again)")

    def check(self) -> None:
        """Raises CorruptDatasetError if the counts do not add up, the label order is
        unknown or does not fit the labels, or `class_values` are not the labels, each once."""
        try:
            sorted_labels(self.label_histogram, self.label_order)
        except ValueError as e:
            raise CorruptDatasetError(f"dataset {self.name!r}: manifest label_order: {e}") from None
        if self.class_values is not None and (
                len(set(self.class_values)) != len(self.class_values)
                or set(self.class_values) != set(self.label_histogram)):
            raise CorruptDatasetError(
                f"dataset {self.name!r}: manifest class_values {list(self.class_values)[:10]} "
                f"are not the labels of its histogram {list(self.label_histogram)[:10]}, each "
                f"once (was it edited by hand? upload the dataset again)")
        if self.kind == SQL_KIND:  # rows live in a database; the count is the query's at the time
            return
        rows = sum(s.num_rows for s in self.shards)
        if rows != self.num_records or any(
                sum(g.num_rows for g in s.row_groups) != s.num_rows for s in self.shards):
            raise CorruptDatasetError(
                f"dataset {self.name!r}: manifest row counts do not add up ({rows} rows in shards, "
                f"{self.num_records} declared)")

    @property
    def classes(self) -> tuple[str, ...]:
        """The labels behind class ids 0..K-1: `class_values` where an append recorded them,
        else the labels sorted by `label_order` (() for a dataset without labels)."""
        if self.class_values is not None:
            return self.class_values
        return tuple(sorted_labels(self.label_histogram, self.label_order))

    @property
    def id_limit(self) -> int:
        """One past the largest record id: `next_id`, or for a manifest without it an upper
        bound (ids are list ordinals: one per record or skipped line, comments aside)."""
        if self.next_id is not None:
            return self.next_id
        return self.num_records + len(self.skipped)

    @property
    def history(self) -> tuple[VersionInfo, ...]:
        """The readable versions, oldest first; a manifest written before versions is its own
        version 1."""
        return self.versions or (VersionInfo(self.dataset_version, self.created_at,
                                             self.num_records, self.source, self.sources,
                                             self.fingerprint),)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def num_row_groups(self) -> int:
        return sum(len(s.row_groups) for s in self.shards)


def dataset_storage(storage: Storage, name: str) -> Storage:
    """The folder of dataset `name` (validated, so it cannot escape the storage root)."""
    return storage.child(validate_dataset_name(name))


def version_path(version: int) -> str:
    """Where version `version`'s manifest is, in the dataset's folder."""
    return f"{VERSIONS_DIR}/{version}.json"


def read_manifest(storage: Storage, name: str, version: int | None = None) -> Manifest:
    """Loads the manifest of dataset `name`: its current version, or `version`.

    Raises:
        DatasetNotFoundError: the dataset is not published, or has no readable version
            `version` (not published yet, or replaced by an --overwrite): names the ones it has.
    """
    folder = dataset_storage(storage, name)
    try:
        return load_manifest(folder, version)
    except FileNotFoundError:
        known = list_datasets(storage)
        hint = f"; datasets here: {', '.join(known)}" if known else "; this storage has none"
        raise DatasetNotFoundError(
            f"no dataset {name!r} in {storage.url} (no {MANIFEST_NAME}; an upload that did not "
            f"finish is not published){hint}") from None


def load_manifest(folder: Storage, version: int | None = None) -> Manifest:
    """The manifest in dataset folder `folder`: its current version, or `version` if that is
    published (the current one or an earlier one its history lists).

    Raises:
        FileNotFoundError: no dataset is published there.
        DatasetNotFoundError: no readable version `version` (naming those there are).
    """
    current = Manifest.from_json(folder.read_bytes(MANIFEST_NAME),
                                 where=f"{folder.url}/{MANIFEST_NAME}")
    if version is None or version == current.dataset_version:
        return current
    readable = [v.version for v in current.history]
    if version in readable:
        try:
            return Manifest.from_json(folder.read_bytes(version_path(version)),
                                      where=f"{folder.url}/{version_path(version)}")
        except FileNotFoundError:
            pass
    raise DatasetNotFoundError(
        f"dataset {current.name!r} in {folder.url} has no version {version}: its readable "
        f"versions are {', '.join(map(str, readable))} (the current one is "
        f"{current.dataset_version}; `trainfeed info {current.name}` lists them)")


def split_version(spec: str) -> tuple[str, int | None]:
    """'flowers@3' -> ('flowers', 3); 'flowers' -> ('flowers', None): how a reader asks for
    one version of a dataset (none: the current one).

    Raises:
        InvalidNameError: a version that is not a whole number ≥ 1.
    """
    if not isinstance(spec, str) or "@" not in spec:
        return spec, None
    name, _, version = spec.rpartition("@")
    if not version.isdigit() or int(version) < 1:
        raise InvalidNameError(f"invalid dataset version in {spec!r}: write NAME@N with N a "
                               f"version number ≥ 1 (`trainfeed info {name}` lists them)")
    return name, int(version)


def check_name_is_free(storage: Storage, name: str) -> None:
    """Refuses a dataset name that would nest inside another dataset's folder, or hold one.

    `dup/data` once landed inside dataset `dup` (its data folder) and was deleted when `dup` was
    re-uploaded. A name's first segment is either a dataset or a namespace, never both, and a
    dataset segment is never one of a dataset folder's own entries (`data`, `versions`, ...:
    trainfeed.names.check_new_dataset_name). Uploads run it again under the storage's publish
    lock as they publish (trainfeed.ingest.lock.PublishLock): two nested names uploaded at once
    cannot both pass.
    """
    check_new_dataset_name(name)
    head, _, tail = name.partition("/")
    if tail and storage.exists(f"{head}/{MANIFEST_NAME}"):
        raise InvalidNameError(f"dataset name {name!r} would lie inside dataset {head!r}'s "
                               f"folder; choose a name outside it")
    if not tail:
        nested = [n for n in list_datasets(storage) if n.startswith(f"{name}/")]
        if nested:
            raise InvalidNameError(f"{name!r} is a namespace holding dataset(s) "
                                   f"{', '.join(map(repr, nested[:5]))}; choose another "
                                   f"dataset name")


def write_manifest(storage: Storage, manifest: Manifest) -> None:
    """Publishes `manifest` atomically: the last step of an upload. Writers check the name
    before writing any data (check_name_is_free); this is the last guard.

    Its version's immutable copy is written first, then `manifest.json`: a writer killed
    between the two published nothing (readers find a version through `manifest.json` only),
    and a re-run writes the same version again."""
    check_name_is_free(storage, manifest.name)
    folder = dataset_storage(storage, manifest.name)
    data = manifest.to_json()
    if manifest.kind != SQL_KIND:
        folder.write_atomic(version_path(manifest.dataset_version), data)
    folder.write_atomic(MANIFEST_NAME, data)


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
