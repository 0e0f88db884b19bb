"""The Kubernetes objects of one job, as plain dicts (what `kubectl apply` takes).

Pure functions of a JobSpec and a token: no cluster, no client library. `submit --dry-run` prints
them and `submit` creates them, so what a user reads is what runs. deploy/k8s/ holds the same
objects for an example job (a test keeps them equal).

Security choices, the same for every pod: a non-root uid (the image's `trainfeed` user), no
privilege escalation, no capabilities, the runtime's seccomp profile, and no Kubernetes API token
mounted (neither the workers nor the decoders call the Kubernetes API; the master does only when
it scales the decoders, `--decoders MIN:MAX`, through its own ServiceAccount, whose Role lets it
read and patch that one Deployment and nothing else).
"""
from __future__ import annotations

from typing import Any

from trainfeed import settings
from trainfeed.cluster.spec import (
    CHECKPOINT_MOUNT,
    COMPONENT_LABEL,
    DATA_MOUNT,
    DATASET_ANNOTATION,
    DECODER_PORT,
    GRPC_PORT,
    JOB_LABEL,
    JOB_TOKEN_KEY,
    MANAGED_BY_LABEL,
    METRICS_PORT,
    PART_OF_LABEL,
    RUN_AS_USER,
    STATE_DIR,
    STATE_FILE,
    TOKEN_KEY,
    JobSpec,
)
from trainfeed.security import job_token

Obj = dict[str, Any]

# How long one worker index may fail before the Job marks it failed (Indexed Jobs, k8s >= 1.29);
# a crash loop of one index does not stop the others, and is visible in `trainfeed status`.
BACKOFF_LIMIT_PER_INDEX = 3
# The master's requests: an asyncio gRPC server handing out partitions uses little; the limit is
# a guard against a leak, not a sizing (metadata of very large datasets lives in memory).
MASTER_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"cpu": "2", "memory": "1Gi"}}
# A decoder holds a few requests in flight (encoded records and their decoded arrays: a 256-image
# batch of 224 x 224 x 3 is 38 MB) per core; the limit guards against a leak.
DECODER_MEMORY = {"requests": "2Gi", "limits": "4Gi"}
# A decoder pod's terminationGracePeriodSeconds: on SIGTERM (a scale-down, a rollout) the decoder
# lets its calls in flight finish for its --drain-s grace (20 s by default:
# trainfeed.decoder.drain.DRAIN_S, not imported: the decoder imports the master, which imports
# this package), then exits; 10 s more for that exit before Kubernetes' SIGKILL.
DECODER_TERMINATION_GRACE_S = 30
# The annotation of the decoders' Deployment that bounds its size: "MIN:MAX" (the master's
# autoscaler reads it there, so `kubectl annotate` changes the bounds of a running job).
DECODERS_ANNOTATION = "trainfeed.io/decoders"
# PyTorch DataLoader workers pass batches through /dev/shm, which container runtimes cap at 64Mi
# by default ("bus error" in the trainer); a memory-backed emptyDir lifts the cap.
SHM_SIZE = "2Gi"


def labels(spec: JobSpec, component: str) -> dict[str, str]:
    """The labels of every object of the job; `selector_labels` is the part selectors use."""
    return {PART_OF_LABEL: "trainfeed", MANAGED_BY_LABEL: "trainfeed",
            **selector_labels(spec.name, component)}


def selector_labels(job: str, component: str) -> dict[str, str]:
    return {JOB_LABEL: job, COMPONENT_LABEL: component}


def job_selector(job: str) -> str:
    """The label selector that finds every object of a job (`status`, `delete`)."""
    return f"{JOB_LABEL}={job}"


def _meta(spec: JobSpec, name: str, component: str) -> Obj:
    meta: Obj = {"name": name, "labels": labels(spec, component),
                 "annotations": {DATASET_ANNOTATION: spec.dataset}}
    if spec.namespace is not None:
        meta["namespace"] = spec.namespace
    return meta


def _pod_security() -> Obj:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            # The state PVC is writable by the pod's group whatever uid its provisioner uses.
            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security(read_only_root: bool) -> Obj:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only_root,
            "capabilities": {"drop": ["ALL"]}}


def _storage_env(spec: JobSpec, token_key: str = TOKEN_KEY) -> list[Obj]:
    """What both the master and the workers need to reach the datasets, and a token: the master's
    (TOKEN_KEY), or for the workers the job token (JOB_TOKEN_KEY), which opens this job only."""
    env: list[Obj] = [
        {"name": settings.STORAGE.name, "value": spec.storage_url},
        {"name": settings.TOKEN.name, "valueFrom": {"secretKeyRef": {
            "name": spec.names.auth, "key": token_key}}},
    ]
    if spec.s3_endpoint:
        env.append({"name": settings.S3_ENDPOINT.name, "value": spec.s3_endpoint})
    return env


