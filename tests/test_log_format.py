"""JSON logs (`trainfeed --log-format json`): one object per line, whatever is logged."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfeed.cli.log_format import JsonFormatter
from trainfeed.master.serve.process import MasterProcess

KEYS = {"time", "level", "logger", "message"}


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("disk on fire\nsecond line")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("trainfeed.test", logging.WARNING, __file__, 1, message, args,
                             exc_info)


def test_a_record_is_one_line_of_json_with_the_expected_keys() -> None:
    line = JsonFormatter().format(record("job %r: %d lease(s) expired\n(%s)", "j", 3, "ünï"))
    assert "\n" not in line
    entry = json.loads(line)
    assert set(entry) == KEYS
    assert entry["level"] == "WARNING" and entry["logger"] == "trainfeed.test"
    assert entry["message"] == "job 'j': 3 lease(s) expired\n(ünï)"
    assert entry["time"].endswith("Z") and entry["time"][10] == "T"


def test_an_exception_travels_in_the_same_line() -> None:
    line = JsonFormatter().format(record("failed", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert set(entry) == KEYS | {"exception"}
    assert entry["exception"].startswith("Traceback (most recent call last)")
    assert "RuntimeError: disk on fire\nsecond line" in entry["exception"]


@pytest.mark.slow
def test_a_master_logs_only_json_lines(image_list: Path, storage_dir: str) -> None:
    from trainfeed.lease.client import MasterClient
    from trainfeed.upload import UploadOptions, upload

    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=10),
           progress=False)
    with MasterProcess(storage_dir, env={"TRAINFEED_LOG_FORMAT": "json"}) as master, \
            MasterClient(master.address) as client:
        client.open_job("j", "flowers", seed=0)  # logs "job 'j' created"
        master.stop()
    entries = [json.loads(line) for line in master.log if line.strip()]
    assert all(KEYS <= set(e) for e in entries)
    messages = [e["message"] for e in entries]
    assert any("trainfeed master listening on 127.0.0.1:" in m for m in messages)
    assert any("job 'j' created" in m for m in messages)
    assert {e["logger"] for e in entries} >= {"trainfeed.master.serve.server",
                                              "trainfeed.master.core.coordinator"}


@pytest.mark.parametrize("value", ["xml", "JSONL"])
def test_an_unknown_format_in_the_environment_is_refused(value: str) -> None:
    result = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "ls"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "TRAINFEED_LOG_FORMAT": value})
    assert result.returncode == 2
    assert f"$TRAINFEED_LOG_FORMAT={value.lower()!r}: expected one of ['text', 'json']" \
        in result.stderr
