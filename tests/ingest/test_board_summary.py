"""An uploads board's records summed into uploads (trainfeed.ingest.board_summary): slices by
state, records, rate and ETA; stale, failed, packed and published uploads."""
from __future__ import annotations

import pytest
from board_records import record
from hypothesis import given
from hypothesis import strategies as st

from trainfeed.ingest.board import STALE_S
from trainfeed.ingest.board_summary import SHOW_PUBLISHED_S, summarize


def test_a_board_sums_its_slices_into_one_upload_with_rate_and_eta() -> None:
    [u] = summarize([record(0, "done", 100), record(1, "running", 50)], now=1001.0)
    assert (u["dataset"], u["mode"], u["state"]) == ("public/photos", "slices", "running")
    assert (u["slices"], u["slices_done"], u["slices_running"], u["slices_waiting"]) == \
        (3, 1, 1, 1)
    assert (u["records_done"], u["records_total"]) == (150, 300)
    assert u["records_per_s"] == 5.0  # the running slice's only
    assert u["eta_s"] == pytest.approx(150 / 5.0)
    assert [s["slice"] for s in u["slice_rows"]] == [0, 1] and u["problems"] == []


def test_a_packer_silent_for_longer_than_stale_s_is_flagged_and_named() -> None:
    rows = [record(0, "done", 100), record(1, at=1000.0), record(2, at=1000.0 + STALE_S)]
    [u] = summarize(rows, now=1000.0 + STALE_S + 1)
    assert u["state"] == "stale" and u["slices_stale"] == 1 and u["slices_running"] == 1
    assert u["eta_s"] is None
    [problem] = u["problems"]
    assert problem.startswith("slice 1 on ") and f"for {STALE_S + 1:.0f} s" in problem
    assert "run its index again" in problem


def test_a_failed_slice_fails_the_upload_with_its_reason() -> None:
    rows = [record(0, "done", 100), record(1), record(2, "failed", 20, reason="OSError: x")]
    [u] = summarize(rows, now=1001.0)
    assert u["state"] == "failed" and u["slices_failed"] == 1
    assert u["problems"] == ["slice 2: failed: OSError: x"]
    assert u["slice_rows"][2]["records_per_s"] == 0.0


def test_every_slice_done_but_not_published_says_to_commit() -> None:
    [u] = summarize([record(i, "done", 100) for i in range(3)], now=1001.0)
    assert u["state"] == "packed" and "trainfeed upload-commit" in u["problems"][0]


def test_published_uploads_are_shown_for_an_hour_after_the_ones_in_progress() -> None:
    published = {"dataset": "a", "fingerprint": "1" * 16, "state": "published", "slices": 3,
                 "index": 0, "records_done": 300, "records_total": 300, "started_at": 900.0,
                 "updated_at": 1000.0, "shards_done": 6, "shards_total": 6}
    uploads = summarize([published, record(1)], now=1001.0)
    assert [u["state"] for u in uploads] == ["running", "published"]
    assert uploads[1]["records_per_s"] == 3.0 and uploads[1]["mode"] == "slices"
    assert summarize([published], now=1000.0 + SHOW_PUBLISHED_S + 1) == []


@given(st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["running", "done", "failed"]),
                          st.integers(0, 100), st.floats(0, 200)), max_size=12),
       st.floats(0, 200))
def test_every_reported_slice_is_counted_once_in_one_state(
        rows: list[tuple[int, str, int, float]], now: float) -> None:
    latest = {index: (state, done, at) for index, state, done, at in rows}  # one per slice
    records = [record(index, state, done, at) for index, (state, done, at) in latest.items()]
    for r in records:
        r["slices"] = 8
    uploads = summarize(records, now=now, stale_s=50.0)
    if not records:
        assert uploads == []
        return
    [u] = uploads
    states = ("done", "running", "failed", "stale")
    assert sum(u[f"slices_{s}"] for s in states) == len(latest)
    assert u["slices_waiting"] == 8 - len(latest)
    assert u["records_done"] == sum(done for _, done, _ in latest.values())
    assert u["slices_stale"] == sum(1 for state, _, at in latest.values()
                                    if state == "running" and now - at > 50.0)
    assert (u["state"] == "failed") == (u["slices_failed"] > 0)
    assert len(u["problems"]) >= u["slices_failed"] + u["slices_stale"]
