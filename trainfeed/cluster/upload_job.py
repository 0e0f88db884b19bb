"""The Kubernetes object of an upload run as a cluster job (`trainfeed submit-upload`): one
Indexed Job of packers, as a plain dict, in the style of trainfeed.cluster.objects.

Index i (`JOB_COMPLETION_INDEX`, set by Kubernetes) runs `trainfeed upload-slice` and packs the
i-th slice of the list's shards into the dataset's staging area; each packer then tries the
commit, and the last one to finish publishes the manifest (trainfeed.ingest.slices). A failed
index is retried alone (`backoffLimitPerIndex`), resuming after its finished shards.

Where the files are: the list and the files it names are read at the same path in every pod,
from a shared volume (`source_pvc`, mounted read-only at SOURCE_MOUNT; or the dataset volume,
`storage_pvc` at DATA_MOUNT). Packers open them as files (trainfeed.ingest.inputs), and the
files a list names are relative to its folder, so a list on a mounted volume names files on it
(`..`, absolute paths and symlinks out of its folder are refused by the packers unless
--allow-outside). Any other path, or a URL, is refused here, before a Job is printed or made:
it would be a Job whose every packer fails (issue 38). Where the dataset goes:
`storage` (s3://…, credentials from the Secret `s3_secret`) or the shared dataset volume
`storage_pvc`, mounted read-write at DATA_MOUNT (training jobs mount it read-only).
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from trainfeed import settings
from trainfeed.cluster.objects import (
    Obj,
    _container_security,
    _pod_security,
    pull_secrets,
    selector_labels,
)
from trainfeed.cluster.spec import (
    DATA_MOUNT,
    DATASET_ANNOTATION,
    MANAGED_BY_LABEL,
    PART_OF_LABEL,
    check_object_name,
)
from trainfeed.errors import InvalidNameError
from trainfeed.names import validate_dataset_name

# Where the list and its files are mounted in the packers (--source-pvc).
SOURCE_MOUNT = "/source"
# Packer pods (indexes) when --workers is not given: 8 packers of one CPU and 768Mi each ask
# 8 cores and 6 GiB in all, which most namespaces' quotas allow, and pack 8x one process (a
# slice per index; extra indexes of a small list get no shards and finish at once).
DEFAULT_PACKERS = 8
# How often one index may fail before the Job marks it failed; the others go on.
BACKOFF_LIMIT_PER_INDEX = 3
# A packer's requests: one packing process per CPU; a shard being encoded takes ~170 MiB per
# process (README, "Memory"), rewrites up to 256 MiB more.
PACKER_RESOURCES = {"requests": {"cpu": "1", "memory": "768Mi"},
                    "limits": {"memory": "2Gi"}}
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class UploadJobSpec:
    """Everything `submit-upload` needs to lay out its Job. Validates itself."""

    name: str
    image: str
    list_path: str  # as the packers see it (under SOURCE_MOUNT when source_pvc is set)
    dataset: str
    workers: int
    created_at: str  # the manifest's time, the same for every index (byte-identical re-runs)
    upload_args: tuple[str, ...] = ()  # upload options, as `trainfeed upload` takes them
    namespace: str | None = None
    storage: str | None = None
    storage_pvc: str | None = None
    source_pvc: str | None = None
    s3_secret: str | None = None
    s3_endpoint: str | None = None
    ttl_after_finished_s: int | None = 24 * 3600
    image_pull_secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _DNS_NAME.fullmatch(self.name) or len(self.name) > 52:
            raise InvalidNameError(f"invalid upload job name {self.name!r}: lower-case letters, "
                                   f"digits and '-', at most 52 (the Job adds '-packers')")
        validate_dataset_name(self.dataset)
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if (self.storage is None) == (self.storage_pvc is None):
            raise ValueError("give exactly one of --storage URL (s3://…) and --storage-pvc NAME")
        if self.storage is not None and "://" not in self.storage:
            raise ValueError(f"--storage {self.storage!r} is a local path: each pod would write "
                             f"to its own disk; use s3://… or --storage-pvc")
        for secret in self.image_pull_secrets:
            check_object_name("--image-pull-secret", secret)
        self._check_list_path()

    def _check_list_path(self) -> None:
        """The list must be where every packer sees it: under a volume this Job mounts."""
        visible = self.visible_roots()
        path = self.list_path
        if "://" in path:
            raise ValueError(
                f"the list {path!r} is a URL: packers read the list and the files it names "
                f"from a file system, not through a URL; {_PUT_IT_ON_A_VOLUME}")
        if not path.startswith("/"):
            raise ValueError(
                f"the list {path!r} is a path on this machine, which no packer pod can see "
                f"(each pod has its own disk); {_PUT_IT_ON_A_VOLUME}")
        if not any(_under(path, root) for root in visible):
            mounted = (" or ".join(f"{r}/… ({what})" for r, what in visible.items())
                       or "nothing: no volume is mounted")
            raise ValueError(
                f"the list {path!r} is not on a volume the packers mount (they see {mounted}); "
                f"{_PUT_IT_ON_A_VOLUME}")

    def visible_roots(self) -> dict[str, str]:
        """The folders every packer sees, each with the flag that mounts it."""
        roots = {}
        if self.source_pvc is not None:
            roots[SOURCE_MOUNT] = f"--source-pvc {self.source_pvc}"
        if self.storage_pvc is not None:
            roots[DATA_MOUNT] = f"--storage-pvc {self.storage_pvc}"
        return roots

    @property
    def job_name(self) -> str:
        return f"{self.name}-packers"

    @property
    def storage_url(self) -> str:
        return self.storage if self.storage is not None else DATA_MOUNT


_PUT_IT_ON_A_VOLUME = (
    f"put the list and the files it names on a shared volume (an RWX claim) and give "
    f"--source-pvc NAME with the list's path inside that volume (mounted read-only at "
    f"{SOURCE_MOUNT}: `--source-pvc photos train.list` reads {SOURCE_MOUNT}/train.list), or run "
    f"`trainfeed upload` on the machine that has the files")


def _under(path: str, root: str) -> bool:
    return posixpath.normpath(path).startswith(root + "/")


def list_path_in_pods(list_path: str, source_pvc: str | None) -> str:
    """The list's path as the packers see it: a relative path given with --source-pvc is inside
    that volume (`train.list` → /source/train.list); anything else is kept for
    UploadJobSpec to check."""
    if source_pvc is None or "://" in list_path or list_path.startswith("/"):
        return list_path
    return posixpath.normpath(posixpath.join(SOURCE_MOUNT, list_path))


def labels_for(name: str, component: str) -> dict[str, str]:
    """The labels of a trainfeed job's objects (trainfeed.cluster.objects.labels), by name."""
    return {PART_OF_LABEL: "trainfeed", MANAGED_BY_LABEL: "trainfeed",
            **selector_labels(name, component)}