def _env_from(spec: JobSpec) -> list[Obj]:
    # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and any AWS_* the Secret holds) as they are.
    return [{"secretRef": {"name": spec.s3_secret}}]


def _data_volume(spec: JobSpec) -> tuple[list[Obj], list[Obj]]:
    """The shared dataset volume, read-only: trainfeed only reads datasets in a job."""
    if spec.storage_pvc is None:
        return [], []
    return ([{"name": "data", "persistentVolumeClaim": {"claimName": spec.storage_pvc,
                                                        "readOnly": True}}],
            [{"name": "data", "mountPath": DATA_MOUNT, "readOnly": True}])


def _checkpoint_volume(spec: JobSpec) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """The checkpoint volume, read-write, and the variable naming this job's folder on it
    (volumes, mounts, env); nothing without --checkpoint-pvc. The workers only: the master
    keeps its ledger on its own state claim."""
    if spec.checkpoint_pvc is None:
        return [], [], []
    return ([{"name": "checkpoints", "persistentVolumeClaim": {
                "claimName": spec.checkpoint_pvc}}],
            [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}],
            [{"name": settings.CHECKPOINT_DIR.name, "value": spec.checkpoint_dir}])


def pull_secrets(names: tuple[str, ...]) -> Obj:
    """A pod spec's `imagePullSecrets` for private registries (--image-pull-secret); nothing
    when none is given, so that the objects stay as before."""
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}


def token_secret(spec: JobSpec, token: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(spec, spec.names.auth, "auth"),
            "type": "Opaque",
            # (No token, as in deploy/k8s/ where the user fills it in: no job token either.)
            "stringData": {TOKEN_KEY: token,
                           JOB_TOKEN_KEY: job_token(token, spec.name) if token else ""}}


def state_claim(spec: JobSpec) -> Obj:
    # ReadWriteOnce: one master at a time writes the SQLite file (the Deployment is Recreate).
    # No storageClassName: the cluster's default class.
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(spec, spec.names.state, "master"),
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": spec.state_size}}}}


def master_service(spec: JobSpec) -> Obj:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(spec, spec.names.master, "master"),
            "spec": {"type": "ClusterIP", "selector": selector_labels(spec.name, "master"),
                     "ports": [
                         {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc",
                          "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
                         {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                          "protocol": "TCP", "appProtocol": "http"}]}}


def _grpc_probe(**timing: int) -> Obj:
    # Kubernetes' own gRPC probe calls grpc.health.v1.Health/Check, which the master serves
    # without a token. With TLS on, replace it by exec `trainfeed health --master
    # localhost:50051` (docs/cluster.md).
    return {"grpc": {"port": GRPC_PORT}, **timing}


def _master_account(spec: JobSpec) -> Obj:
    """Where the master's pod gets a Kubernetes API token: only when it scales the decoders."""
    if not spec.decoders_autoscaled:
        return {"automountServiceAccountToken": False}
    return {"serviceAccountName": spec.names.master, "automountServiceAccountToken": True}


def master_deployment(spec: JobSpec) -> Obj:
    data_volumes, data_mounts = _data_volume(spec)
    container: Obj = {
        "name": "master",
        "image": spec.master_image or spec.image,
        "args": ["master", "--host", "0.0.0.0", "--port", str(GRPC_PORT), "--state", STATE_FILE,
                 "--metrics-port", str(METRICS_PORT),
                 *(["--scale-decoders", spec.name] if spec.decoders_autoscaled else [])],
        "env": _storage_env(spec),
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # Restoring a large ledger from SQLite takes a while: up to 2 minutes before liveness
        # checks start.
        "startupProbe": _grpc_probe(periodSeconds=5, failureThreshold=24),
        "readinessProbe": _grpc_probe(periodSeconds=10, failureThreshold=3),
        "livenessProbe": _grpc_probe(periodSeconds=20, timeoutSeconds=5, failureThreshold=3),
        "resources": MASTER_RESOURCES,
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [{"name": "state", "mountPath": STATE_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}, *data_mounts],
    }
    if spec.s3_secret:
        container["envFrom"] = _env_from(spec)
    pod_labels = labels(spec, "master")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(spec, spec.names.master, "master"),
        "spec": {
            "replicas": 1,
            # Never two masters on one SQLite file: the old pod stops before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector_labels(spec.name, "master")},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    **_master_account(spec),
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    **pull_secrets(spec.image_pull_secrets),
                    "containers": [container],
                    "volumes": [{"name": "state",
                                 "persistentVolumeClaim": {"claimName": spec.names.state}},
                                {"name": "tmp", "emptyDir": {}}, *data_volumes],
                },
            },
        },
    }


