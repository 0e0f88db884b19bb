"""The decoders' autoscaler (issue 37): applies DecoderScaler's decisions to a job's decoders'
Deployment through the Kubernetes API.

The policy is pure (trainfeed.master.core.decoder_scaling); this is its shell: each `step` reads
the Deployment (its spec.replicas, and its bounds from the DECODERS_ANNOTATION, so that `kubectl
scale` and `kubectl annotate` are seen), decides with the figures the caller gives, and patches
spec.replicas when the decision changes it. An API that refuses or cannot be reached is a
decision too (`api-error`, nothing changed, no cooldown started), never an exception: the
master that runs this must go on serving its readers.

The master runs one per job with decoders, from a thread of its own or an executor (the calls
block, up to REQUEST_TIMEOUT_S each), every STEP_S or so:

    scaler = DecoderAutoscaler.in_cluster(job)
    decision = scaler.step(time.monotonic(), trainers={job: shares}, decoders_busy=busy)

`last` is the latest decision, for the status page and the metrics (`view()`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

from trainfeed.cluster.jobs import Cluster
from trainfeed.cluster.kube import connect, current_namespace
from trainfeed.cluster.objects import DECODERS_ANNOTATION
from trainfeed.cluster.spec import ObjectNames
from trainfeed.errors import ClusterError
from trainfeed.master.core.decoder_scaling import (
    DEFAULT_COOLDOWN_S,
    HOLD,
    MAX_DECODERS,
    Bounds,
    Decision,
    DecoderScaler,
    Observation,
)

logger = logging.getLogger(__name__)

# The most of an API error's text a decision keeps (the server's message can be long, and the
# status page shows it).
MAX_DETAIL = 300
# How often the master should step: a few times per cooldown, and no more often than the
# readers send their figures (at least every lease_timeout / 3, 10 s by default).
STEP_S = 15.0


class DecoderAutoscaler:
    """One job's decoder pool, scaled. Not thread-safe: one caller steps it.

    Args:
        cluster: the namespace the job runs in.
        job: the job's name (its decoders' Deployment is `<job>-decoders`).
        bounds: used while the Deployment has no annotation; without either, the pool is held
            at the size it has (a Deployment `submit` did not make is not resized by guess).
        cooldown_s: no two changes closer than this.
    """

    def __init__(self, cluster: Cluster, job: str, bounds: Bounds | None = None,
                 cooldown_s: float = DEFAULT_COOLDOWN_S):
        self.cluster = cluster
        self.job = job
        self.deployment = ObjectNames(job).decoders
        self._configured = bounds
        self.scaler = DecoderScaler(bounds or Bounds(1, 1), cooldown_s)
        self.last: Decision | None = None

    @classmethod
    def in_cluster(cls, job: str, cooldown_s: float = DEFAULT_COOLDOWN_S) -> DecoderAutoscaler:
        """From the pod's ServiceAccount (or a kubeconfig), in the namespace it runs in."""
        return cls(Cluster(connect(), current_namespace()), job, cooldown_s=cooldown_s)

    def step(self, now: float, trainers: Mapping[str, Sequence[float]],
             decoders_busy: Sequence[float]) -> Decision:
        """Reads the pool, decides at `now`, applies the decision; returns it.

        Args:
            now: a monotonic time in seconds (the cooldown is measured in it).
            trainers: job -> its trainers' input-bound shares (ReaderBoard.views' input_bound).
            decoders_busy: each decoder's busy share over its last report window.
        """
        try:
            replicas = self._read()
        except ClusterError as e:
            return self._failed(now, self.last.replicas if self.last else 0, e)
        decision = self.scaler.decide(now, Observation(trainers, decoders_busy, replicas))
        if decision.changes:
            try:
                self.cluster.set_replicas(self.job, self.deployment, decision.replicas)
            except ClusterError as e:
                self.scaler.failed()
                return self._failed(now, replicas, e)
            logger.info("decoders of job %s: %d -> %d (%s: %s)", self.job, decision.before,
                        decision.replicas, decision.reason, decision.detail)
        self.last = decision
        return decision

    def _read(self) -> int:
        """The Deployment's replicas; its annotation's bounds become the scaler's."""
        obj = self.cluster.read_deployment(self.job, self.deployment)
        replicas = int(obj.get("spec", {}).get("replicas") or 0)
        text = (obj.get("metadata", {}).get("annotations") or {}).get(DECODERS_ANNOTATION)
        if text is None:
            size = min(max(1, replicas), MAX_DECODERS)
            self.scaler.bounds = self._configured or Bounds(size, size)
        else:
            try:
                self.scaler.bounds = Bounds.parse(text)
            except ValueError as e:
                logger.warning("Deployment %s: annotation %s=%r ignored (%s); keeping %s",
                               self.deployment, DECODERS_ANNOTATION, text[:40], e,
                               self.scaler.bounds)
        return replicas

    def _failed(self, now: float, replicas: int, error: ClusterError) -> Decision:
        logger.warning("decoders of job %s: %s", self.job, error)
        decision = Decision(now, HOLD, replicas, replicas, "api-error",
                            str(error)[:MAX_DETAIL], 0.0, 0.0)
        if self.last is not None:  # keep the figures the page showed
            decision = dataclasses.replace(decision, busy=self.last.busy,
                                           input_bound=self.last.input_bound)
        self.last = decision
        return decision

    def view(self) -> dict[str, object]:
        """For the status page and /status.json: the pool, its bounds and the last decision
        (its `detail` is text from the cluster and job names: escape it in HTML)."""
        return {"job": self.job, "deployment": self.deployment,
                "bounds": str(self.scaler.bounds), "cooldown_s": self.scaler.cooldown_s,
                "decision": self.last.view() if self.last else None}

    def close(self) -> None:
        self.cluster.close()

    def __enter__(self) -> DecoderAutoscaler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
