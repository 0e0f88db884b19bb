"""What a trainfeed job on Kubernetes is: its settings (JobSpec) and the names of its objects.

A job is a master (Deployment + Service + a PVC for its SQLite state), its workers (an Indexed
Job) and a Secret with the job's token. Every object's name derives from the job's name here and
nowhere else, so that `submit`, `scale`, `status` and `delete` agree on them.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainfeed.errors import InvalidNameError
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.redaction import redact_url

# The ports the image's master listens on (the contract with `trainfeed master`).
GRPC_PORT = 50051
METRICS_PORT = 9090
# The port of the decode workers (`trainfeed decoder --listen 0.0.0.0:DECODER_PORT`), issue 37.
DECODER_PORT = 50052
# Where the pods see things.
DATA_MOUNT = "/data"  # the shared dataset volume (--storage-pvc)
STATE_DIR = "/var/lib/trainfeed"  # the master's state PVC
STATE_FILE = f"{STATE_DIR}/master.db"
# Where the workers mount --checkpoint-pvc read-write; each job writes under its own folder,
# CHECKPOINT_MOUNT/<job> (told to the script by CHECKPOINT_DIR_ENV), so that a job submitted
# again under the same name finds its checkpoints and resumes from them.
CHECKPOINT_MOUNT = "/checkpoints"
# The uid/gid of the Dockerfile's `trainfeed` user; pods run as it even if an image has no USER.
RUN_AS_USER = 10001

# The keys of the master's token and of the job token (what the workers get) in the job's Secret.
TOKEN_KEY = "token"
JOB_TOKEN_KEY = "job-token"

# Label keys that tie a job's objects together (`delete` and `status` select on JOB_LABEL).
PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
JOB_LABEL = "trainfeed.io/job"
# Dataset names may hold '/', which label values may not: the dataset is an annotation.
DATASET_ANNOTATION = "trainfeed.io/dataset"

_SUFFIXES = {"master": "-master", "state": "-master-state", "workers": "-workers",
             "auth": "-trainfeed-auth", "decoders": "-decoders"}
# Kubernetes names of Services, Jobs and label values are DNS-1123 labels of at most 63
# characters; the longest suffix above must still fit.
MAX_JOB_NAME = 63 - max(len(s) for s in _SUFFIXES.values())
# What a worker pod asks for when --worker-cpu / --worker-memory are not given, per training
# process (one per GPU, as torchrun starts them; one in a CPU pod): its decode threads plus one
# core for the training loop itself (Python, the collectives, the gRPC client). Decoding is the
# readers' CPU work: docs/imagenet.md measures 0.69-0.83 ms of one core per ImageNet-sized
# image, so ~1,300 images/s per core, and a ResNet-50 step on one current GPU takes 2,000-3,000
# images/s: 2 cores keep up. Two threads, not four: 4 + 1 = 5 cores fit no 4-core node, and
# 2 + 1 = 3 fits one (its allocatable is ~3.5-3.9 cores after the kubelet's and the system's
# reservations and the DaemonSets' requests, on GKE, EKS and AKS alike; issue 38). There is no
# CPU limit: a pod uses a node's idle cores beyond its request; heavier augmentation asks
# for more with --decode-threads or --worker-cpu.
DEFAULT_DECODE_THREADS = 2
# Memory per training process: a PyTorch trainer with its CUDA host runtime holds ~2 GiB of
# resident memory before any data; each decode thread then holds a batch in flight (encoded
# records plus 256 x 224 x 224 x 3 decoded bytes, 38 MB) and the prefetch queue's share.
TRAINER_MEMORY_MI = 2048
DECODE_THREAD_MEMORY_MI = 256
# A finished workers Job (and, through owner references, the master's objects) is deleted a
# day after it finishes: time to read `trainfeed status` and the pods' logs, no longer.
DEFAULT_TTL_AFTER_FINISHED_S = 24 * 3600

_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def validate_cluster_job_name(name: str) -> str:
    """A job name that is also a DNS-1123 label short enough for every derived object name.

    Kubernetes is stricter than trainfeed (`validate_job_name`): lower case, no '.' or '_',
    starting with a letter (Service names are DNS-1035 labels).
    """
    validate_job_name(name)
    if not _DNS_LABEL.fullmatch(name) or len(name) > MAX_JOB_NAME:
        raise InvalidNameError(
            f"invalid job name {name!r} for Kubernetes: use at most {MAX_JOB_NAME} lower-case "
            f"letters, digits and '-', starting with a letter and ending with a letter or digit "
            f"(it names the job's Service, Job and Secret)")
    return name


def check_object_name(what: str, name: str | None) -> None:
    """Refuses a name Kubernetes would refuse for a claim or a Secret (a DNS-1123 subdomain),
    naming the flag, before any object is built."""
    if name is not None and (not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253):
        raise InvalidNameError(f"{what}: invalid object name {name!r}: lower-case letters, "
                               f"digits, '-' and '.', starting and ending with a letter or "
                               f"digit, at most 253")


@dataclass(frozen=True)
class ObjectNames:
    """The names of one job's objects, all derived from the job's name."""

    job: str

    @property
    def master(self) -> str:
        """The master's Deployment and Service (TRAINFEED_MASTER=<this>:50051)."""
        return self.job + _SUFFIXES["master"]

    @property
    def state(self) -> str:
        return self.job + _SUFFIXES["state"]

    @property
    def workers(self) -> str:
        return self.job + _SUFFIXES["workers"]

    @property
    def auth(self) -> str:
        return self.job + _SUFFIXES["auth"]

    @property
    def decoders(self) -> str:
        """The decode workers' Deployment and Service (issue 37)."""
        return self.job + _SUFFIXES["decoders"]

    @property
    def decoders_address(self) -> str:
        return f"{self.decoders}:{DECODER_PORT}"

    @property
    def master_address(self) -> str:
        # The short Service name resolves from every pod of the same namespace.
        return f"{self.master}:{GRPC_PORT}"


