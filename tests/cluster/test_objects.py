"""The objects `trainfeed submit` creates, field by field: what the pods need to find each other,
the token, the storage and the GPUs, and what keeps them safe."""
from __future__ import annotations

from typing import Any

import pytest

from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import JobSpec, Toleration
from trainfeed.security import job_token

TOKEN = "t0k3n-for-tests-only-0123456789"


def build(**changes: Any) -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = dict(
        name="resnet", image="reg/trainfeed-torch:0.1.0", master_image="reg/trainfeed:0.1.0",
        workers=3, dataset="public/flowers", command=("python", "train.py", "--epochs", "3"),
        gpus_per_worker=2, namespace="ml", storage_pvc="datasets")
    base.update(changes)
    return {o["kind"]: o for o in job_objects(JobSpec(**base), TOKEN)}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_objects_come_in_creation_order_with_the_job_labels() -> None:
    objs = job_objects(JobSpec(name="resnet", image="i", workers=1, dataset="d",
                               command=("x",), storage_pvc="p"), TOKEN)
    assert [o["kind"] for o in objs] == ["Secret", "PersistentVolumeClaim", "Service",
                                         "Deployment", "Job"]
    for o in objs:
        assert o["metadata"]["labels"]["trainfeed.io/job"] == "resnet"
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainfeed"
        assert o["metadata"]["annotations"] == {"trainfeed.io/dataset": "d"}
        assert "namespace" not in o["metadata"]  # dry runs: `kubectl apply -n` decides
    for o in build().values():
        assert o["metadata"]["namespace"] == "ml"


def test_token_secret() -> None:
    secret = build()["Secret"]
    assert secret["metadata"]["name"] == "resnet-trainfeed-auth"
    # The master's token, and the job token the workers get (it opens this job only).
    assert secret["stringData"] == {"token": TOKEN, "job-token": job_token(TOKEN, "resnet")}
    assert secret["type"] == "Opaque"


