"""`trainfeed submit`, `scale`, `status` and `delete` through the real `kubernetes` client, against
the stand-in API server of apiserver.py (there is no Kubernetes cluster here): the calls, paths
and bodies the CLI sends, and what it makes of the answers."""
from __future__ import annotations

import base64
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from cluster.apiserver import FakeApiServer

from trainfeed.cli.main import main
from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import JobSpec

NS = "team-a"
SUBMIT = ["submit", "--name", "resnet", "--image", "reg/trainfeed-torch:0.1.0", "--workers", "2",
          "--dataset", "flowers", "--storage-pvc", "datasets", "--", "python", "train.py"]


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path, namespace=NS)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield server


def stored_token(kube: FakeApiServer) -> str:
    secret = kube.objects("secrets", NS)["resnet-trainfeed-auth"]
    return base64.b64decode(secret["data"]["token"]).decode()


def test_submit_creates_the_objects_in_the_context_namespace(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SUBMIT) == 0
    out = capsys.readouterr().out
    assert f"submitted job 'resnet' to namespace '{NS}'" in out
    assert f"kubectl port-forward -n {NS} svc/resnet-master 50051:50051" in out
    # The workers Job first, suspended, so that the others can name it as their owner; then
    # resumed once its Secret and master exist.
    calls = [(method, path) for method, path, _ in kube.requests]
    assert calls == [("POST", f"/apis/batch/v1/namespaces/{NS}/jobs"),
                     ("POST", f"/api/v1/namespaces/{NS}/secrets"),
                     ("POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims"),
                     ("POST", f"/api/v1/namespaces/{NS}/services"),
                     ("POST", f"/apis/apps/v1/namespaces/{NS}/deployments"),
                     ("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/resnet-workers")]
    token = stored_token(kube)
    assert len(token) >= 43
    expected = job_objects(JobSpec(name="resnet", image="reg/trainfeed-torch:0.1.0", workers=2,
                                   dataset="flowers", command=("python", "train.py"),
                                   storage_pvc="datasets", namespace=NS), token)
    job = kube.objects("jobs", NS)["resnet-workers"]
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "resnet-workers",
              "uid": job["metadata"]["uid"]}]
    for obj, resource in zip(expected[1:], ["persistentvolumeclaims", "services", "deployments",
                                            "jobs"]):
        sent = copy.deepcopy(kube.objects(resource, NS)[obj["metadata"]["name"]])
        if resource == "jobs":
            assert sent["spec"].pop("suspend") is False  # created suspended, then resumed
        else:  # owned by the workers Job: deleted with it (`delete`, or its TTL)
            assert sent["metadata"].pop("ownerReferences") == owner
        # What arrived is what was built (the server adds uid, resourceVersion, …).
        assert sent["spec"] == obj["spec"]
        assert obj["metadata"].items() <= sent["metadata"].items()
    assert kube.objects("secrets", NS)["resnet-trainfeed-auth"]["metadata"][
        "ownerReferences"] == owner


def test_the_workers_job_takes_the_masters_objects_along_when_it_goes(
        kube: FakeApiServer) -> None:
    """What ttlSecondsAfterFinished does once the Job has finished: the TTL controller deletes
    the Job, and the garbage collector its dependents (the stand-in server plays both; the
    owner references it follows are the ones `submit` sent). Before, the master's
    Deployment, Service, PVC and Secret outlived the Job."""
    submit = [*SUBMIT]
    submit.insert(submit.index("--"), "--sync")
    assert main(submit) == 0
    assert kube.objects("jobs", NS)["resnet-workers"]["spec"]["ttlSecondsAfterFinished"] == 86400
    assert len(kube.store) == 6
    batch = kubernetes.client.BatchV1Api(
        kubernetes.config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))
    batch.delete_namespaced_job("resnet-workers", NS, propagation_policy="Background")
    assert kube.store == {}


