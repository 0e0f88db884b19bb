"""The last step of an upload: the manifest, built from every shard's progress record and
written atomically (a dataset exists for readers exactly when its manifest does), then the
data of earlier uploads of the name removed.

An append (`upload --append`) builds the next version on the current one (`for_append`,
`check_appendable`): the new list's records are numbered after the dataset's largest id, its
shards go to their own folder, and the new manifest lists the old shards, unchanged, then the
new ones (trainfeed.formats.manifest, "Versions")."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence

from trainfeed.errors import AppendMismatchError
from trainfeed.formats.labels import NUMERIC_ORDER, label_order, sorted_labels
from trainfeed.formats.manifest import (
    MANIFEST_NAME,
    RAW_PIXELS,
    VERSIONS_DIR,
    FieldSpec,
    Manifest,
    VersionInfo,
    version_path,
)
from trainfeed.formats.sources import write_sources
from trainfeed.ingest.inputs import DATA_DIR, Inputs
from trainfeed.ingest.progress import ShardProgress
from trainfeed.names import RESERVED_SEGMENTS
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)


def published_manifest(folder: Storage) -> Manifest | None:
    """The current manifest of the dataset in `folder`, or None if none is published."""
    try:
        data = folder.read_bytes(MANIFEST_NAME)
    except FileNotFoundError:
        return None
    return Manifest.from_json(data, where=f"{folder.url}/{MANIFEST_NAME}")


def append_fingerprint(base: str, list_fingerprint: str) -> str:
    """The fingerprint of an append of a list (by its own fingerprint) to a dataset version
    (by its fingerprint): it names the append's shard folder, so a killed append resumes, and
    an append to another version (other record ids) packs afresh."""
    return hashlib.sha256(f"{base}+{list_fingerprint}".encode()).hexdigest()


def already_appended(base: Manifest, list_fingerprint: str) -> bool:
    """Whether `base`, the current version, is the append of this very list (a re-run of an
    append that was published: nothing to do, as for a re-run upload)."""
    history = base.history
    return (len(history) >= 2 and append_fingerprint(history[-2].fingerprint, list_fingerprint)
            == base.fingerprint)


def for_append(inputs: Inputs, base: Manifest) -> Inputs:
    """`inputs` as the next version of `base`: record ids numbered from `base.id_limit` (ids
    stay unique and stable across versions), and the append's fingerprint."""
    offset = base.id_limit
    entries = tuple(dataclasses.replace(e, record_id=e.record_id + offset)
                    for e in inputs.entries)
    return dataclasses.replace(inputs, entries=entries,
                               fingerprint=append_fingerprint(base.fingerprint,
                                                              inputs.fingerprint))


def check_appendable(base: Manifest, inputs: Inputs, fields: tuple[FieldSpec, ...],
                     extra: dict[str, object]) -> None:
    """Refuses an append whose records would not fit `base`'s: another kind of list, other
    fields (named), other stored transforms.

    Raises:
        AppendMismatchError: before anything is written.
    """
    parsed, where = inputs.parsed, f"{inputs.parsed.path}: cannot append to dataset {base.name!r}"
    if parsed.kind != base.kind:
        raise AppendMismatchError(f"{where}: it is a {base.kind!r} dataset, this is a "
                                  f"{parsed.kind!r} list; pass --kind {base.kind}")
    _check_same_fields(base, fields, where)
    label = parsed.field_names[parsed.label_index] if parsed.label_index is not None else None
    if label != base.label_field:
        raise AppendMismatchError(f"{where}: its label field is {label!r}, the dataset's "
                                  f"{base.label_field!r}")
    _check_same_transforms(base, extra, where)


def _check_same_fields(base: Manifest, fields: tuple[FieldSpec, ...], where: str) -> None:
    """Refuses a list whose fields are not the dataset's, in the dataset's order: a record
    of the new shards is read with the manifest's one schema. The first difference is named:
    a field the dataset lacks, then one the list lacks, then the order."""
    theirs = {f.name: f.type for f in base.fields}
    mine = {f.name: f.type for f in fields}
    for name in mine:
        if name not in theirs:
            raise AppendMismatchError(
                f"{where}: field {name!r} is not one of the dataset's fields "
                f"({', '.join(theirs)}); give the list the dataset's columns (--columns "
                f"{','.join(theirs)})")
    for name in theirs:
        if name not in mine:
            raise AppendMismatchError(
                f"{where}: the list has no field {name!r}, which the dataset's records have "
                f"(fields {', '.join(theirs)}); give the list the dataset's columns")
    if tuple(mine) != tuple(theirs):
        raise AppendMismatchError(
            f"{where}: the list's fields are in the order {', '.join(mine)}, the dataset's "
            f"{', '.join(theirs)}; give the columns in the dataset's order")


