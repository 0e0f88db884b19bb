"""An uploads board's records summed into uploads: what `trainfeed status --uploads`, the
master's status page and `/status.json` show (trainfeed.ingest.board has how they are written
and read). Pure: the time is an argument.

One dict per upload (dataset, fingerprint): its state (running; failed when a slice failed;
stale when a running slice's record is older than STALE_S; packed when every slice is done and
nothing published; published), slices by state and not started yet, records and bytes done, the
running packers' summed rate and the ETA it gives, what to act on (`problems`), and a row per
slice, problems first.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainfeed.ingest.board import DONE, FAILED, PUBLISHED, RUNNING, STALE, STALE_S

# Published uploads stay on the board for this long (then hidden; their record stays until the
# dataset's next publish replaces it).
SHOW_PUBLISHED_S = 3600.0
# Per-slice rows shown per upload (problems first); the rest are counted.
MAX_SLICE_ROWS = 50
# Every slice done, the upload not published (a commit not run yet, or that refused).
PACKED = "packed"


def summarize(records: Iterable[dict[str, Any]], now: float, stale_s: float = STALE_S,
              show_published_s: float = SHOW_PUBLISHED_S) -> list[dict[str, Any]]:
    """The uploads of `records` (a board's), one dict per upload, in progress first, then by
    dataset: the data of `trainfeed status --uploads` and of the status page's section.

    Pure: `now` is an argument. A running record older than `stale_s` counts as stale.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((str(r["dataset"]), str(r.get("fingerprint", ""))), []).append(r)
    uploads = [_upload(dataset, fingerprint, rows, now, stale_s)
               for (dataset, fingerprint), rows in groups.items()]
    uploads = [u for u in uploads
               if u["state"] != PUBLISHED or now - u["updated_at"] <= show_published_s]
    return sorted(uploads, key=lambda u: (u["state"] == PUBLISHED, u["dataset"],
                                          -u["updated_at"]))


def _upload(dataset: str, fingerprint: str, rows: list[dict[str, Any]], now: float,
            stale_s: float) -> dict[str, Any]:
    published = next((r for r in rows if r["state"] == PUBLISHED), None)
    if published is not None:
        return _published(published, now)
    packers = sorted((_slice_row(r, now, stale_s) for r in rows),
                     key=lambda s: -1 if s["slice"] is None else s["slice"])
    first = rows[0]
    slices, local = int(first.get("slices", 1)), first.get("index") is None
    counts = _counts(packers, slices, local)
    state = _state(counts, slices, local)
    totals = _totals(rows, now)
    records_total = int(first.get("upload_records", 0))
    rate = sum(s["records_per_s"] for s in packers if s["state"] == RUNNING)
    remaining = records_total - totals["records_done"]
    shown = _shown_rows(packers)
    return {
        "dataset": dataset, "fingerprint": fingerprint, "mode": "local" if local else "slices",
        "state": state, "slices": slices, **counts, **totals, "records_total": records_total,
        "shards_total": int(first.get("upload_shards", 0)), "records_per_s": rate,
        "eta_s": remaining / rate if rate > 0 and state == RUNNING else None,
        "problems": _problems(packers, state, local),
        "slice_rows": shown, "slice_rows_hidden": len(packers) - len(shown),
    }


def _state(counts: dict[str, int], slices: int, local: bool) -> str:
    """An unpublished upload's state, the worst of its slices' first: failed if one failed,
    else stale if one is stale, else packed if every slice of a sliced upload is done and no
    commit published it (a local upload, which has no separate commit, is never packed), else
    running."""
    if counts["slices_failed"]:
        return FAILED
    if counts["slices_stale"]:
        return STALE
    if counts["slices_done"] == slices and not local:
        return PACKED
    return RUNNING


def _shown_rows(packers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slice rows shown, at most MAX_SLICE_ROWS: failed and stale ones first, then running
    ones, so that a long list never hides a problem; in slice order."""
    shown = sorted(packers, key=lambda s: (s["state"] not in (FAILED, STALE),
                                           s["state"] != RUNNING))[:MAX_SLICE_ROWS]
    return sorted(shown, key=lambda s: s["slice"] or 0)


def _counts(packers: list[dict[str, Any]], slices: int, local: bool) -> dict[str, int]:
    """Slices by state; `slices_waiting`: those whose packer has not reported yet."""
    counts = {f"slices_{state}": sum(1 for s in packers if s["state"] == state)
              for state in (DONE, RUNNING, FAILED, STALE)}
    counts["slices_waiting"] = 0 if local else max(0, slices - len({s["slice"]
                                                                   for s in packers}))
    return counts


def _totals(rows: list[dict[str, Any]], now: float) -> dict[str, float]:
    """What the packers did together, and when they started and last reported."""
    updated = max(float(r.get("updated_at", 0.0)) for r in rows)
    return {"records_done": sum(int(r.get("records_done", 0)) for r in rows),
            "bytes_done": sum(int(r.get("bytes_done", 0)) for r in rows),
            "shards_done": sum(int(r.get("shards_done", 0)) for r in rows),
            "started_at": min(float(r.get("started_at", now)) for r in rows),
            "updated_at": updated, "updated_ago_s": max(0.0, now - updated)}


def _problems(packers: list[dict[str, Any]], state: str, local: bool) -> list[str]:
    """What an operator should act on: each failed or stale packer, or a missing commit."""
    problems = []
    for s in packers:
        who = "the upload" if local else f"slice {s['slice']}"
        if s["state"] == FAILED:
            problems.append(f"{who}: failed: {s['reason']}")
        elif s["state"] == STALE:
            problems.append(f"{who} on {s['host']}: stale: no progress record for "
                            f"{s['updated_ago_s']:.0f} s (its packer may be gone; run "
                            + ("the upload again)" if local else "its index again)"))
    if state == PACKED:
        problems.append("every slice packed, not published yet: run `trainfeed upload-commit`")
    return problems


def _slice_row(r: dict[str, Any], now: float, stale_s: float) -> dict[str, Any]:
    ago = max(0.0, now - float(r.get("updated_at", 0.0)))
    state = str(r["state"])
    if state == RUNNING and ago > stale_s:
        state = STALE
    return {"slice": r.get("index"), "state": state, "host": str(r.get("host", "?")),
            "records_done": int(r.get("records_done", 0)),
            "records_total": int(r.get("records_total", 0)),
            "shards_done": int(r.get("shards_done", 0)),
            "shards_total": int(r.get("shards_total", 0)),
            "records_per_s": float(r.get("records_per_s", 0.0)) if state == RUNNING else 0.0,
            "updated_ago_s": ago, "reason": r.get("reason")}


def _published(r: dict[str, Any], now: float) -> dict[str, Any]:
    records, started = int(r.get("records_done", 0)), float(r.get("started_at", 0.0))
    updated = float(r.get("updated_at", now))
    return {"dataset": str(r["dataset"]), "fingerprint": str(r.get("fingerprint", "")),
            "mode": "local" if r.get("index", 0) is None else "slices",
            "state": PUBLISHED, "slices": int(r.get("slices", 1)),
            "slices_done": int(r.get("slices", 1)), "slices_running": 0, "slices_failed": 0,
            "slices_stale": 0, "slices_waiting": 0, "records_done": records,
            "records_total": records, "bytes_done": int(r.get("bytes_done", 0)),
            "shards_done": int(r.get("shards_done", 0)),
            "shards_total": int(r.get("shards_total", 0)),
            "records_per_s": records / (updated - started) if updated > started else 0.0,
            "eta_s": None, "started_at": started, "updated_at": updated,
            "updated_ago_s": max(0.0, now - updated), "problems": [],
            "slice_rows": [], "slice_rows_hidden": 0}
