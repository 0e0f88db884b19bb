"""Packer progress records as the uploads board holds them, for the board's tests."""
from __future__ import annotations

import json
from typing import Any

from trainfeed.ingest.board import PackerProgress


def progress(index: int | None, **kw: Any) -> PackerProgress:
    """Slice `index` (None: a plain upload) of a 3-slice upload of 300 records, with `kw` set."""
    fields: dict[str, Any] = dict(dataset="public/photos", fingerprint="f" * 16, index=index,
                                  slices=3, records_total=100, bytes_total=1000,
                                  shards_total=2, upload_records=300, upload_shards=6)
    return PackerProgress(**{**fields, **kw})


def record(index: int | None, state: str = "running", done: int = 50, at: float = 1000.0,
           **kw: Any) -> dict[str, Any]:
    """The stored JSON of a slice that had packed `done` records at time `at`, 10 s in."""
    p = progress(index, records_done=done, state=state, started_at=at - 10, updated_at=at,
                 records_per_s=done / 10, **kw)
    return dict(json.loads(p.to_json()))
