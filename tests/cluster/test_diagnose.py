"""Reading pods and events as the API sends them (shapes from `kubectl get -o json`)."""
from __future__ import annotations

from typing import Any

from trainfeed.cluster.diagnose import phases, problems


def pod(name: str, component: str, phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"trainfeed.io/job": "resnet",
                                                  "app.kubernetes.io/component": component}},
            "spec": {"containers": [{"name": "worker", "image": "reg/trainfeed-torch:0.1.0"}]},
            "status": {"phase": phase, **status}}


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"containerStatuses": [{
        "name": "worker", "image": "reg/trainfeed-torch:0.1.0", "ready": False,
        "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}


def event(kind: str, name: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": "Warning", "reason": reason, "message": message, "count": 3,
            "involvedObject": {"kind": kind, "name": name, "namespace": "ml"}}


def test_phases_by_component() -> None:
    pods = [pod("resnet-master-6d9f-x", "master", "Running"),
            pod("resnet-workers-0-a", "workers", "Running"),
            pod("resnet-workers-1-b", "workers", "Pending"),
            pod("resnet-workers-2-c", "workers", "Running")]
    counts = phases(pods)
    assert counts["master"] == {"Running": 1}
    assert counts["workers"] == {"Running": 2, "Pending": 1}


def test_image_pull_failures_block_and_name_the_image() -> None:
    pulling = pod("resnet-workers-0-a", "workers", "Pending", **waiting(
        "ImagePullBackOff", 'Back-off pulling image "reg/trainfeed-torch:0.1.0"'))
    found = problems([pulling], [])
    assert len(found) == 1 and found[0].blocking
    assert str(found[0]).startswith("pod resnet-workers-0-a: cannot pull image "
                                    "'reg/trainfeed-torch:0.1.0' (ImagePullBackOff: Back-off")
    assert "imagePullSecrets" in str(found[0])


def test_pull_failures_known_only_from_events_are_found_once() -> None:
    message = ('Failed to pull image "reg/trainfeed-torch:0.1.0": rpc error: code = NotFound '
               'desc = failed to pull and unpack image: not found')
    pending = pod("resnet-workers-1-b", "workers", "Pending")
    found = problems([pending], [event("Pod", "resnet-workers-1-b", "Failed", message),
                                 event("Pod", "resnet-workers-1-b", "Failed", message)])
    assert [p.blocking for p in found] == [True]
    assert "NotFound desc = failed to pull" in str(found[0])
    # The same pod with its container status: one problem, not two.
    pulling = pod("resnet-workers-1-b", "workers", "Pending",
                  **waiting("ErrImagePull", message))
    assert len(problems([pulling], [event("Pod", "resnet-workers-1-b", "Failed", message)])) == 1


def test_quota_refusals_of_the_job_controller_block() -> None:
    message = ('pods "resnet-workers-3-x" is forbidden: exceeded quota: gpus, requested: '
               'requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=6, limited: '
               'requests.nvidia.com/gpu=8')
    found = problems([], [event("Job", "resnet-workers", "FailedCreate", message)])
    assert len(found) == 1 and found[0].blocking
    assert str(found[0]).startswith("Job resnet-workers: cannot create pods: pods "
                                    "\"resnet-workers-3-x\" is forbidden: exceeded quota")
    assert "fewer --workers" in str(found[0])


def test_missing_secret_blocks() -> None:
    stuck = pod("resnet-workers-0-a", "workers", "Pending", **waiting(
        "CreateContainerConfigError", 'secret "s3-creds" not found'))
    [found] = problems([stuck], [])
    assert found.blocking and 'secret "s3-creds" not found' in found.text


def test_unscheduled_and_crashing_pods_are_reported_but_do_not_block() -> None:
    unscheduled = pod("resnet-workers-2-c", "workers", "Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    crashing = pod("resnet-workers-0-a", "workers", "Running", containerStatuses=[{
        "name": "worker", "restartCount": 4, "ready": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    found = problems([unscheduled, crashing], [
        event("Pod", "resnet-workers-2-c", "FailedScheduling", "0/3 nodes are available")])
    assert [p.blocking for p in found] == [False, False]
    assert "Insufficient nvidia.com/gpu" in found[0].text and "--gpus-per-worker" in \
        found[0].text
    assert "exited with code 1 (Error), 4 restart(s)" in found[1].text
    assert "kubectl logs resnet-workers-0-a" in found[1].text


def test_healthy_pods_have_no_problems() -> None:
    running = pod("resnet-workers-0-a", "workers", "Running", containerStatuses=[{
        "name": "worker", "restartCount": 0, "ready": True,
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}])
    done = pod("resnet-workers-1-b", "workers", "Succeeded", containerStatuses=[{
        "name": "worker", "restartCount": 0, "ready": False,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}])
    assert problems([running, done], []) == []
