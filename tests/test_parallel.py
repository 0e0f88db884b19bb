"""The suite runs on pytest-xdist workers (pyproject.toml's addopts); what that relies on:

- every test that uses GlusterFS runs on one worker (glusterd is one per machine: a second
  worker would start or stop it under the first one's mount), and so do the tests marked
  timing. tests/conftest.py sets the group suffix that xdist's loadgroup scheduler reads,
  because xdist 3.8 sets it where pytest 9.2 no longer looks: without that, the groups are
  silently ignored (pytest-xdist#1386);
- a test marked timing runs with no other test running on any worker;
- each worker's servers draw ports from a slice of the range no other worker draws from.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from integration import services
from machine_load import hang_bound

TESTS = Path(__file__).resolve().parent

# A small project whose conftest is the suite's (copied: pytest wants one named conftest.py),
# with `glusterfs_mount` replaced by a folder so that no server starts.
FAKE_MOUNT = '''
import pytest

@pytest.fixture(scope="session")
def glusterfs_mount(tmp_path_factory):
    return tmp_path_factory.mktemp("not-gluster")
'''
SLEEPY_TESTS = '''
import os
import time
import pytest

def sleep(name):
    started = time.time()
    time.sleep(0.3)
    with open(os.environ["SPANS"], "a") as spans:
        spans.write(f"{name} {started} {time.time()}\\n")

@pytest.mark.parametrize("i", range(6))
def test_on_gluster(glusterfs_mount, i):
    sleep("test_on_gluster")

@pytest.mark.timing
@pytest.mark.parametrize("i", range(4))
def test_timed(i):
    sleep("test_timed")

@pytest.mark.parametrize("i", range(9))
def test_anywhere(i):
    sleep("test_anywhere")
'''


@pytest.mark.slow
def test_grouped_tests_share_one_worker_and_timing_tests_run_alone(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(TESTS / "conftest.py", project / "suite_conftest.py")
    (project / "conftest.py").write_text("from suite_conftest import *  # noqa: F403\n"
                                         + FAKE_MOUNT)
    (project / "test_groups.py").write_text(SLEEPY_TESTS)
    (project / "pytest.ini").write_text("[pytest]\nmarkers =\n  timing: runs alone\n")
    spans = tmp_path / "spans.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(TESTS)]),
           "SPANS": str(spans)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "3",
         "--dist", "loadgroup", "--no-loadscope-reorder", "test_groups.py"],
        cwd=project, env=env, capture_output=True, text=True, timeout=hang_bound(240))
    assert result.returncode == 0, result.stdout + result.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, name in re.findall(r"^\[(gw\d+)\] .*PASSED test_groups\.py::(test_\w+)",
                                   result.stdout, re.MULTILINE):
        workers[name].add(worker)
    assert len(workers) == 3, result.stdout
    assert len(workers["test_on_gluster"]) == 1, result.stdout
    assert len(workers["test_timed"]) == 1, result.stdout
    everyone = set().union(*workers.values())
    assert len(everyone) > 1, f"all tests ran on {everyone}: nothing was spread"
    runs = [(name, float(start), float(end))
            for name, start, end in (line.split() for line in spans.read_text().splitlines())]
    assert len(runs) == 19
    for name, start, end in runs:
        if name != "test_timed":
            continue
        beside = [other for other in runs if other[0] != "test_timed"
                  and other[1] < end and start < other[2]]
        assert not beside, f"a timing test ran from {start} to {end} beside {beside}"


def test_each_xdist_worker_draws_ports_from_its_own_slice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert services._port_range() == services._PORT_RANGE
    low, high = services._PORT_RANGE
    slices = []
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    for index in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        slices.append(services._port_range())
        ports = services._free_ports(3, grpc_offset=services.GRPC_OFFSET)
        assert all(slices[-1][0] <= p < slices[-1][1] for p in ports), (ports, slices[-1])
    taken = [set(range(*s)) for s in slices]
    assert all(not (a & b) for i, a in enumerate(taken) for b in taken[i + 1:]), slices
    assert low <= min(s[0] for s in slices) and max(s[1] for s in slices) <= high


def test_no_server_of_the_suite_is_given_a_port_glusterd_binds_as_fixed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "_port_range", lambda: (24006, 24010))
    for _ in range(20):
        ports = services._free_ports(2)
        assert not set(ports) & {24007, 24008}, ports
