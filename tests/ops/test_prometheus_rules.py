"""deploy/monitoring's Prometheus rules (issue 29): `promtool check rules`, `promtool test rules`
with a unit test that fires each alert, the Operator's PrometheusRule equal to the plain file,
and a broken threshold caught by the unit tests (they can fail)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "trainfeed-rules.yaml"
RULE_TESTS = MONITORING / "trainfeed-rules.test.yaml"
ALERTS = {"TrainfeedJobInputBound", "TrainfeedReadersSilent", "TrainfeedPartitionsLost",
          "TrainfeedGrantLatencyHigh", "TrainfeedReportsRefused"}


def promtool() -> str:
    """Debian's promtool (package prometheus, installed by .ci/run)."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool missing: apt-get install prometheus"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_the_rules_are_valid() -> None:
    result = run("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r["alert"] for g in load(RULES)["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == ALERTS


def test_every_alert_fires_in_its_unit_test() -> None:
    result = run("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    fired = {case["alertname"] for test in load(RULE_TESTS)["tests"]
             for case in test.get("alert_rule_test", ()) if case["exp_alerts"]}
    quiet = {case["alertname"] for test in load(RULE_TESTS)["tests"]
             for case in test.get("alert_rule_test", ()) if not case["exp_alerts"]}
    assert fired == ALERTS and quiet == ALERTS  # each fires, and each is seen not firing first


@pytest.mark.parametrize("threshold, broken", [("> 0.5", "> 0.8"), ("> 0.05", "> 0.5")])
def test_the_unit_tests_catch_a_wrong_threshold(threshold: str, broken: str,
                                                tmp_path: Path) -> None:
    text = RULES.read_text()
    assert f"{threshold}\n" in text
    (tmp_path / RULES.name).write_text(text.replace(f"{threshold}\n", f"{broken}\n", 1))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = run("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0, result.stdout


def test_the_prometheus_rule_holds_the_same_groups() -> None:
    docs = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    assert [d["kind"] for d in docs] == ["PrometheusRule"]
    assert docs[0]["spec"] == load(RULES), "regenerate prometheusrule.yaml from the rules file"
