"""A real Prometheus (Debian's, 2.42) scrapes a running master (issue 29): a PromQL query over
its HTTP API returns the job's progress as the ledger has it, every query of the Grafana
dashboard and of the rules parses in it (a bad one is refused: the check can fail), and every
series they name is one the master exports once readers ran."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from machine_load import hang_bound
from test_chaos import wait_for

from trainfeed import BatchOptions, DecodeOptions, MasterSource, PipelineOptions, dist
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
JOB = "scraped"
# Grafana's variables, as a query of the dashboard is sent for "All".
GRAFANA_VARIABLES = {"$job": ".*", "$__rate_interval": "1m", "${datasource}": ""}
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as e:  # 400 bad_data for a query that does not parse
        return json.load(e)


TOKEN = "scrape-test-token-0123456789abcdef"


@pytest.fixture
def scraped_master(storage: str, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MasterProcess, str]]:
    """A master with a token (so that it exports its count of refused calls too) whose job has
    been read for an epoch, scraped every second by a Prometheus; yields the master and
    Prometheus' base URL. (/metrics needs no token.)"""
    monkeypatch.setenv("TRAINFEED_TOKEN", TOKEN)
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus missing: apt-get install prometheus (.ci/run installs it)")
    with MasterProcess(storage, token=TOKEN) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, JOB),
                             pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8)),
                                                      batch=BatchOptions(size=10)))
        try:
            assert sum(len(b["_id"]) for b in reader()) == 100
        finally:
            reader.close()
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "trainfeed-masters", "honor_labels": True,
                                "static_configs": [{"targets": [
                                    f"127.0.0.1:{master.metrics_port}"]}]}]}))
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(lambda: ready(base), "Prometheus to be ready (/-/ready)")
            yield master, base
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def ready(base: str) -> bool:
    """Whether Prometheus says it is ready (/-/ready): before that its API answers 503 "Service
    Unavailable" in plain text (beside stress-ng it opened its port well before its storage was
    ready, and the first query failed on that text)."""
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False  # not listening yet, or 503 (urllib's HTTPError is an OSError)


def query_until(base: str, promql: str, timeout_s: float = 60) -> list[Any]:
    """The query's result once it has one; `timeout_s` (scaled to the load) ends a hang."""
    timeout_s = hang_bound(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = api(base, "/api/v1/query", query=promql)
            if answer.get("status") == "success" and answer["data"]["result"]:
                return list(answer["data"]["result"])
        except OSError:
            pass  # Prometheus still starting
        assert time.monotonic() < deadline, f"no result for {promql} within {timeout_s:g} s"
        time.sleep(0.5)


def dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"]
                if v["type"] == "query"]
    return queries


def rule_queries() -> list[str]:
    rules = yaml.safe_load((MONITORING / "trainfeed-rules.yaml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def as_sent(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    if query.startswith("label_values("):  # Grafana's own function: the series it reads
        query = query[len("label_values("):].split(",")[0]
    return query


def series_names(query: str) -> set[str]:
    names = set(re.findall(r"\btrainfeed_[a-z_]+\b", query))
    return {next((n[:-len(s)] for s in SUFFIXES if n.endswith(s)), n) for n in names}


def exported(metrics_url: str) -> set[str]:
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    return families | {f[:-len("_total")] for f in families if f.endswith("_total")}


def test_prometheus_scrapes_the_jobs_progress_and_every_dashboard_query_works(
        scraped_master: tuple[MasterProcess, str]) -> None:
    master, prometheus = scraped_master
    with MasterClient(master.address, token=TOKEN) as client:
        status = client.job_status(JOB)
    ledger = (status.done + status.failed) / status.num_partitions
    result = query_until(prometheus, f'trainfeed_epoch_progress{{job="{JOB}"}}')
    assert [float(r["value"][1]) for r in result] == [pytest.approx(ledger)]
    epoch = query_until(prometheus, f'trainfeed_epoch{{job="{JOB}"}}')
    assert float(epoch[0]["value"][1]) == status.epoch
    records = query_until(prometheus, f'trainfeed_reader_records_total{{job="{JOB}"}}')
    assert float(records[0]["value"][1]) == 100  # what the reader handed its trainer
    decoded = query_until(prometheus, f'trainfeed_reader_records_decoded_total{{job="{JOB}"}}')
    assert float(decoded[0]["value"][1]) == 100

    bad = api(prometheus, "/api/v1/query", query="sum(rate(trainfeed_epoch[1m])")
    assert bad["status"] == "error" and bad["errorType"] == "bad_data"  # the check can fail
    names = exported(master.metrics_url)  # type: ignore[arg-type]
    recorded = {r["record"] for g in yaml.safe_load(
        (MONITORING / "trainfeed-rules.yaml").read_text())["groups"] for r in g["rules"]
        if "record" in r}
    for query in dashboard_queries() + rule_queries():
        answer = api(prometheus, "/api/v1/query", query=as_sent(query))
        assert answer["status"] == "success", (query, answer)
        missing = series_names(query) - names
        assert not missing, f"{query} names series the master does not export: {missing}"
        assert not (set(re.findall(r"\btrainfeed:[a-z_:0-9]+", query)) - recorded), query