def test_workers_find_the_master_service_and_get_the_job_token_and_storage() -> None:
    objs = build()
    service, job = objs["Service"], objs["Job"]
    container = pod(job)["containers"][0]
    env = env_of(container)
    # TRAINFEED_MASTER names the Service, on its gRPC port, and the Service selects the master.
    host, port = env["TRAINFEED_MASTER"].split(":")
    assert host == service["metadata"]["name"] == objs["Deployment"]["metadata"]["name"]
    assert int(port) == next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert service["spec"]["selector"].items() <= \
        objs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert env["TRAINFEED_JOB"] == "resnet"
    assert env["TRAINFEED_DATASET"] == "public/flowers"
    assert env["TRAINFEED_STORAGE"] == "/data"
    assert env["TRAINFEED_TOKEN"] == {"secretKeyRef": {"name": "resnet-trainfeed-auth",
                                                       "key": "job-token"}}
    assert env["TRAINFEED_GPUS"] == "2"
    assert env["TRAINFEED_WORKER_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "TRAIN_LOCAL" not in env and "envFrom" not in container
    assert container["command"] == ["python", "train.py", "--epochs", "3"]
    assert container["image"] == "reg/trainfeed-torch:0.1.0"


def test_workers_are_an_indexed_job_of_n_pods_with_gpus() -> None:
    job = build()["Job"]
    assert job["metadata"]["name"] == "resnet-workers"
    spec = job["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == \
        ("Indexed", 3, 3)
    assert pod(job)["restartPolicy"] == "Never"
    resources = pod(job)["containers"][0]["resources"]
    # Before: GPUs only (BestEffort CPU and memory). Now requests derived from the decode
    # threads: per GPU (training process) 2 + 1 cores and 2048 + 2 x 256 MiB (issue 38: 4 + 1
    # fit no 4-core node).
    assert resources == {"requests": {"cpu": "6", "memory": "5120Mi", "nvidia.com/gpu": "2"},
                         "limits": {"nvidia.com/gpu": "2"}}
    cpu = build(gpus_per_worker=0, cpus_per_worker="8", memory_per_worker="32Gi")["Job"]
    assert pod(cpu)["containers"][0]["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    assert env_of(pod(cpu)["containers"][0])["TRAINFEED_GPUS"] == "0"
    derived = build(gpus_per_worker=0, decode_threads=6)["Job"]
    assert pod(derived)["containers"][0]["resources"] == {
        "requests": {"cpu": "7", "memory": "3584Mi"}}  # one process; a request, no limit


def test_finished_workers_expire_after_a_day_unless_kept() -> None:
    assert build()["Job"]["spec"]["ttlSecondsAfterFinished"] == 86400
    assert build(ttl_after_finished_s=600)["Job"]["spec"]["ttlSecondsAfterFinished"] == 600
    assert "ttlSecondsAfterFinished" not in build(ttl_after_finished_s=None)["Job"]["spec"]
    with pytest.raises(ValueError, match="--ttl-after-finished must be 0 or more"):
        build(ttl_after_finished_s=-1)
    with pytest.raises(ValueError, match="--decode-threads must be at least 1"):
        build(decode_threads=0)


def test_node_selectors_and_tolerations_go_to_the_workers_only() -> None:
    objs = build(node_selector={"nvidia.com/gpu.product": "A100"},
                 tolerations=(Toleration.parse("nvidia.com/gpu:NoSchedule"),))
    assert pod(objs["Job"])["nodeSelector"] == {"nvidia.com/gpu.product": "A100"}
    assert pod(objs["Job"])["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeSelector" not in pod(objs["Deployment"])
    assert "nodeSelector" not in pod(build()["Job"]) and "tolerations" not in pod(build()["Job"])


def test_master_runs_one_replica_recreated_with_its_state_on_a_claim() -> None:
    objs = build()
    deployment, claim = objs["Deployment"], objs["PersistentVolumeClaim"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = pod(deployment)["containers"][0]
    assert container["image"] == "reg/trainfeed:0.1.0"
    args = container["args"]
    assert args[0] == "master"
    flags = dict(zip(args[1::2], args[2::2]))
    assert flags == {"--host": "0.0.0.0", "--port": "50051",
                     "--state": "/var/lib/trainfeed/master.db", "--metrics-port": "9090"}
    assert "--insecure" not in args
    env = env_of(container)
    assert env["TRAINFEED_TOKEN"]["secretKeyRef"]["name"] == "resnet-trainfeed-auth"
    assert env["TRAINFEED_STORAGE"] == "/data"
    # The state claim is mounted where --state points.
    assert claim["metadata"]["name"] == "resnet-master-state"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = {v["name"]: v for v in pod(deployment)["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "resnet-master-state"
    assert mounts["state"]["mountPath"] == "/var/lib/trainfeed"
    assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]


def test_master_probes_use_the_grpc_health_service_on_the_grpc_port() -> None:
    container = pod(build()["Deployment"])["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9090}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50051}, probe
    resources = container["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    service_ports = {p["name"]: (p["port"], p["targetPort"])
                     for p in build()["Service"]["spec"]["ports"]}
    assert service_ports == {"grpc": (50051, "grpc"), "metrics": (9090, "metrics")}


def test_shared_volume_is_mounted_read_only_in_master_and_workers() -> None:
    objs = build()
    for kind in ("Deployment", "Job"):
        volumes = {v["name"]: v for v in pod(objs[kind])["volumes"]}
        mounts = {m["name"]: m for m in pod(objs[kind])["containers"][0]["volumeMounts"]}
        assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "datasets",
                                                            "readOnly": True}
        assert mounts["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}
    job_volumes = {v["name"]: v for v in pod(objs["Job"])["volumes"]}
    assert job_volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_s3_storage_has_no_volume_and_takes_credentials_from_the_secret() -> None:
    objs = build(storage_pvc=None, storage="s3://bucket/datasets", s3_secret="s3-creds",
                 s3_endpoint="http://seaweedfs:8333")
    for kind in ("Deployment", "Job"):
        container = pod(objs[kind])["containers"][0]
        env = env_of(container)
        assert env["TRAINFEED_STORAGE"] == "s3://bucket/datasets"
        assert env["TRAINFEED_S3_ENDPOINT"] == "http://seaweedfs:8333"
        assert container["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
        assert "data" not in {v["name"] for v in pod(objs[kind])["volumes"]}
        assert "AWS_SECRET_ACCESS_KEY" not in env  # never a literal value


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_as_non_root_without_privileges_or_api_token(kind: str) -> None:
    spec = pod(build()[kind])
    assert spec["automountServiceAccountToken"] is False
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    container = spec["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}


def test_a_synchronous_job_wires_its_ranks_through_a_headless_service() -> None:
    objs = job_objects(JobSpec(name="resnet", image="i", workers=4, dataset="d",
                               command=("torchrun", "train.py"), storage_pvc="p", sync=True,
                               rendezvous_port=29400), TOKEN)
    assert [o["kind"] for o in objs] == ["Secret", "PersistentVolumeClaim", "Service",
                                         "Deployment", "Service", "Job"]
    service, job = objs[4], objs[5]
    assert service["metadata"]["name"] == job["metadata"]["name"] == "resnet-workers"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()  # the worker pods
    assert service["spec"]["ports"][0]["port"] == 29400
    spec = pod(job)
    assert spec["subdomain"] == "resnet-workers"
    env = env_of(spec["containers"][0])
    index = {"fieldRef": {"fieldPath":
                          "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["WORLD_SIZE"] == "4" and env["RANK"] == index and env["NODE_RANK"] == index
    assert env["NNODES"] == "4"
    assert env["MASTER_ADDR"] == "resnet-workers-0.resnet-workers"  # pod 0, through the Service
    assert env["MASTER_PORT"] == "29400"
    assert job["metadata"]["labels"]["trainfeed.io/sync"] == "true"
    assert spec["containers"][0]["ports"] == [
        {"name": "rendezvous", "containerPort": 29400, "protocol": "TCP"}]
    # One failed rank fails the whole group: no per-index retries (before: backoffLimitPerIndex
    # 3, so a failed rank was retried alone while the others sat in their collectives).
    assert "backoffLimitPerIndex" not in job["spec"] and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["podFailurePolicy"]["rules"] == [
        {"action": "FailJob",
         "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]}},
        {"action": "FailJob",
         "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]


def test_an_elastic_job_has_no_rank_wiring() -> None:
    job = build()["Job"]
    env = env_of(pod(job)["containers"][0])
    assert not {"WORLD_SIZE", "RANK", "MASTER_ADDR"} & set(env)
    assert "subdomain" not in pod(job)
    # A failed elastic worker is retried on its own: the others keep reading.
    assert job["spec"]["backoffLimitPerIndex"] == 3 and "podFailurePolicy" not in job["spec"]


def test_a_bad_rendezvous_port_is_refused() -> None:
    with pytest.raises(ValueError, match="--rendezvous-port must be a TCP port"):
        JobSpec(name="a", image="i", workers=1, dataset="d", command=("x",), storage_pvc="p",
                sync=True, rendezvous_port=70000)


# A 4-core node's allocatable CPU after the kubelet's and the system's reservations (GKE, EKS
# and AKS reserve 0.08-0.14 of 4 cores) and the DaemonSets' requests (kube-proxy, CNI, logging:
# a few hundred millicores): 3.5 leaves room for those.
FOUR_CORE_NODE_ALLOCATABLE = 3.5


@pytest.mark.parametrize("gpus", [0, 1])
def test_default_requests_fit_a_four_core_node(gpus: int) -> None:
    """Issue 38, papercut 6: a one-process worker asked for 5 CPUs (4 decode threads + 1),
    which no 4-core node can schedule."""
    for sync in (False, True):
        requests = pod(build(gpus_per_worker=gpus, sync=sync)["Job"])["containers"][0][
            "resources"]["requests"]
        assert float(requests["cpu"]) <= FOUR_CORE_NODE_ALLOCATABLE, requests
        assert requests["memory"] == "2560Mi"  # 2048Mi + 2 x 256Mi: any 4-core node's


def test_a_checkpoint_volume_is_mounted_writable_in_the_workers_only() -> None:
    """Issue 38, papercut 6: the documented recovery (submit again, resume from
    `reader.state_dict()`) needs somewhere to write the checkpoint that outlives the pods."""
    from trainfeed.settings import SETTINGS

    objs = build(checkpoint_pvc="ckpt", sync=True)
    workers = pod(objs["Job"])
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in \
        workers["volumes"]  # not readOnly
    container = workers["containers"][0]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in container["volumeMounts"]
    assert env_of(container)["TRAINFEED_CHECKPOINT_DIR"] == "/checkpoints/resnet"
    assert "TRAINFEED_CHECKPOINT_DIR" in SETTINGS  # documented with the other variables
    master = pod(objs["Deployment"])
    assert all(v["name"] != "checkpoints" for v in master["volumes"])
    # Without the flag, nothing: the objects stay as they were.
    plain = pod(build()["Job"])
    assert all(v["name"] != "checkpoints" for v in plain["volumes"])
    assert "TRAINFEED_CHECKPOINT_DIR" not in env_of(plain["containers"][0])
    with pytest.raises(ValueError, match="--checkpoint-pvc: invalid object name 'Ckpt!'"):
        build(checkpoint_pvc="Ckpt!")


def test_image_pull_secrets_reach_every_pod() -> None:
    """Issue 38, papercut 6: docs/cluster.md's errors table names a missing imagePullSecrets
    as the cause of ImagePullBackOff; `submit` had no way to give one."""
    objs = build(image_pull_secrets=("regcred", "mirror.creds"))
    for kind in ("Deployment", "Job"):
        assert pod(objs[kind])["imagePullSecrets"] == [{"name": "regcred"},
                                                       {"name": "mirror.creds"}]
    assert "imagePullSecrets" not in pod(build()["Job"])
    with pytest.raises(ValueError, match="--image-pull-secret: invalid object name 'a b'"):
        build(image_pull_secrets=("a b",))


def _decoders(**changes: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base: dict[str, Any] = dict(
        name="resnet", image="reg/trainfeed-torch:0.1.0", workers=3, dataset="public/flowers",
        command=("python", "train.py"), namespace="ml", storage_pvc="datasets")
    objs = job_objects(JobSpec(**{**base, **changes}), TOKEN)
    return objs, next(o for o in objs if o["metadata"]["name"] == "resnet-decoders"
                      and o["kind"] == "Deployment")


def test_decoder_pods_are_locked_down_and_read_the_storage_with_the_masters_token() -> None:
    """Issue 37: decoders check trainers' job tokens as the master does (so they hold the
    master's token), read the datasets read-only, and get no Kubernetes API token."""
    objs, deployment = _decoders(decoders=(3, 3), decoder_cpu="6")
    spec = pod(deployment)
    assert deployment["spec"]["replicas"] == 3
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Registered with the job's master under the pod's own address (issue 37: discovery).
    assert container["args"] == ["decoder", "--listen", "0.0.0.0:50052", "--storage", "/data",
                                 "--master", "resnet-master:50051"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} \
        in container["env"]
    assert env_of(container)["TRAINFEED_TOKEN"] == {"secretKeyRef": {
        "name": "resnet-trainfeed-auth", "key": "token"}}
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    assert container["resources"]["requests"]["cpu"] == "6"
    assert "cpu" not in container["resources"]["limits"]
    # A fixed pool: nothing may call the API, the master's pod included.
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {o["kind"] for o in objs}
    master = next(o for o in objs if o["metadata"]["name"] == "resnet-master"
                  and o["kind"] == "Deployment")
    assert pod(master)["automountServiceAccountToken"] is False


def test_a_decoder_pod_outlives_its_drain_grace() -> None:
    """Issue 37: on SIGTERM a decoder drains its calls for up to DRAIN_S; the pod's grace
    period leaves it that and time to exit, before Kubernetes' SIGKILL cuts the calls."""
    from trainfeed.decoder.drain import DRAIN_S

    _, deployment = _decoders(decoders=(1, 4))
    assert pod(deployment)["terminationGracePeriodSeconds"] >= DRAIN_S + 5


def test_an_autoscaled_pool_lets_the_master_patch_that_deployment_only() -> None:
    objs, deployment = _decoders(decoders=(2, 9))
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["annotations"]["trainfeed.io/decoders"] == "2:9"
    role = next(o for o in objs if o["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"],
                              "resourceNames": ["resnet-decoders"], "verbs": ["get", "patch"]}]
    master = next(o for o in objs if o["metadata"]["name"] == "resnet-master"
                  and o["kind"] == "Deployment")
    assert pod(master)["serviceAccountName"] == "resnet-master"
    # The workers still get no API token.
    workers = next(o for o in objs if o["kind"] == "Job")
    assert pod(workers)["automountServiceAccountToken"] is False
    with pytest.raises(ValueError, match="--decoders 3:2"):
        _decoders(decoders=(3, 2))


@pytest.mark.parametrize("decoders, scaled", [((2, 2), False), ((1, 8), True)])
def test_a_job_with_decoders_sends_its_workers_to_them_and_scales_them_when_asked(
        decoders: tuple[int, int], scaled: bool) -> None:
    """Issue 37: the workers decode remotely (the master lists the decoders to them); the
    master scales the pool only for MIN < MAX."""
    objs, _ = _decoders(decoders=decoders)
    master = next(o for o in objs if o["kind"] == "Deployment"
                  and o["metadata"]["name"] == "resnet-master")
    args = master["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (["--scale-decoders", "resnet"] == args[-2:]) is scaled
    job = next(o for o in objs if o["kind"] == "Job")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TRAINFEED_DECODE", "value": "remote"} in env
    assert not any(e["name"] == "TRAINFEED_DECODERS" for e in env)


def test_a_job_without_decoders_decodes_on_its_workers() -> None:
    base = JobSpec(name="resnet", image="reg/trainfeed-torch:0.1.0", workers=3,
                   dataset="public/flowers", command=("python", "train.py"), namespace="ml",
                   storage_pvc="datasets")
    objs = job_objects(base, TOKEN)
    job = next(o for o in objs if o["kind"] == "Job")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not any(e["name"].startswith("TRAINFEED_DECODE") for e in env)
    master = next(o for o in objs if o["kind"] == "Deployment")
    assert "--scale-decoders" not in master["spec"]["template"]["spec"]["containers"][0]["args"]
