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
    """A pod's problems: each of its containers' (at most one each), then whether it is
    still unscheduled."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {})
    images = {c.get("name"): c.get("image") for c in pod.get("spec", {}).get("containers", ())}
    found = [_container_problem(name, c, images) for c in status.get("containerStatuses") or ()]
    found += [_unscheduled(name, cond) for cond in status.get("conditions") or ()]
    return [p for p in found if p is not None]


def _container_problem(pod: str, container: Obj, images: Mapping[Any, Any]) -> Problem | None:
    """What keeps one container of pod `pod` from running, by the kubelet's reason for its
    waiting: its image (blocking), its configuration (blocking) or its crashing (not blocking:
    a restart may succeed). `images` names each container's image from the pod's spec, for a
    status that does not say it."""
    state = container.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    reason, message = waiting.get("reason"), (waiting.get("message") or "").strip()
    if reason in PULL_REASONS:
        image = container.get("image") or images.get(container.get("name"), "?")
        return Problem(f"pod {pod}", f"cannot pull image {image!r} ({reason}: {message}); "
                                     f"{PULL_HINT}", blocking=True)
    if reason == "CreateContainerConfigError":
        return Problem(f"pod {pod}", f"cannot start: {message} (a Secret named by "
                                     f"--s3-secret, or the job's token Secret, is missing?)",
                       blocking=True)
    if reason == "CrashLoopBackOff" or terminated.get("exitCode"):
        return _crashed(pod, container, terminated)
    return None


def _crashed(pod: str, container: Obj, terminated: Obj) -> Problem:
    """A container that exited with an error: its exit code and reason, from its current state
    or else its last (a CrashLoopBackOff waits with the crash in lastState)."""
    last = terminated or (container.get("lastState") or {}).get("terminated") or {}
    return Problem(f"pod {pod}", f"container {container.get('name')} exited with code "
                                 f"{last.get('exitCode', '?')} ({last.get('reason')}), "
                                 f"{container.get('restartCount', 0)} restart(s); see "
                                 f"`kubectl logs {pod}`", blocking=False)


def _unscheduled(pod: str, condition: Obj) -> Problem | None:
    """A PodScheduled condition that is False: no node fits the pod yet. Not blocking: an
    autoscaler may still add one."""
    if condition.get("type") != "PodScheduled" or condition.get("status") != "False":
        return None
    return Problem(f"pod {pod}", f"not scheduled: {condition.get('message', '').strip()} "
                                 f"(check --gpus-per-worker, --node-selector and "
                                 f"--toleration against the nodes)", blocking=False)


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
