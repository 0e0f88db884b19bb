"""`trainfeed status --uploads`: the uploads of a storage in progress (and those published in
the last hour), read from its uploads board (trainfeed.ingest.board); the same lines as the
uploads section of `trainfeed status JOB --watch`, which has them from the master's
/status.json.

A board record is a JSON file any writer of the storage can drop: every line shown passes
trainfeed.terminal_text.visible, so none of its fields reaches the terminal as control
characters."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainfeed.ingest.board import FAILED, PUBLISHED, STALE, Board
from trainfeed.ingest.board_summary import summarize
from trainfeed.storage import Storage
from trainfeed.terminal_text import visible

# Slices listed per upload in the terminal (problems first; the page lists up to 50).
MAX_SLICES_SHOWN = 10


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours
            else f"{rest // 60}:{rest % 60:02d}")


def upload_lines(upload: dict[str, Any]) -> list[str]:
    """The lines of one upload of `trainfeed.ingest.board.summarize`, each one line of
    printable text whatever the board's records hold (terminal_text.visible)."""
    return [visible(line) for line in _lines(upload)]


# The slice counts an upload's line names only when not zero, in this order: (field, word).
OPTIONAL_SLICE_COUNTS = (("slices_failed", "failed"), ("slices_stale", "stale"),
                         ("slices_waiting", "not started"))


def _lines(upload: dict[str, Any]) -> list[str]:
    """One line for a published upload; for one in progress, its line, then its unfinished
    slices and its problems."""
    head = _head(upload)
    if upload["state"] == PUBLISHED:
        return [head + _published(upload)]
    return ([head + _progress(upload)] + _slice_lines(upload)
            + [f"  problem   {p[:300]}" for p in upload["problems"]])


def _head(u: dict[str, Any]) -> str:
    """What every line of an upload starts with: the dataset, how it is cut, its fingerprint."""
    slices = (f"{u['slices']} slice{'s' if u['slices'] != 1 else ''}" if u["mode"] == "slices"
              else "local")
    return f"upload      {u['dataset']} ({slices}, fingerprint {u['fingerprint']}): "


def _published(u: dict[str, Any]) -> str:
    """A published upload: what it wrote, how fast, and how long ago."""
    return (f"published {u['records_done']:,} records in {u['shards_done']} "
            f"shard(s), {u['records_per_s']:,.0f} records/s, "
            f"{_duration(u['updated_ago_s'])} ago")


def _progress(u: dict[str, Any]) -> str:
    """An upload in progress: its state (FAILED and STALE in capitals, to stand out), its slice
    counts, its records so far, its rate and, when known, the time left."""
    share = u["records_done"] / u["records_total"] if u["records_total"] else 0.0
    eta = f" · ETA {_duration(u['eta_s'])}" if u["eta_s"] is not None else ""
    state = u["state"].upper() if u["state"] in (FAILED, STALE) else u["state"]
    return (f"{state}{_slice_counts(u)} · {u['records_done']:,}/{u['records_total']:,} records "
            f"({share:.0%}) · {u['records_per_s']:,.0f} records/s{eta}")


def _slice_counts(u: dict[str, Any]) -> str:
    """How the slices of a sliced upload stand ("" for a local one, which has none)."""
    if u["mode"] != "slices":
        return ""
    optional = "".join(f", {u[field]} {word}" for field, word in OPTIONAL_SLICE_COUNTS
                       if u[field])
    return (f" · {u['slices_done']}/{u['slices']} slices done, {u['slices_running']} running"
            + optional)


def _slice_lines(u: dict[str, Any]) -> list[str]:
    """The first MAX_SLICES_SHOWN slices of a sliced upload that are not done yet."""
    if u["mode"] != "slices":
        return []
    unfinished = [s for s in u["slice_rows"] if s["state"] != "done"][:MAX_SLICES_SHOWN]
    return [f"  slice {s['slice']:<5} {s['state']:<8} {s['records_done']:,}/"
            f"{s['records_total']:,} records  {s['records_per_s']:,.0f} records/s"
            f"  on {s['host']}, {s['updated_ago_s']:.0f} s ago" for s in unfinished]


def render(uploads: list[dict[str, Any]]) -> list[str]:
    """Every upload's lines, or one line saying there is none."""
    if not uploads:
        return ["uploads     none in progress, none published in the last hour"]
    return [line for u in uploads for line in upload_lines(u)]


def read(storage: Storage) -> Callable[[], list[dict[str, Any]]]:
    """A function that reads `storage`'s board afresh (re-reading changed records only)."""
    board = Board(storage)
    return lambda: summarize(board.records(), time.time())
