"""The decoders' autoscaler (trainfeed.master.serve.decoder_autoscaler) against the stand-in
Kubernetes API server of tests/cluster/apiserver.py: a fake, because no real API server runs
where these tests do. The real `kubernetes` client makes its real calls (read and JSON-patch of
the Deployment `trainfeed submit --decoders` made); the fake stores what they set."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.apiserver import FakeApiServer

from trainfeed.cli.main import main
from trainfeed.master.core.decoder_scaling import UP_INPUT_BOUND, trainer_shares
from trainfeed.master.core.messages import ReaderStats
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.serve.decoder_autoscaler import MAX_DETAIL, STEP_S, DecoderAutoscaler

NS = "team-a"
COOLDOWN_S = 60.0
SUBMIT = ["submit", "--name", "resnet", "--image", "reg/trainfeed-torch:0.1.0", "--workers", "2",
          "--dataset", "flowers", "--storage-pvc", "datasets", "--decoders", "1:8", "--",
          "python", "train.py"]


@pytest.fixture
def decoders_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    """The fake API server, holding a job submitted with `--decoders 1:8` (not
    tests/cluster/test_jobs.py's `kube`, which holds nothing)."""
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path, namespace=NS)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        assert main(SUBMIT) == 0
        yield server


def replicas(kube: FakeApiServer) -> int:
    return int(kube.objects("deployments", NS)["resnet-decoders"]["spec"]["replicas"])


class SimulatedJob:
    """Two trainers that would take 2.5 decoders' output: with n decoders they get
    min(n, 2.5) / 2.5 of the data they want (input-bound 60 % with one), and the decoders are
    busy min(2.5, n) / n of their time. The trainers' readers send their summaries to the
    master's real ReaderBoard, as they do with their calls; stopped ones send nothing, and idle
    decoders report 0."""

    DEMAND = 2.5

    def __init__(self) -> None:
        self.running = True
        self.board = ReaderBoard()

    def share(self, n: int) -> float:
        return 1 - min(n, self.DEMAND) / self.DEMAND

    def figures(self, now: float, n: int) -> tuple[dict[str, list[float]], list[float]]:
        if self.running:
            for worker in ("trainer-0", "trainer-1"):
                self.board.record("resnet", worker, ReaderStats(
                    wall_s=STEP_S, input_wait_s=self.share(n) * STEP_S, records=100), now)
        shares = trainer_shares(self.board.views("resnet", now))
        busy = min(self.DEMAND, n) / n if self.running else 0.0
        return ({"resnet": shares} if shares else {}), [busy] * n


def test_an_input_bound_job_is_scaled_up_until_fed_then_down_when_it_stops(
        decoders_job: FakeApiServer) -> None:
    kube = decoders_job
    job = SimulatedJob()
    assert replicas(kube) == 1 and job.share(1) == pytest.approx(0.6)
    sizes, changes_at = [1], []
    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=COOLDOWN_S) as scaler:
        now = 1000.0
        for step in range(40):  # 10 minutes of STEP_S steps
            now += STEP_S
            if step == 20:
                job.running = False
            n = replicas(kube)
            decision = scaler.step(now, *job.figures(now, n))
            assert decision.before == n
            if decision.changes:
                changes_at.append(now)
                sizes.append(replicas(kube))
                assert replicas(kube) == decision.replicas
            if step == 19:  # before the trainers stop: fed
                assert job.share(replicas(kube)) < UP_INPUT_BOUND
                assert scaler.last is not None and scaler.last.reason == "steady"
    # 1 -> 2 (the estimate 1 / 0.4 = 3, at most double) -> 3 (2 / 0.8), then back to the minimum.
    assert sizes == [1, 2, 3, 1]
    assert all(b - a >= COOLDOWN_S for a, b in zip(changes_at, changes_at[1:]))
    patches = [r for r in kube.requests if r[0] == "PATCH" and "/deployments/" in r[1]]
    assert len(patches) == 3
    assert all(p[1].endswith("/deployments/resnet-decoders")
               and p[2] == "application/json-patch+json" for p in patches)
    view = scaler.view()
    assert view["bounds"] == "1:8" and view["decision"]["reason"] == "at-min"  # type: ignore


