"""deploy/monitoring's scrape objects find what `trainfeed submit` deploys: the ServiceMonitor
selects the master Service of a job (and no worker), on its metrics port, with honor_labels (the
rules and dashboard read the trainfeed job from `job`); the plain scrape config keeps the same."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import JobSpec

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
SPEC = JobSpec(name="example", image="trainfeed-torch:0.1.0", master_image="trainfeed:0.1.0",
               workers=2, dataset="flowers", command=("python", "train.py"),
               storage_pvc="trainfeed-data")


def test_the_service_monitor_selects_the_master_service_and_its_metrics_port() -> None:
    monitor = next(d for d in yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text())
                   if d)
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in job_objects(SPEC, token="") if o["kind"] == "Service"]
    chosen = [s for s in services if wanted.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in chosen] == ["example-master"]
    ports = {p["name"] for p in chosen[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["honorLabels"] is True


def test_the_plain_scrape_config_keeps_the_same_service() -> None:
    config = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    job = config["scrape_configs"][0]
    assert job["honor_labels"] is True
    keep = next(r for r in job["relabel_configs"] if r["action"] == "keep")
    service = next(o for o in job_objects(SPEC, token="")
                   if o["kind"] == "Service" and o["metadata"]["name"] == "example-master")
    labels = service["metadata"]["labels"]
    value = ";".join([labels["app.kubernetes.io/part-of"],
                      labels["app.kubernetes.io/component"], "metrics"])
    assert re.fullmatch(keep["regex"], value)
