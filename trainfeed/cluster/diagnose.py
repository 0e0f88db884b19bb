"""Reading a job's pods and events for what a user must know: how many run, and what is stuck.

Pure functions of the API's dicts (as `kubectl get -o json` shows them), so that every rule is
tested on the shapes Kubernetes really sends. A problem is *blocking* when waiting cannot fix it
(an image that cannot be pulled, a missing Secret, a refused pod creation such as an exceeded
quota); an unscheduled pod is not: an autoscaler may still add a GPU node.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainfeed.cluster.spec import COMPONENT_LABEL

# The kubelet's reasons for a container that waits on its image.
PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                          "ErrImageNeverPull", "RegistryUnavailable", "SignatureValidationFailed"})
PULL_HINT = ("check the image name and tag, and that the nodes may pull from its registry "
             "(imagePullSecrets for a private one)")

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Problem:
    subject: str  # "pod example-workers-0-x7k2p", "Job example-workers"
    text: str
    blocking: bool

    def __str__(self) -> str:
        return f"{self.subject}: {self.text}"


def phases(pods: Iterable[Obj]) -> dict[str, Counter[str]]:
    """Component ("master", "workers") -> pod phase -> count."""
    out: dict[str, Counter[str]] = {}
    for pod in pods:
        component = pod.get("metadata", {}).get("labels", {}).get(COMPONENT_LABEL, "other")
        out.setdefault(component, Counter())[pod.get("status", {}).get("phase") or "Unknown"] += 1
    return out


def _pod_problems(pod: Obj) -> list[Problem]:
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {})
    subject = f"pod {name}"
    images = {c.get("name"): c.get("image") for c in pod.get("spec", {}).get("containers", ())}
    found = []
    for c in status.get("containerStatuses") or ():
        state = c.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        reason, message = waiting.get("reason"), (waiting.get("message") or "").strip()
        image = c.get("image") or images.get(c.get("name"), "?")
        if reason in PULL_REASONS:
            found.append(Problem(subject, f"cannot pull image {image!r} ({reason}: {message}); "
                                          f"{PULL_HINT}", blocking=True))
        elif reason == "CreateContainerConfigError":
            found.append(Problem(subject, f"cannot start: {message} (a Secret named by "
                                          f"--s3-secret, or the job's token Secret, is missing?)",
                                 blocking=True))
        elif reason == "CrashLoopBackOff" or terminated.get("exitCode"):
            last = terminated or (c.get("lastState") or {}).get("terminated") or {}
            found.append(Problem(subject, f"container {c.get('name')} exited with code "
                                          f"{last.get('exitCode', '?')} ({last.get('reason')}), "
                                          f"{c.get('restartCount', 0)} restart(s); see "
                                          f"`kubectl logs {name}`", blocking=False))
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            found.append(Problem(subject, f"not scheduled: {cond.get('message', '').strip()} "
                                          f"(check --gpus-per-worker, --node-selector and "
                                          f"--toleration against the nodes)", blocking=False))
    return found


def _event_problem(event: Obj) -> Problem | None:
    obj = event.get("involvedObject", {})
    subject = f"{obj.get('kind', '?')} {obj.get('name', '?')}"
    reason, message = event.get("reason"), (event.get("message") or "").strip()
    if reason == "FailedCreate":
        # The Job or ReplicaSet controller could not make a pod: a quota, an admission policy.
        hint = ("; ask for fewer --workers or --gpus-per-worker, or a larger quota"
                if "exceeded quota" in message else "")
        return Problem(subject, f"cannot create pods: {message}{hint}", blocking=True)
    if obj.get("kind") == "Pod" and reason in ("Failed", "BackOff") and "pull" in message.lower():
        return Problem(f"pod {obj.get('name', '?')}",
                       f"cannot pull its image ({reason}: {message}); {PULL_HINT}", blocking=True)
    return None


def problems(pods: Iterable[Obj], events: Iterable[Obj]) -> list[Problem]:
    """What keeps the job's pods from running, from their statuses first and then from the
    events (which say the same about a pod at most once here)."""
    found: list[Problem] = []
    for pod in pods:
        found.extend(_pod_problems(pod))
    seen = {(p.subject, p.blocking) for p in found}
    for event in events:
        problem = _event_problem(event)
        if problem is not None and (problem.subject, problem.blocking) not in seen:
            seen.add((problem.subject, problem.blocking))
            found.append(problem)
    return found