def _worker_resources(spec: JobSpec) -> Obj:
    """CPU and memory requests always (workers decode: BestEffort pods would be the first
    evicted and the last scheduled), derived from the decode threads unless given; a memory
    limit only when --worker-memory is given (a derived figure is an estimate, and an OOM kill
    of a rank is worse than a node's memory pressure); no CPU limit (throttling stalls
    decoding, and the request already reserves the cores)."""
    requests: dict[str, str] = {"cpu": spec.worker_cpu, "memory": spec.worker_memory}
    limits: dict[str, str] = {}
    if spec.memory_per_worker:
        limits["memory"] = spec.memory_per_worker
    if spec.gpus_per_worker:
        # Extended resources: requests must equal limits (the device plugin hands out whole GPUs).
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.gpus_per_worker)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


# The annotation an Indexed Job puts on each pod: its completion index, 0..workers-1.
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
SYNC_LABEL = "trainfeed.io/sync"


def _sync_env(spec: JobSpec) -> list[Obj]:
    """What torch.distributed (env://, torchrun) and `dist.reader(..., sync=True)` need in a
    synchronous job's pods: the group's size, this pod's rank (its completion index, through a
    fieldRef: valid in every container, unlike a variable reference into a variable the
    controller adds), and the rendezvous: pod 0 through the headless Service. NNODES/NODE_RANK
    are for a pod running several ranks itself (`torchrun --nnodes $NNODES --node-rank
    $NODE_RANK --nproc-per-node G`), where torchrun sets each process's own RANK/WORLD_SIZE."""
    index = {"valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
    workers = spec.names.workers
    return [
        {"name": settings.WORLD_SIZE.name, "value": str(spec.workers)},
        {"name": settings.RANK.name, **index},
        {"name": "NNODES", "value": str(spec.workers)},
        {"name": "NODE_RANK", **index},
        {"name": "MASTER_ADDR", "value": f"{workers}-0.{workers}"},
        {"name": "MASTER_PORT", "value": str(spec.rendezvous_port)},
    ]


def workers_service(spec: JobSpec) -> Obj:
    """A synchronous job's headless Service: gives each worker pod the DNS name
    `<workers>-<index>.<workers>` (the pods' subdomain), so that rank 0 is the rendezvous.
    Published before the pods are ready: the ranks rendezvous before any readiness."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(spec, spec.names.workers, "workers"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector_labels(spec.name, "workers"),
                     "ports": [{"name": "rendezvous", "port": spec.rendezvous_port,
                                "targetPort": spec.rendezvous_port, "protocol": "TCP"}]}}


def workers_job(spec: JobSpec) -> Obj:
    data_volumes, data_mounts = _data_volume(spec)
    checkpoint_volumes, checkpoint_mounts, checkpoint_env = _checkpoint_volume(spec)
    env = [
        {"name": settings.MASTER.name, "value": spec.names.master_address},
        {"name": settings.JOB.name, "value": spec.name},
        {"name": settings.DATASET.name, "value": spec.dataset},
        *_storage_env(spec, JOB_TOKEN_KEY),
        # The master's "gpu" distribution rule admits workers that declare GPUs; the NVIDIA
        # device plugin sets NVIDIA_VISIBLE_DEVICES, not CUDA_VISIBLE_DEVICES, so say it here.
        {"name": settings.GPUS.name, "value": str(spec.gpus_per_worker)},
        {"name": settings.WORKER_NAME.name, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.name"}}},
        *(_sync_env(spec) if spec.sync else []),
        *checkpoint_env,
        # With decoders: readers that decode images send them to the decoders the master lists.
        *([{"name": settings.DECODE.name, "value": "remote"}] if spec.decoders else []),
    ]
    container: Obj = {
        "name": "worker",
        "image": spec.image,
        "command": list(spec.command),
        "env": env,
        "resources": _worker_resources(spec),
        # Trainers write caches (~/.cache, compiled kernels): the root filesystem stays writable.
        "securityContext": _container_security(read_only_root=False),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *data_mounts,
                         *checkpoint_mounts],
    }
    if spec.s3_secret:
        container["envFrom"] = _env_from(spec)
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        **pull_secrets(spec.image_pull_secrets),
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
                    *data_volumes, *checkpoint_volumes],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.to_dict() for t in spec.tolerations]
    metadata = _meta(spec, spec.names.workers, "workers")
    if spec.sync:
        pod_spec["subdomain"] = spec.names.workers
        container["ports"] = [{"name": "rendezvous", "containerPort": spec.rendezvous_port,
                               "protocol": "TCP"}]
        metadata["labels"][SYNC_LABEL] = "true"
    job_spec: Obj = {
        # Indexed, with completions == parallelism: `trainfeed scale` changes both (elastic
        # Indexed Jobs, Kubernetes >= 1.27); each index runs the training script once.
        "completionMode": "Indexed",
        "completions": spec.workers,
        "parallelism": spec.workers,
        **(_sync_failure_policy() if spec.sync
           else {"backoffLimitPerIndex": BACKOFF_LIMIT_PER_INDEX}),
        "template": {"metadata": {"labels": labels(spec, "workers")}, "spec": pod_spec},
    }
    if spec.ttl_after_finished_s is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_after_finished_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def _sync_failure_policy() -> Obj:
    """A synchronous group fails as one: the first rank that fails (a non-zero exit, or its pod
    disrupted: preempted, evicted, its node drained) fails the whole Job, and the Job
    controller then stops the other ranks at once instead of leaving them blocked in a
    collective while the failed rank alone is retried (what `backoffLimitPerIndex` would do:
    retries are per index). No pod is retried (`backoffLimit: 0`): a torch.distributed group
    cannot take a restarted rank back. The group is restarted by submitting it again, resuming
    from the ranks' checkpoint (docs/cluster.md, "Synchronous jobs")."""
    return {
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob",
             "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]}},
            {"action": "FailJob",
             "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
    }


def decoders_service(spec: JobSpec) -> Obj:
    """The decode workers behind one address (`<job>-decoders:DECODER_PORT`): any decoder
    serves any trainer, so a ClusterIP spreads connections (issue 37)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(spec, spec.names.decoders, "decoders"),
            "spec": {"type": "ClusterIP", "selector": selector_labels(spec.name, "decoders"),
                     "ports": [{"name": "decode", "port": DECODER_PORT, "targetPort": "decode",
                                "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}]}}


def decoders_deployment(spec: JobSpec) -> Obj:
    """The stateless decode workers (issue 37): `trainfeed decoder`, reading the job's storage
    with the master's token (they check trainers' job tokens as the master does). Their
    replicas start at MIN; with MIN < MAX the master patches them (DECODERS_ANNOTATION)."""
    assert spec.decoders is not None
    data_volumes, data_mounts = _data_volume(spec)
    container: Obj = {
        "name": "decoder",
        "image": spec.image,
        # Registered with the master, which lists each pod's own address (POD_IP) to the
        # trainers: they spread their requests by load instead of through the Service.
        "args": ["decoder", "--listen", f"0.0.0.0:{DECODER_PORT}", "--storage",
                 spec.storage_url, "--master", spec.names.master_address],
        "env": [*_storage_env(spec),
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "decode", "containerPort": DECODER_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": DECODER_PORT}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": DECODER_PORT}, "periodSeconds": 20,
                          "failureThreshold": 3},
        # No CPU limit: throttling stalls decoding; the request reserves the cores.
        "resources": {"requests": {"cpu": spec.decoder_cpu,
                                   "memory": DECODER_MEMORY["requests"]},
                      "limits": {"memory": DECODER_MEMORY["limits"]}},
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *data_mounts],
    }
    if spec.s3_secret:
        container["envFrom"] = _env_from(spec)
    metadata = _meta(spec, spec.names.decoders, "decoders")
    low, high = spec.decoders
    metadata["annotations"][DECODERS_ANNOTATION] = f"{low}:{high}"
    pod_spec: Obj = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        **pull_secrets(spec.image_pull_secrets),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *data_volumes],
        "terminationGracePeriodSeconds": DECODER_TERMINATION_GRACE_S,
    }
    if spec.tolerations:  # decoders may share the workers' (GPU) nodes' spare cores
        pod_spec["tolerations"] = [t.to_dict() for t in spec.tolerations]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
        "spec": {
            "replicas": low,
            "selector": {"matchLabels": selector_labels(spec.name, "decoders")},
            "template": {"metadata": {"labels": labels(spec, "decoders")}, "spec": pod_spec},
        },
    }


def scaler_objects(spec: JobSpec) -> list[Obj]:
    """What lets the master scale the decoders and do nothing else with the API: its
    ServiceAccount, a Role to read and patch the decoders' Deployment (that one, by name), and
    the binding of the two."""
    name = spec.names.decoders
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": _meta(spec, spec.names.master, "master"),
               "automountServiceAccountToken": False}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(spec, name, "master"),
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments"],
                       "resourceNames": [name], "verbs": ["get", "patch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(spec, name, "master"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": spec.names.master,
                             **({"namespace": spec.namespace} if spec.namespace else {})}]}
    return [account, role, binding]


def job_objects(spec: JobSpec, token: str) -> list[Obj]:
    """Every object of the job, in the order they are created: what a pod refers to first."""
    sync = [workers_service(spec)] if spec.sync else []
    scaler = scaler_objects(spec) if spec.decoders_autoscaled else []
    decoders = ([decoders_service(spec), decoders_deployment(spec)]
                if spec.decoders is not None else [])
    return [token_secret(spec, token), state_claim(spec), *scaler, master_service(spec),
            master_deployment(spec), *decoders, *sync, workers_job(spec)]

