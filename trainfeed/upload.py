"""`trainfeed.upload(list, dataset)`: pack a `.list` file into a published dataset.

This module is what `import trainfeed` loads for the upload, so it stays light: the options and
their constants, and `upload`, which loads the packer (trainfeed.ingest.run: pyarrow, numpy,
fsspec) when called. Its other names load with it on first use (PEP 562). `import trainfeed`
imported all of that (0.22 s), and numpy's OpenBLAS then spun a thread for 0.1 CPU-s in every
`trainfeed` command (issue 30 §2: `trainfeed.cli.main` now asks OpenBLAS for one thread before
an upload imports numpy).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainfeed.ingest.options import (
    DECODE_MEMORY_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_PROCESSES,
    DEFAULT_READ_THREADS,
    READ_AHEAD_BYTES,
    UploadOptions,
)

if TYPE_CHECKING:
    from trainfeed.ingest.check import check_images
    from trainfeed.ingest.lock import LOCK_NAME
    from trainfeed.ingest.pack import field_specs
    from trainfeed.ingest.publish import remove_stale_data, remove_temporary_files
    from trainfeed.ingest.run import UploadResult
    from trainfeed.storage import Storage

__all__ = ["DECODE_MEMORY_BYTES", "DEFAULT_MAX_RECORD_BYTES", "DEFAULT_PROCESSES",
           "DEFAULT_READ_THREADS", "LOCK_NAME", "READ_AHEAD_BYTES", "UploadOptions",
           "UploadResult", "check_images", "field_specs", "remove_stale_data",
           "remove_temporary_files", "upload"]

# Names loaded on first use, and the module of each (`_read_ahead_windows` is what tests called
# the read-ahead planner before it moved to trainfeed.ingest.pack).
_LAZY = {
    "UploadResult": ("trainfeed.ingest.run", "UploadResult"),
    "LOCK_NAME": ("trainfeed.ingest.lock", "LOCK_NAME"),
    "check_images": ("trainfeed.ingest.check", "check_images"),
    "field_specs": ("trainfeed.ingest.pack", "field_specs"),
    "_read_ahead_windows": ("trainfeed.ingest.pack", "read_ahead_windows"),
    "remove_stale_data": ("trainfeed.ingest.publish", "remove_stale_data"),
    "remove_temporary_files": ("trainfeed.ingest.publish", "remove_temporary_files"),
}


def __getattr__(name: str) -> Any:
    """Loads a lazily exported name on first use and keeps it in the module."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'trainfeed.upload' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_LAZY))


def upload(list_path: str, dataset: str, storage: Storage | str | None = None,
           options: UploadOptions | None = None, progress: bool | None = None,
           on_shard: Callable[[int], None] | None = None) -> UploadResult:
    """Uploads a `.list` file as dataset `dataset`, publishing it only when complete.

    Args:
        list_path: the `.list` file (paths in it are relative to its folder).
        dataset: the dataset name (validated: no path tricks).
        storage: a Storage, an fsspec URL, or None for `$TRAINFEED_STORAGE` / `./trainfeed-data`.
        options: layout and behaviour (kind, column names, --skip-missing, --overwrite,
            processes, transforms).
        progress: show a progress bar (default: when stderr is a terminal).
        on_shard: called with each newly written shard's index, in shard order (used by tests
            to interrupt).

    Returns:
        What was published, or `already_published=True` when the same upload was already done.

    Raises:
        ListFileError: a malformed line (with file:line), or MissingFilesError listing every
            missing file. Nothing is published then.
        DatasetExistsError: a different dataset of that name exists and `overwrite` is False.
    """
    from trainfeed.ingest import run  # the packer's imports, on first use (module docstring)
    return run.upload(list_path, dataset, storage, options, progress, on_shard)