def test_a_refused_object_after_the_job_is_taken_back_with_it(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    kube.refuse["deployments"] = (403, "Forbidden", "exceeded quota: pods")
    assert main(SUBMIT) == 2
    assert "create Deployment resnet-master" in capsys.readouterr().err
    assert kube.store == {}  # the Job, Secret, PVC and Service were deleted again
    assert not [r for r in kube.requests if r[0] == "PATCH"]  # the Job never started


def test_submitting_an_existing_job_changes_nothing(kube: FakeApiServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SUBMIT) == 0
    token = stored_token(kube)
    assert main(SUBMIT) == 2
    err = capsys.readouterr().err
    assert "a trainfeed job 'resnet' already exists in namespace 'team-a'" in err
    assert stored_token(kube) == token and len(kube.objects("jobs", NS)) == 1
    assert not [r for r in kube.requests if r[0] == "DELETE"]


def test_a_refused_submit_leaves_nothing_behind(kube: FakeApiServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    kube.refuse["jobs"] = (403, "Forbidden", 'jobs.batch "resnet-workers" is forbidden: '
                           'exceeded quota: jobs, requested: count/jobs.batch=1, used: '
                           'count/jobs.batch=4, limited: count/jobs.batch=4')
    assert main(SUBMIT) == 2
    err = capsys.readouterr().err
    assert "trainfeed submit: error: create Job resnet-workers: the ResourceQuota of namespace " \
           "'team-a' is exceeded" in err
    assert "limited: count/jobs.batch=4" in err
    assert kube.store == {}  # the Job is created first: nothing else was made


def test_scale_sets_parallelism_and_completions(kube: FakeApiServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SUBMIT) == 0
    submitted = len(kube.requests)
    assert main(["scale", "resnet", "--workers", "5"]) == 0
    assert "job 'resnet': workers 2 -> 5" in capsys.readouterr().out
    spec = kube.objects("jobs", NS)["resnet-workers"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (5, 5)
    patch = [r for r in kube.requests[submitted:] if r[0] == "PATCH"]
    assert patch == [("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/resnet-workers",
                      "application/json-patch+json")]
    assert main(["scale", "resnet", "--workers", "1"]) == 0
    assert kube.objects("jobs", NS)["resnet-workers"]["spec"]["parallelism"] == 1
    # Zero completions would complete the Indexed Job, ending the training: refused.
    assert main(["scale", "resnet", "--workers", "0"]) == 2
    assert "--workers must be at least 1, got 0 (to pause a job" in capsys.readouterr().err
    assert kube.objects("jobs", NS)["resnet-workers"]["spec"]["completions"] == 1


def test_scale_refuses_unknown_and_finished_jobs(kube: FakeApiServer,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scale", "ghost", "--workers", "3"]) == 2
    assert "no trainfeed job 'ghost' in namespace 'team-a'" in capsys.readouterr().err
    assert main(SUBMIT) == 0
    kube.objects("jobs", NS)["resnet-workers"]["status"] = {
        "conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2}
    assert main(["scale", "resnet", "--workers", "3"]) == 2
    assert "have finished (Complete)" in capsys.readouterr().err


def test_delete_removes_every_object_of_the_job_and_only_those(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SUBMIT) == 0
    assert main([*SUBMIT[:2], "other", *SUBMIT[3:]]) == 0
    assert main(["delete", "resnet"]) == 0
    out = capsys.readouterr().out
    assert "deleted job 'resnet' from namespace 'team-a': Job/resnet-workers, " \
           "Deployment/resnet-master, Service/resnet-master, " \
           "PersistentVolumeClaim/resnet-master-state, Secret/resnet-trainfeed-auth" in out
    remaining = {name for (_, _, name) in kube.store}
    assert remaining == {"other-trainfeed-auth", "other-master-state", "other-master",
                         "other-workers"}
    deletes = [path for method, path, _ in kube.requests if method == "DELETE"]
    assert all(path.endswith("?propagationPolicy=Background") for path in deletes)
    assert main(["delete", "resnet"]) == 2
    assert "no trainfeed job 'resnet' in namespace 'team-a'" in capsys.readouterr().err


def test_decoders_are_submitted_owned_by_the_workers_and_deleted_with_the_job(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: `--decoders MIN:MAX` adds the decoders' Deployment and Service and the master's
    ServiceAccount, Role and RoleBinding; all go with the job."""
    assert main([*SUBMIT[:-3], "--decoders", "2:6", *SUBMIT[-3:]]) == 0
    decoders = kube.objects("deployments", NS)["resnet-decoders"]
    assert decoders["spec"]["replicas"] == 2
    assert decoders["metadata"]["ownerReferences"][0]["name"] == "resnet-workers"
    role = kube.objects("roles", NS)["resnet-decoders"]
    assert role["rules"][0]["resourceNames"] == ["resnet-decoders"]
    binding = kube.objects("rolebindings", NS)["resnet-decoders"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "resnet-master",
                                    "namespace": NS}]
    master = kube.objects("deployments", NS)["resnet-master"]["spec"]["template"]["spec"]
    assert master["serviceAccountName"] == "resnet-master"
    assert main(["delete", "resnet"]) == 0
    assert "RoleBinding/resnet-decoders" in capsys.readouterr().out
    assert kube.store == {}


def test_status_shows_pods_and_fails_on_image_pull_problems(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SUBMIT) == 0
    labels = {"trainfeed.io/job": "resnet", "app.kubernetes.io/component": "workers"}
    for i, state in enumerate([
            {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            {"waiting": {"reason": "ImagePullBackOff",
                         "message": 'Back-off pulling image "reg/trainfeed-torch:0.1.0"'}}]):
        kube.add("pods", NS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"resnet-workers-{i}-abcde", "labels": labels},
            "spec": {"containers": [{"name": "worker", "image": "reg/trainfeed-torch:0.1.0"}]},
            "status": {"phase": "Running" if i == 0 else "Pending", "containerStatuses": [{
                "name": "worker", "image": "reg/trainfeed-torch:0.1.0", "imageID": "",
                "ready": i == 0, "restartCount": 0, "state": state}]}})
    capsys.readouterr()
    assert main(["status", "resnet"]) == 2
    captured = capsys.readouterr()
    assert "master pods no pods" in captured.out
    assert "workers pods 1 Pending, 1 Running" in captured.out
    assert "problem     pod resnet-workers-1-abcde: cannot pull image" in captured.out
    assert "progress    not shown: give --master localhost:50051 after `kubectl " \
           "port-forward -n team-a svc/resnet-master 50051:50051`" in captured.out
    assert "trainfeed status: error: job 'resnet' cannot run as it is: pod " \
           "resnet-workers-1-abcde: cannot pull image 'reg/trainfeed-torch:0.1.0'" \
           in captured.err


def test_status_of_an_unknown_job(kube: FakeApiServer,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "ghost"]) == 2
    assert "no trainfeed job 'ghost' in namespace 'team-a'" in capsys.readouterr().err


def test_cluster_api_down_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with FakeApiServer() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
        url = server.url
    assert main(["delete", "resnet"]) == 2  # the server is gone now
    err = capsys.readouterr().err
    assert f"cannot reach the Kubernetes API at {url}" in err


def test_a_synchronous_job_is_submitted_with_its_service_refuses_scaling_and_deletes_whole(
        kube: FakeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    submit = [*SUBMIT]
    submit.insert(submit.index("--"), "--sync")
    assert main(submit) == 0
    assert set(kube.objects("services", NS)) == {"resnet-master", "resnet-workers"}
    assert main(["scale", "resnet", "--workers", "5"]) == 2
    assert "is synchronous: its world size is fixed" in capsys.readouterr().err
    assert kube.objects("jobs", NS)["resnet-workers"]["spec"]["parallelism"] == 2
    assert main(["delete", "resnet"]) == 0
    assert "Service/resnet-workers" in capsys.readouterr().out
    assert kube.objects("services", NS) == {}


def test_a_synchronous_job_with_checkpoints_and_a_pull_secret_reaches_the_api(
        kube: FakeApiServer) -> None:
    """Issue 38, papercut 6: the flags a sync job on a private registry needs arrive in what the
    API server stores (the pods get the registry's Secret, the workers the writable volume)."""
    submit = [*SUBMIT]
    submit[submit.index("--"):submit.index("--")] = [
        "--sync", "--checkpoint-pvc", "checkpoints", "--image-pull-secret", "regcred"]
    assert main(submit) == 0
    workers = kube.objects("jobs", NS)["resnet-workers"]["spec"]["template"]["spec"]
    master = kube.objects("deployments", NS)["resnet-master"]["spec"]["template"]["spec"]
    assert workers["imagePullSecrets"] == master["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}} in \
        workers["volumes"]
    env = {e["name"]: e.get("value") for e in workers["containers"][0]["env"]}
    assert env["TRAINFEED_CHECKPOINT_DIR"] == "/checkpoints/resnet"
    # A request a 4-core node can hold: one GPU, one training process, 2 + 1 cores.
    assert workers["containers"][0]["resources"]["requests"]["cpu"] == "3"
