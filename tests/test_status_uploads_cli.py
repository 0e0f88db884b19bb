"""`trainfeed status` with uploads: --uploads or a job, not both; the --watch view of a master
adds the uploads its /status.json has (trainfeed.cli.status_uploads)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.cli import status_watch
from trainfeed.cli.main import main
from trainfeed.ingest.board_summary import summarize


def test_status_takes_a_job_or_uploads(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    assert main(["status"]) == 2
    assert "name a job (trainfeed status JOB), or give --uploads" in capsys.readouterr().err
    assert main(["status", "job", "--uploads", "--storage", str(tmp_path)]) == 2
    assert "drop one of them" in capsys.readouterr().err


def test_the_watch_view_adds_the_masters_uploads_to_its_job() -> None:
    upload = summarize([{"dataset": "photos", "fingerprint": "f" * 16, "index": 0, "slices": 2,
                         "state": "failed", "reason": "OSError: gone", "records_done": 5,
                         "records_total": 10, "upload_records": 20, "updated_at": 1.0}], 2.0)
    job = {"job": "j", "dataset": "photos", "num_records": 20, "epoch": 0, "done": 0,
           "failed": 0, "num_partitions": 2, "progress": 0.0, "todo": 2, "pending": 0,
           "records_per_s": 0.0, "sparkline": [], "input_bound": 0.0, "workers_alive": 0,
           "reports_refused": 0, "readers": [], "failed_partitions": [], "refusals": []}
    lines = status_watch.render({"jobs": [job], "uploads": upload}, "j")
    assert lines[0].startswith("job         j (dataset photos")
    assert any(line.startswith("upload      photos (2 slices, fingerprint ffff") and
               "FAILED · 0/2 slices done, 0 running, 1 failed, 1 not started · 5/20 records"
               in line for line in lines), lines
    assert "  problem   slice 0: failed: OSError: gone" in lines
    assert status_watch.render({"uploads": []}, None) == [
        "uploads     none in progress, none published in the last hour"]