def packers_job(spec: UploadJobSpec) -> Obj:
    """The Indexed Job of `spec`'s packers."""
    env: list[Obj] = [{"name": settings.STORAGE.name, "value": spec.storage_url}]
    if spec.s3_endpoint:
        env.append({"name": settings.S3_ENDPOINT.name, "value": spec.s3_endpoint})
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
    if spec.storage_pvc is not None:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": spec.storage_pvc}})
        mounts.append({"name": "data", "mountPath": DATA_MOUNT})
    if spec.source_pvc is not None:
        volumes.append({"name": "source", "persistentVolumeClaim": {
            "claimName": spec.source_pvc, "readOnly": True}})
        mounts.append({"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    container: Obj = {
        "name": "packer", "image": spec.image,
        "args": ["upload-slice", spec.list_path, "--dataset", spec.dataset, "--workers",
                 str(spec.workers), "--created-at", spec.created_at,
                 # One packing process per pod, as its CPU request says: os.cpu_count() in a
                 # pod is the node's, and 64 processes would pass the memory limit.
                 "--processes", "1", *spec.upload_args],
        "env": env, "resources": PACKER_RESOURCES,
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": mounts,
    }
    if spec.s3_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.s3_secret}}]
    metadata: Obj = {"name": spec.job_name, "labels": labels_for(spec.name, "packers"),
                     "annotations": {DATASET_ANNOTATION: spec.dataset}}
    if spec.namespace is not None:
        metadata["namespace"] = spec.namespace
    job_spec: Obj = {
        "completionMode": "Indexed", "completions": spec.workers,
        "parallelism": spec.workers, "backoffLimitPerIndex": BACKOFF_LIMIT_PER_INDEX,
        "template": {"metadata": {"labels": labels_for(spec.name, "packers")}, "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "enableServiceLinks": False, "securityContext": _pod_security(),
            **pull_secrets(spec.image_pull_secrets),
            "containers": [container], "volumes": volumes}},
    }
    if spec.ttl_after_finished_s is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_after_finished_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}