def _check_same_transforms(base: Manifest, extra: dict[str, object], where: str) -> None:
    """Refuses an upload that would store its images otherwise than the dataset did (resized,
    re-encoded, raw pixels): one manifest describes how every shard's images were stored."""
    stored = {k: base.extra[k] for k in extra.keys() | {"resized", RAW_PIXELS}
              if k in base.extra}
    if stored != extra:
        raise AppendMismatchError(
            f"{where}: the dataset's images were stored with {stored or 'no transform'}, this "
            f"upload would store {extra or 'no transform'}; use the dataset's --max-side, "
            f"--quality and --raw-below (--no-raw for JPEGs: `--max-side` ≤ 320 stores raw "
            f"pixels unless told not to)")


def build_manifest(dataset: str, inputs: Inputs, fields: tuple[FieldSpec, ...],
                   shards: Sequence[ShardProgress], folder: Storage, created_at: str,
                   extra: dict[str, object] | None = None,
                   base: Manifest | None = None) -> Manifest:
    """The manifest of an upload whose shards are all written (it writes the sources file);
    checked. Its bytes depend only on its arguments and the version published in `folder`.

    Without `base`, the upload replaces whatever is published: the next version number (the
    same, re-publishing identical content). With `base`, it is `base`'s next version, listing
    `base`'s shards and then its own (see `appended`)."""
    parsed, entries = inputs.parsed, inputs.entries
    base_dir = os.path.dirname(parsed.path)
    sources = write_sources(
        folder, inputs.data_dir, [e.record_id for e in entries],
        [_relative(e.columns[0], base_dir) if parsed.kind == "file" else None
         for e in entries], [e.line for e in entries])
    labels: Counter[str] = Counter()
    for s in shards:
        labels.update(s.labels)
    manifest = Manifest(
        name=dataset, kind=parsed.kind, fields=fields,
        label_field=parsed.field_names[parsed.label_index]
        if parsed.label_index is not None else None,
        num_records=sum(s.shard.num_rows for s in shards),
        num_bytes=sum(s.payload_bytes for s in shards),
        shards=tuple(s.shard for s in shards),
        label_histogram=dict(sorted(labels.items())), label_order=label_order(labels),
        fingerprint=inputs.fingerprint, source=os.path.basename(parsed.path),
        created_at=created_at, skipped=inputs.skipped, sources=sources, extra=dict(extra or {}),
        next_id=max((e.record_id for e in entries), default=-1) + 1)
    if base is not None:
        manifest = appended(base, manifest)
    else:
        previous = published_manifest(folder)
        version = (1 if previous is None else previous.dataset_version
                   if previous.fingerprint == manifest.fingerprint
                   else previous.dataset_version + 1)
        manifest = dataclasses.replace(manifest, dataset_version=version,
                                       versions=_entry(manifest, version))
    manifest.check()
    return manifest


def _entry(manifest: Manifest, version: int) -> tuple[VersionInfo]:
    return (VersionInfo(version, manifest.created_at, manifest.num_records, manifest.source,
                        manifest.sources, manifest.fingerprint),)


def appended(base: Manifest, new: Manifest) -> Manifest:
    """`base`'s next version with `new`'s records (an append's own manifest, ids already
    after `base`'s): `base`'s shards, unchanged, then `new`'s; the label histogram and counts
    summed; class ids stable (`stable_classes`).

    Raises:
        AppendMismatchError: a label that is no integer appended to a dataset whose integer
            labels are ordered by value.
    """
    labels = Counter(base.label_histogram)
    labels.update(new.label_histogram)
    order = base.label_order
    if order == NUMERIC_ORDER and label_order(labels) != NUMERIC_ORDER:
        odd = sorted(set(new.label_histogram) - set(base.label_histogram))
        raise AppendMismatchError(
            f"cannot append to dataset {base.name!r}: its labels are integers, ordered by "
            f"value; new label(s) {odd[:5]} are not. Upload the list as a new dataset, or map "
            f"its labels to integers")
    classes = stable_classes(base, labels)
    added = classes[len(base.classes):]
    if added:
        first = len(base.classes)
        logger.warning("append to %r adds %d new label(s) (%s) as class ids %d..%d, after the "
                       "existing ones, whose ids do not change: a model trained on version %d "
                       "has %d classes", base.name, len(added), ", ".join(added[:5]), first,
                       len(classes) - 1, base.dataset_version, first)
    version = base.dataset_version + 1
    merged = dataclasses.replace(
        new, shards=base.shards + new.shards, num_records=base.num_records + new.num_records,
        num_bytes=base.num_bytes + new.num_bytes,
        label_histogram=dict(sorted(labels.items())), label_order=order,
        class_values=None if classes == tuple(sorted_labels(labels, order)) else classes,
        skipped=base.skipped + new.skipped, extra=dict(base.extra), dataset_version=version,
        next_id=max(base.id_limit, new.id_limit))
    return dataclasses.replace(merged, versions=base.history + _entry(new, version))