def test_bounds_follow_the_deployments_annotation(decoders_job: FakeApiServer) -> None:
    kube = decoders_job
    deployment = kube.objects("deployments", NS)["resnet-decoders"]
    deployment["metadata"]["annotations"]["trainfeed.io/decoders"] = "1:2"
    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=0.0) as scaler:
        for now in range(5):
            scaler.step(float(now), {"resnet": [0.9]}, [1.0] * replicas(kube))
        assert replicas(kube) == 2 and scaler.last is not None
        assert scaler.last.reason == "at-max"
        # `kubectl scale` past the bounds is brought back.
        deployment["spec"]["replicas"] = 7
        assert scaler.step(10.0, {}, [0.9] * 7).reason == "above-max"
        assert replicas(kube) == 2


@pytest.mark.parametrize("text", ["x", "0:4", "3:2", "1:100000", "9" * 5000, "1:2:3"])
def test_an_annotation_that_is_no_bounds_is_ignored(decoders_job: FakeApiServer, text: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The annotation is anyone's who may annotate Deployments in the namespace: what is not
    MIN:MAX within 1..1000 leaves the bounds as they were, and is logged shortened."""
    kube = decoders_job
    deployment = kube.objects("deployments", NS)["resnet-decoders"]
    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=0.0) as scaler:
        scaler.step(0.0, {}, [0.7])
        assert str(scaler.scaler.bounds) == "1:8"
        deployment["metadata"]["annotations"]["trainfeed.io/decoders"] = text
        with caplog.at_level("WARNING", logger="trainfeed.master.serve.decoder_autoscaler"):
            for now in range(1, 6):
                scaler.step(float(now), {"resnet": [0.9]}, [1.0] * replicas(kube))
        assert str(scaler.scaler.bounds) == "1:8" and 1 < replicas(kube) <= 8
        assert "ignored" in caplog.text and len(caplog.text) < 1000 * len(caplog.records)


def test_a_deployment_without_bounds_is_held_at_its_size(decoders_job: FakeApiServer) -> None:
    kube = decoders_job
    deployment = kube.objects("deployments", NS)["resnet-decoders"]
    del deployment["metadata"]["annotations"]["trainfeed.io/decoders"]
    deployment["spec"]["replicas"] = 3
    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=0.0) as scaler:
        assert scaler.step(0.0, {"resnet": [0.9]}, [1.0] * 3).reason == "at-max"
        assert scaler.step(1.0, {}, [0.0] * 3).reason == "at-min"
        assert replicas(kube) == 3


def test_an_api_refusal_is_a_held_decision_not_an_exception(decoders_job: FakeApiServer) -> None:
    kube = decoders_job
    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=COOLDOWN_S) as scaler:
        del kube.store[("deployments", NS, "resnet-decoders")]
        decision = scaler.step(0.0, {"resnet": [0.6]}, [1.0])
        assert (decision.action, decision.reason) == ("hold", "api-error")
        assert "resnet-decoders" in decision.detail
        assert len(decision.detail) <= MAX_DETAIL
        assert scaler.scaler.last_change is None  # nothing changed: no cooldown


@pytest.mark.usefixtures("decoders_job")
def test_the_last_decision_is_exported_as_metrics() -> None:
    from prometheus_client import CollectorRegistry

    from trainfeed.master.serve.metrics import JobDecoders, MasterCollector

    with DecoderAutoscaler.in_cluster("resnet", cooldown_s=COOLDOWN_S) as scaler:
        scaler.step(0.0, {"resnet": [0.6, 0.6]}, [1.0])
        registry = CollectorRegistry()
        registry.register(MasterCollector(
            lambda: [], decoders=lambda: [JobDecoders(scaler.job, scaler.last)]  # type: ignore
            if scaler.last else []))
        value = registry.get_sample_value
        assert value("trainfeed_decoders", {"job": "resnet"}) == 2
        assert value("trainfeed_decoders_busy", {"job": "resnet"}) == 1.0
        assert value("trainfeed_decoders_scaling",
                     {"job": "resnet", "action": "up", "reason": "input-bound"}) == 1
        scaler.step(1.0, {"resnet": [0.6, 0.6]}, [1.0, 1.0])
        assert value("trainfeed_decoders_scaling",
                     {"job": "resnet", "action": "hold", "reason": "cooldown"}) == 1
        assert value("trainfeed_decoders_scaling",
                     {"job": "resnet", "action": "up", "reason": "input-bound"}) is None
