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


def _lines(upload: dict[str, Any]) -> list[str]:
    u = upload
    slices = (f"{u['slices']} slice{'s' if u['slices'] != 1 else ''}" if u["mode"] == "slices"
              else "local")
    head = f"upload      {u['dataset']} ({slices}, fingerprint {u['fingerprint']}): "
    if u["state"] == PUBLISHED:
        return [head + f"published {u['records_done']:,} records in {u['shards_done']} "
                f"shard(s), {u['records_per_s']:,.0f} records/s, "
                f"{_duration(u['updated_ago_s'])} ago"]
    share = u["records_done"] / u["records_total"] if u["records_total"] else 0.0
    eta = f" · ETA {_duration(u['eta_s'])}" if u["eta_s"] is not None else ""
    counts = (f" · {u['slices_done']}/{u['slices']} slices done, {u['slices_running']} running"
              + (f", {u['slices_failed']} failed" if u["slices_failed"] else "")
              + (f", {u['slices_stale']} stale" if u["slices_stale"] else "")
              + (f", {u['slices_waiting']} not started" if u["slices_waiting"] else "")
              if u["mode"] == "slices" else "")
    lines = [head + f"{u['state'].upper() if u['state'] in (FAILED, STALE) else u['state']}"
             f"{counts} · {u['records_done']:,}/{u['records_total']:,} records ({share:.0%}) · "
             f"{u['records_per_s']:,.0f} records/s{eta}"]
    if u["mode"] == "slices":
        for s in [s for s in u["slice_rows"] if s["state"] != "done"][:MAX_SLICES_SHOWN]:
            lines.append(f"  slice {s['slice']:<5} {s['state']:<8} {s['records_done']:,}/"
                         f"{s['records_total']:,} records  {s['records_per_s']:,.0f} records/s"
                         f"  on {s['host']}, {s['updated_ago_s']:.0f} s ago")
    lines += [f"  problem   {p[:300]}" for p in u["problems"]]
    return lines


def render(uploads: list[dict[str, Any]]) -> list[str]:
    """Every upload's lines, or one line saying there is none."""
    if not uploads:
        return ["uploads     none in progress, none published in the last hour"]
    return [line for u in uploads for line in upload_lines(u)]


def read(storage: Storage) -> Callable[[], list[dict[str, Any]]]:
    """A function that reads `storage`'s board afresh (re-reading changed records only)."""
    board = Board(storage)
    return lambda: summarize(board.records(), time.time())