def stable_classes(base: Manifest, labels: Counter[str]) -> tuple[str, ...]:
    """The labels behind class ids 0..K-1 of `base`'s next version, whose histogram is
    `labels`: `base`'s, each keeping its id, then the new labels in the label order, from the
    next id on (issue 38: an append that renumbered classes broke the models trained on `base`,
    or silently trained them on wrong labels)."""
    known = base.classes
    new = set(labels) - set(known)
    return known + tuple(sorted_labels(new, base.label_order))


def keep_version(folder: Storage, base: Manifest) -> None:
    """Writes `base`'s immutable copy, `versions/<n>.json`, if it has none (a dataset
    published before versions existed), so that readers may still ask for it once an
    append made it an old version."""
    rel = version_path(base.dataset_version)
    if not folder.exists(rel):
        folder.write_atomic(rel, base.to_json())


def _relative(path: str, base_dir: str) -> str:
    """`os.path.relpath(path, base_dir)`, without its cost (0.24 CPU-s of 3,000 files' upload)
    for the usual path: one the list named below its own folder."""
    prefix = base_dir.rstrip(os.sep) + os.sep
    rest = path[len(prefix):] if path.startswith(prefix) else ""
    if rest and os.path.normpath(rest) == rest and not rest.startswith(".."):
        return rest
    return os.path.relpath(path, base_dir)


def remove_temporary_files(folder: Storage) -> None:
    """Deletes the temporary files of an upload that was killed while writing one (an atomic
    write is a temporary sibling renamed over its target; a kill between the two leaves it).
    Uploads of one dataset are not meant to run concurrently (the second would replace the
    first), so any temporary file here is garbage. Only the dataset's own files are looked at
    (its top level and its reserved folders, trainfeed.names.RESERVED_SEGMENTS), never the
    folder of a dataset nested in its namespace: that one's upload may be writing them."""
    if not folder.is_local or not os.path.isdir(folder.root):
        return
    with os.scandir(folder.root) as entries:
        top = [e for e in entries]
    for entry in top:
        if entry.is_dir(follow_symlinks=False) and entry.name in RESERVED_SEGMENTS:
            for parent, _, files in os.walk(entry.path):
                _remove_temporary(parent, files)
    _remove_temporary(folder.root, [e.name for e in top if e.is_file(follow_symlinks=False)])


def _remove_temporary(parent: str, files: Sequence[str]) -> None:
    for name in files:
        if ".tmp-" in name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(parent, name))


def remove_stale_data(folder: Storage, keep: str) -> None:
    """Deletes data folders of earlier, replaced or abandoned uploads once the new one is live,
    never the one the published manifest names (on storage that cannot lock, another upload
    may have published since this one did); and the manifests of versions it no longer lists
    (replaced by an --overwrite: their shards are gone)."""
    try:
        published = json.loads(folder.read_bytes(MANIFEST_NAME))
    except FileNotFoundError:
        return
    _remove_stale_versions(folder)
    try:
        found = folder.fs.ls(folder.path(DATA_DIR), detail=False)
    except FileNotFoundError:
        return
    kept = {keep.rsplit("/", 1)[-1]} | {
        shard["path"].split("/")[1] for shard in published.get("shards", ())
        if shard.get("path", "").startswith("data/") and shard["path"].count("/") >= 2}
    for path in found:
        if path.rstrip("/").rsplit("/", 1)[-1] not in kept:
            folder.fs.rm(path, recursive=True)


def _remove_stale_versions(folder: Storage) -> None:
    """Deletes `versions/<n>.json` of every version the published manifest's history does not
    list (replaced by an --overwrite)."""
    published = published_manifest(folder)
    if published is None:
        return
    listed = {version_path(v.version).rsplit("/", 1)[-1] for v in published.history}
    try:
        found = folder.fs.ls(folder.path(VERSIONS_DIR), detail=False)
    except FileNotFoundError:
        return
    for path in found:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name.endswith(".json") and name not in listed:
            folder.fs.rm(path)