@dataclass(frozen=True)
class Toleration:
    """`KEY[=VALUE][:EFFECT]`, as `kubectl taint` writes a taint: `nvidia.com/gpu:NoSchedule`."""

    key: str
    value: str | None = None
    effect: str | None = None

    @classmethod
    def parse(cls, text: str) -> Toleration:
        rest, _, effect = text.partition(":")
        key, eq, value = rest.partition("=")
        if not key or (eq and not value) or (effect and effect not in _TAINT_EFFECTS):
            raise ValueError(f"invalid toleration {text!r}: expected KEY[=VALUE][:EFFECT] with "
                             f"EFFECT one of {', '.join(_TAINT_EFFECTS)}, e.g. "
                             f"nvidia.com/gpu:NoSchedule")
        return cls(key, value if eq else None, effect or None)

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": "Equal" if self.value is not None else "Exists"}
        if self.value is not None:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


def parse_node_selector(items: Sequence[str]) -> dict[str, str]:
    """`["k=v", …]` → `{"k": "v"}`; a ValueError naming the bad item otherwise."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not key or not eq:
            raise ValueError(f"invalid node selector {item!r}: expected KEY=VALUE, e.g. "
                             f"nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB")
        out[key] = value
    return out


@dataclass(frozen=True)
class JobSpec:
    """Everything `trainfeed submit` needs to lay out one job. Validates itself.

    Storage is either a shared volume (`storage_pvc`, an RWX PersistentVolumeClaim mounted
    read-only at /data in the master and the workers) or a remote URL (`storage`, e.g.
    s3://bucket/prefix, with credentials from the Secret `s3_secret`). A local path without a
    volume would name each pod's own empty disk, so it is refused.
    """

    name: str
    image: str
    workers: int
    dataset: str
    command: tuple[str, ...]
    # The users train on GPUs: one per worker unless told otherwise (0 for CPU pods).
    gpus_per_worker: int = 1
    # None: no namespace in the objects, so that `kubectl apply -n NS` places them (dry runs);
    # `submit` fills in the kubeconfig context's namespace.
    namespace: str | None = None
    storage: str | None = None
    storage_pvc: str | None = None
    s3_secret: str | None = None
    s3_endpoint: str | None = None
    # The master needs no ML framework: a smaller image (EXTRAS=s3,etcd,sql) may serve it.
    master_image: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # Requests per worker pod; None derives them from decode_threads (worker_cpu,
    # worker_memory). A memory given here is also the limit; a derived one is a request only.
    cpus_per_worker: str | None = None
    memory_per_worker: str | None = None
    decode_threads: int = DEFAULT_DECODE_THREADS
    # Seconds after which Kubernetes deletes the finished workers Job, and the garbage collector
    # the objects it owns (master, Services, state PVC, Secret); None keeps them.
    ttl_after_finished_s: int | None = DEFAULT_TTL_AFTER_FINISHED_S
    # A SQLite ledger of a few jobs takes kilobytes; 1Gi is the smallest size most
    # provisioners hand out.
    state_size: str = "1Gi"
    # Synchronous (all-reduce) training: the workers are ranks of one torch.distributed group,
    # wired through a headless Service (trainfeed.cluster.objects.workers_service).
    sync: bool = False
    # torch.distributed's default rendezvous port (torchrun's --master-port).
    rendezvous_port: int = 29500
    # A claim the workers mount read-write at CHECKPOINT_MOUNT for the script's checkpoints
    # (model and `reader.state_dict()`), the documented way to resume; None mounts nothing.
    checkpoint_pvc: str | None = None
    # Secrets of type kubernetes.io/dockerconfigjson for private registries, given to every pod.
    image_pull_secrets: tuple[str, ...] = ()
    # Remote decode (issue 37): the decode workers' pool size (MIN, MAX): equal for a fixed one,
    # MIN < MAX for one the master scales (trainfeed.master.core.decoder_scaling, which the CLI
    # parses `--decoders` with); None runs no decoders (trainers decode).
    decoders: tuple[int, int] | None = None
    # CPU per decoder pod: its decode threads (`trainfeed decoder` decodes on every core it
    # has); docs/cluster.md, "Remote decode sizing", says how many a GPU needs.
    decoder_cpu: str = "4"

    def __post_init__(self) -> None:
        # In this order: with several wrong options, the first of these names the error.
        validate_cluster_job_name(self.name)
        validate_dataset_name(self.dataset)
        self._check_namespace()
        self._check_images()
        self._check_counts()
        self._check_command()
        self._check_decoders()
        self._check_resources()
        self._check_storage()

    def _check_namespace(self) -> None:
        """A namespace given must be one Kubernetes accepts, before any object names it."""
        if self.namespace is not None and (not _DNS_LABEL.fullmatch(self.namespace)
                                           or len(self.namespace) > 63):
            raise InvalidNameError(f"invalid namespace {self.namespace!r}: a Kubernetes "
                                   f"namespace is a DNS-1123 label (lower-case letters, digits, "
                                   f"'-', at most 63)")

    def _check_images(self) -> None:
        """An image reference is one non-empty word: a space would split the pod's image
        field into nothing the registry knows, and the pods would wait on it forever."""
        for what, image in (("--image", self.image), ("--master-image", self.master_image)):
            if image is not None and (not image or any(c.isspace() for c in image)):
                raise ValueError(f"{what}: invalid image {image!r}")

    def _check_counts(self) -> None:
        """The whole numbers each have a range; a None (only --ttl-after-finished may be one)
        is not checked: it means "none"."""
        counts = (  # (flag, value, lowest, highest or None, the rule as the error says it)
            ("--workers", self.workers, 1, None, "must be at least 1"),
            ("--gpus-per-worker", self.gpus_per_worker, 0, None, "must be 0 or more"),
            ("--decode-threads", self.decode_threads, 1, None, "must be at least 1"),
            ("--ttl-after-finished", self.ttl_after_finished_s, 0, None,
             "must be 0 or more seconds (or 'none')"),
            ("--rendezvous-port", self.rendezvous_port, 1, 65535,
             "must be a TCP port (1-65535)"),
        )
        for flag, value, lowest, highest, rule in counts:
            if value is None:
                continue
            if value < lowest or (highest is not None and value > highest):
                raise ValueError(f"{flag} {rule}, got {value}")

    def _check_command(self) -> None:
        """The workers run the training command; without one they would have nothing to do."""
        if not self.command:
            raise ValueError("no training command: give it after '--', e.g. "
                             "`trainfeed submit … -- python train.py`")

    def _check_decoders(self) -> None:
        """A decoder pool's size (MIN, MAX) has at least one decoder and MIN <= MAX."""
        if self.decoders is not None and not 1 <= self.decoders[0] <= self.decoders[1]:
            raise ValueError(f"--decoders {self.decoders[0]}:{self.decoders[1]}: expected "
                             f"1 <= MIN <= MAX")

    def _check_resources(self) -> None:
        """The quantities and the names of the objects the pods refer to (claims, Secrets)."""
        for what, quantity in (("--worker-cpu", self.cpus_per_worker),
                               ("--decoder-cpu", self.decoder_cpu),
                               ("--worker-memory", self.memory_per_worker),
                               ("state size", self.state_size)):
            if quantity is not None and not _QUANTITY.fullmatch(quantity):
                raise ValueError(f"{what}: {quantity!r} is not a Kubernetes quantity "
                                 f"(e.g. 4, 500m, 16Gi)")
        for what, claim in (("--checkpoint-pvc", self.checkpoint_pvc),
                            *(("--image-pull-secret", n) for n in self.image_pull_secrets)):
            check_object_name(what, claim)

    def _check_storage(self) -> None:
        if self.storage_pvc is not None:
            if not _DNS_LABEL.fullmatch(self.storage_pvc):
                raise InvalidNameError(f"--storage-pvc: invalid claim name {self.storage_pvc!r}")
            if self.storage is not None and not (
                    self.storage == DATA_MOUNT or self.storage.startswith(DATA_MOUNT + "/")):
                raise ValueError(f"--storage {redact_url(self.storage)!r}: with --storage-pvc "
                                 f"the volume is mounted at {DATA_MOUNT}; give a path under "
                                 f"it (or leave --storage out to use {DATA_MOUNT})")
        elif self.storage is None or "://" not in self.storage or \
                self.storage.startswith("file://"):
            given = ("no storage" if self.storage is None
                     else f"--storage {redact_url(self.storage)!r}")
            raise ValueError(
                f"{given}: pods share no local disk; give a remote URL with --storage "
                f"(s3://bucket/prefix, with --s3-secret for its credentials) or a shared "
                f"volume with --storage-pvc NAME (an RWX claim: GlusterFS, NFS, CephFS)")

    @property
    def names(self) -> ObjectNames:
        return ObjectNames(self.name)

    @property
    def ranks_per_pod(self) -> int:
        """Training processes in one worker pod: one per GPU (torchrun), one in a CPU pod."""
        return max(1, self.gpus_per_worker)

    @property
    def worker_cpu(self) -> str:
        """The CPU request of a worker pod: --worker-cpu, else each training process's decode
        threads plus one core for its training loop."""
        return self.cpus_per_worker or str(self.ranks_per_pod * (self.decode_threads + 1))

    @property
    def worker_memory(self) -> str:
        """The memory request of a worker pod: --worker-memory, else per training process
        TRAINER_MEMORY_MI plus DECODE_THREAD_MEMORY_MI per decode thread."""
        per_rank = TRAINER_MEMORY_MI + self.decode_threads * DECODE_THREAD_MEMORY_MI
        return self.memory_per_worker or f"{self.ranks_per_pod * per_rank}Mi"

    @property
    def storage_url(self) -> str:
        """The storage URL as the pods see it."""
        return self.storage or DATA_MOUNT

    @property
    def decoders_autoscaled(self) -> bool:
        """The master scales the decoders (MIN < MAX), and so needs the Kubernetes API."""
        return self.decoders is not None and self.decoders[0] < self.decoders[1]

    @property
    def checkpoint_dir(self) -> str | None:
        """This job's folder on the checkpoint volume, as the workers see it."""
        return None if self.checkpoint_pvc is None else f"{CHECKPOINT_MOUNT}/{self.name}"
