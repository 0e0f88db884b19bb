"""`trainfeed demo` ends with its status page's URL (issue 29): run on a terminal (a pty here), the
master keeps serving the page until Enter, and the page, opened with the token the demo printed,
shows the demo's job with its epoch read whole."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def read_until(fd: int, pattern: str, timeout_s: float, seen: list[str]) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        match = re.search(pattern, "".join(seen))
        if match:
            return match
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} within {timeout_s:g} s:\n" + "".join(seen)[-3000:]
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                seen.append(os.read(fd, 4096).decode(errors="replace"))
            except OSError:  # the demo exited
                pass


def test_the_demo_ends_with_the_status_page_of_its_job(tmp_path: Path) -> None:
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "trainfeed.cli.main", "demo", "--images",
                             "200"], cwd=tmp_path, stdin=child, stdout=child, stderr=child,
                            env={**os.environ, "TRAINFEED_STORAGE": ""}, close_fds=True)
    os.close(child)
    seen: list[str] = []
    try:
        match = read_until(main, r"status page: (http://\S+/status) \(log in with this run's "
                                 r"token: (\S+)\)", 240, seen)
        read_until(main, r"press Enter", 30, seen)
        url, token = match.group(1), match.group(2)
        request = urllib.request.Request(url + ".json",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            [job] = json.load(answer)["jobs"]
        assert job["job"] == "demo" and job["dataset"] == "demo-images"
        assert job["done"] == job["num_partitions"] and job["progress"] == 1.0
        assert len(job["readers"]) == 2
        with urllib.request.urlopen(urllib.request.Request(
                url, headers={"Authorization": f"Bearer {token}"}), timeout=10) as answer:
            assert "Job demo" in answer.read().decode()
        os.write(main, b"\n")
        assert proc.wait(60) == 0
        read_until(main, r"next: read it without a master", 10, seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(main)
