"""The master's Prometheus endpoint, scraped over HTTP from a real master process and parsed
with prometheus_client's own parser: the figures must follow from what the test did."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainfeed import MasterSource, dist
from trainfeed.formats.manifest import read_manifest
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.storage import open_storage

pytestmark = pytest.mark.integration
RECORDS = 100
PARTITIONS = 10  # 100 records in row groups of 10, one partition per row group

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(master: MasterProcess) -> Samples:
    """Every sample of the endpoint: (name, labels) -> value."""
    assert master.metrics_url is not None
    with urllib.request.urlopen(master.metrics_url, timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k[0] for k in samples)}"
    return samples[key]


def test_an_epoch_read_shows_in_the_metrics(storage: str) -> None:
    payload_bytes = read_manifest(open_storage(storage), "flowers").num_bytes
    with MasterProcess(storage) as master:
        assert master.metrics_port is not None
        assert not any(k[0].startswith("trainfeed_tasks") for k in scrape(master))  # no job yet
        ids: list[int] = []
        with dist.reader("flowers", source=MasterSource(master.address, job="j")) as reader:
            ids += [i for b in reader.column_batches(10) for i in b["_id"].tolist()]
            during = scrape(master)
        after = scrape(master)
        assert sorted(ids) == list(range(RECORDS))
        for state, expected in (("todo", 0), ("pending", 0), ("done", PARTITIONS),
                                ("failed", 0)):
            assert value(during, "trainfeed_tasks", job="j", state=state) == expected, state
        assert value(during, "trainfeed_partitions", job="j") == PARTITIONS
        assert value(during, "trainfeed_epoch", job="j") == 0
        assert value(during, "trainfeed_epoch_progress", job="j") == 1.0
        assert value(during, "trainfeed_records_served_total", job="j") == RECORDS
        assert value(during, "trainfeed_bytes_served_total", job="j") == payload_bytes
        assert value(during, "trainfeed_leases_expired_total", job="j") == 0
        assert value(during, "trainfeed_job_info", job="j", dataset="flowers") == 1
        assert value(during, "trainfeed_workers_alive", job="j") == 1
        assert value(after, "trainfeed_workers_alive", job="j") == 0  # it left the job
        method = "trainfeed.v1.Master/"
        assert value(during, "trainfeed_rpc_duration_seconds_count",
                     method=method + "OpenJob") == 1
        grants = value(during, "trainfeed_lease_grant_duration_seconds_count")
        assert grants > 0  # (the reader's grants, on its Session stream)
        assert value(during, "trainfeed_lease_grant_duration_seconds_bucket",
                     le="+Inf") == grants
        assert value(after, "trainfeed_rpc_duration_seconds_count",
                     method=method + "LeaveJob") == 1
        # An --insecure master refuses no token, and so exports no count of refusals.
        assert not any(name == "trainfeed_rpc_unauthenticated_total" for name, _ in after)
        # A second pass: the counters go on, the gauges follow the new epoch.
        with dist.reader("flowers", source=MasterSource(master.address, job="j")) as reader:
            assert sum(len(b["_id"]) for b in reader.column_batches(10)) == RECORDS
            second = scrape(master)
        assert value(second, "trainfeed_epoch", job="j") == 1
        assert value(second, "trainfeed_records_served_total", job="j") == 2 * RECORDS
        assert value(second, "trainfeed_bytes_served_total", job="j") == 2 * payload_bytes


@pytest.mark.slow
def test_expired_leases_are_counted(storage: str) -> None:
    with MasterProcess(storage, extra_args=["--lease-timeout", "1"]) as master, \
            MasterClient(master.address) as client:
        worker = client.open_job("j", "flowers", seed=0).worker_id
        leased = client.get_tasks("j", worker, 0, max_tasks=3, wait_ms=0)
        assert len(leased.tasks) == 3
        pending = scrape(master)
        assert value(pending, "trainfeed_tasks", job="j", state="pending") == 3
        assert value(pending, "trainfeed_workers_alive", job="j") == 1
        deadline = time.monotonic() + 15  # the worker goes silent: its leases expire
        while value(samples := scrape(master), "trainfeed_leases_expired_total", job="j") < 3:
            assert time.monotonic() < deadline, "leases did not expire within 15 s"
            time.sleep(0.2)
        assert value(samples, "trainfeed_leases_expired_total", job="j") == 3
        assert value(samples, "trainfeed_tasks", job="j", state="pending") == 0
        assert value(samples, "trainfeed_tasks", job="j", state="todo") == PARTITIONS
        assert value(samples, "trainfeed_records_served_total", job="j") == 0


def test_metrics_can_be_turned_off_and_a_taken_port_is_a_clear_error(storage: str) -> None:
    with MasterProcess(storage, metrics_port=None) as master:
        assert master.metrics_url is None and "no metrics" in master.log[-1]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trainfeed.cli.main", "--log-format", "json", "master",
             "--insecure", "--storage", storage, "--state", "memory://", "--host", "127.0.0.1",
             "--port", "0", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    errors = [json.loads(line) for line in result.stderr.splitlines()
              if json.loads(line)["level"] == "ERROR"]
    assert len(errors) == 1 and f"--metrics-port {port}: cannot listen" in errors[0]["message"]
