"""`trainfeed submit`, `scale`, `status` and `delete`: a job on Kubernetes.

See docs/cluster.md. The objects are built by trainfeed.cluster.objects and sent by
trainfeed.cluster.jobs; this module only parses flags and prints. What it prints from the master
(a FAILED reason is any job-token holder's), the cluster (events, a container's termination
message) or a storage's uploads board goes through `say` / trainfeed.terminal_text.visible.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import sys
from typing import Any

from trainfeed.cli import status_uploads, status_watch
from trainfeed.cli.common import (
    add_storage_options,
    say,
    storage_from,
    whole_number_or_none,
)
from trainfeed.cli.redacting import unredacted
from trainfeed.cluster import diagnose, progress
from trainfeed.cluster.jobs import Cluster
from trainfeed.cluster.kube import connect, current_namespace, require_kubernetes
from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import (
    CHECKPOINT_MOUNT,
    DECODE_THREAD_MEMORY_MI,
    DECODER_PORT,
    DEFAULT_DECODE_THREADS,
    DEFAULT_TTL_AFTER_FINISHED_S,
    GRPC_PORT,
    METRICS_PORT,
    TRAINER_MEMORY_MI,
    JobSpec,
    ObjectNames,
    Toleration,
    parse_node_selector,
    validate_cluster_job_name,
)
from trainfeed.errors import ClusterError, ConfigurationError, TrainfeedError
from trainfeed.lease.client import MasterClient
from trainfeed.master.core.decoder_scaling import Bounds
from trainfeed.names import validate_job_name
from trainfeed.security import load_token

# secrets.token_urlsafe(32): 256 random bits, 43 URL-safe characters.
TOKEN_BYTES = 32
# Two status samples this far apart give the rate; long enough to see a partition finish.
DEFAULT_INTERVAL_S = 2.0
# How long `status` waits for a master before saying it is unreachable.
STATUS_GIVE_UP_S = 10.0
# What each command can do when no cluster is configured (trainfeed.cluster.kube.connect).
NO_CLUSTER_ADVICE = {
    "submit": "use --dry-run to print the objects as YAML",
    "status": f"give --master HOST:PORT to see the master's view alone (e.g. localhost:"
              f"{GRPC_PORT} through `kubectl port-forward`)",
    "scale": "`kubectl config get-contexts` lists the clusters kubectl knows",
    "delete": "`kubectl config get-contexts` lists the clusters kubectl knows",
}


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", metavar="NS",
                   help="Kubernetes namespace (default: the kubeconfig context's, else default)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")


def add_image_pull_secret_option(p: argparse.ArgumentParser) -> None:
    """--image-pull-secret, for `submit` and `submit-upload` alike."""
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                   dest="image_pull_secrets",
                   help="a Secret of type kubernetes.io/dockerconfigjson for a private registry "
                        "(`kubectl create secret docker-registry NAME …`), in every pod's "
                        "imagePullSecrets (repeatable)")


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"expected seconds ≥ 0, got {text!r}")
    return value


_ttl = whole_number_or_none("whole seconds")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit", help="run a training job on Kubernetes (master + GPU workers)",
        description="Create a job's token Secret, master (Deployment, Service, state PVC) and "
                    "workers (an Indexed Job running the command after '--'), wired with "
                    "TRAINFEED_MASTER, TRAINFEED_JOB, TRAINFEED_TOKEN and TRAINFEED_STORAGE.",
        epilog="example: trainfeed submit --name resnet --image registry/trainfeed-torch:0.1.0 "
               "--workers 4 --dataset flowers --storage-pvc datasets -- python train.py")
    p.add_argument("--name", required=True, metavar="JOB",
                   help="job name: TRAINFEED_JOB and the prefix of every object's name")
    p.add_argument("--image", required=True, metavar="IMG", help="the workers' image")
    p.add_argument("--workers", required=True, type=int, metavar="N", help="worker pods")
    p.add_argument("--gpus-per-worker", type=int, default=1, metavar="G",
                   help="nvidia.com/gpu per worker pod (default 1; 0 for CPU pods)")
    p.add_argument("--dataset", required=True, metavar="NAME",
                   help="the dataset the job reads (TRAINFEED_DATASET in the workers)")
    p.add_argument("--storage", metavar="URL",
                   help="storage root as the pods see it: s3://bucket/prefix, or a path under "
                        "/data with --storage-pvc (default /data)")
    p.add_argument("--storage-pvc", metavar="NAME",
                   help="an RWX PersistentVolumeClaim holding the datasets (GlusterFS, NFS, "
                        "CephFS), mounted read-only at /data")
    p.add_argument("--s3-secret", metavar="NAME",
                   help="a Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for the pods")
    p.add_argument("--s3-endpoint", metavar="URL",
                   help="a non-AWS S3 endpoint (TRAINFEED_S3_ENDPOINT in the pods)")
    p.add_argument("--master-image", metavar="IMG",
                   help="the master's image (default --image; the master needs no framework)")
    p.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help="schedule workers on matching nodes (repeatable)")
    p.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                   help="let workers run on tainted nodes, e.g. nvidia.com/gpu:NoSchedule "
                        "(repeatable)")
    p.add_argument("--worker-cpu", "--cpus-per-worker", dest="cpus_per_worker", metavar="Q",
                   help=f"CPU request per worker pod, e.g. 8 (default: per training process, "
                        f"one per GPU, --decode-threads + 1 for its training loop: "
                        f"{DEFAULT_DECODE_THREADS + 1} for one GPU)")
    p.add_argument("--worker-memory", "--memory-per-worker", dest="memory_per_worker",
                   metavar="Q",
                   help=f"memory request and limit per worker pod, e.g. 32Gi (default: a "
                        f"request only, per training process {TRAINER_MEMORY_MI}Mi plus "
                        f"{DECODE_THREAD_MEMORY_MI}Mi per decode thread: "
                        f"{TRAINER_MEMORY_MI + DEFAULT_DECODE_THREADS * DECODE_THREAD_MEMORY_MI}"
                        f"Mi for one GPU)")
    p.add_argument("--decode-threads", type=int, default=DEFAULT_DECODE_THREADS, metavar="T",
                   help=f"decode threads per training process, from which the default CPU and "
                        f"memory requests are derived; give the script the same figure "
                        f"(DecodeOptions(threads=T)) (default "
                        f"{DEFAULT_DECODE_THREADS})")
    p.add_argument("--ttl-after-finished", type=_ttl, default=DEFAULT_TTL_AFTER_FINISHED_S,
                   metavar="SECONDS|none",
                   help=f"delete the job's objects (workers, master, its state PVC, token "
                        f"Secret) this long after the workers finish or fail (default "
                        f"{DEFAULT_TTL_AFTER_FINISHED_S}, a day; 'none' keeps them until "
                        f"`trainfeed delete`)")
    p.add_argument("--sync", action="store_true",
                   help="synchronous training (DDP/torchrun, Horovod): the workers are ranks of "
                        "one group; each pod gets WORLD_SIZE, RANK (its completion index), "
                        "MASTER_ADDR (pod 0, through a headless Service), MASTER_PORT, and "
                        "NNODES/NODE_RANK for torchrun; the script reads with "
                        "dist.reader(..., sync=SyncOptions()). Not scalable afterwards; one "
                        "failed rank fails the whole group (submit again to restart it from "
                        "checkpoints: --checkpoint-pvc)")
    p.add_argument("--rendezvous-port", type=int, default=29500, metavar="PORT",
                   help="with --sync: MASTER_PORT, the rank-0 rendezvous port (default 29500)")
    p.add_argument("--checkpoint-pvc", metavar="NAME",
                   help=f"a claim the workers mount read-write at {CHECKPOINT_MOUNT} for their "
                        f"checkpoints (an RWX claim for more than one worker pod); the workers "
                        f"get TRAINFEED_CHECKPOINT_DIR={CHECKPOINT_MOUNT}/JOB, where the script "
                        f"saves its model and reader.state_dict() and finds them when the job is "
                        f"submitted again")
    p.add_argument("--decoders", metavar="N|MIN:MAX|auto",
                   help=f"remote decode: a pool of `trainfeed decoder` pods (a "
                        f"Deployment, and a Service JOB-decoders:{DECODER_PORT}) that decode "
                        f"for the trainers; N runs N of them; MIN:MAX lets the master scale "
                        f"them within those bounds (up while trainers wait for data and the "
                        f"decoders are busy, down when they idle: docs/cluster.md, \"Remote "
                        f"decode sizing\"), with a ServiceAccount and Role that let it patch "
                        f"that Deployment only; auto is 1:R, R the job's training processes "
                        f"(one decoder pod per GPU at most). Default: none, trainers decode")
    p.add_argument("--decoder-cpu", default="4", metavar="Q",
                   help="CPU request per decoder pod, the cores it decodes on (default 4: about "
                        "4,800 train-crop images/s of decode alone, docs/cluster.md)")
    add_image_pull_secret_option(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the objects as YAML (token included: treat it as a secret) and "
                        "touch no cluster")
    _cluster_options(p)
    # Not `command`: main() reads args.command as the subcommand's name.
    p.add_argument("train_command", nargs="*", metavar="-- COMMAND",
                   help="the training command, after '--': -- python train.py --epochs 10")
    p.set_defaults(run=run_submit)

    p = sub.add_parser(
        "scale", help="change the number of worker pods of a job",
        description="Set the workers' parallelism (and an Indexed Job's completions with it). "
                    "Elastic: the master hands partitions to whichever workers are there; a "
                    "stopped worker's leases go back to the others.")
    p.add_argument("job", help="job name")
    p.add_argument("--workers", required=True, type=int, metavar="N", help="worker pods")
    _cluster_options(p)
    p.set_defaults(run=run_scale)

    p = sub.add_parser(
        "status", help="a job's progress (from its master) and pods (from Kubernetes); "
                       "uploads in progress (--uploads)",
        description="Epoch, partitions todo/pending/done/failed, workers and rate from the "
                    "job's master; pod phases and problems (image pulls, scheduling, quota) "
                    "from Kubernetes when a cluster is configured. With --uploads: the uploads "
                    "of a storage in progress (slices done, records, rate, ETA, failed or stale "
                    "slices), read from the storage itself.")
    p.add_argument("job", nargs="?", help="job name (not with --uploads)")
    p.add_argument("--uploads", action="store_true",
                   help="show the uploads of --storage in progress (and published in the last "
                        "hour) instead of a job: `trainfeed upload`s and submit-upload's packers")
    p.add_argument("--dataset", metavar="NAME",
                   help="with --uploads: that dataset's uploads only")
    add_storage_options(p)
    p.add_argument("--master", metavar="HOST:PORT",
                   help="the master's address; from outside the cluster run `kubectl "
                        "port-forward svc/JOB-master 50051:50051` and give localhost:50051 "
                        "(default inside a cluster: the job's Service)")
    p.add_argument("--interval", type=_seconds, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"time between the two samples that give the rate, or between two "
                        f"refreshes of --watch (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--watch", action="store_true",
                   help="a live view of the master's status page (readers, input-bound share, "
                        "lost partitions), redrawn in place; plain lines when not a terminal")
    p.add_argument("--status-url", metavar="URL",
                   help="with --watch: the master's /status.json (default: the metrics port "
                        "the master names, on the --master host)")
    p.add_argument("--count", type=int, default=None, metavar="N", help=argparse.SUPPRESS)
    _cluster_options(p)
    p.set_defaults(run=run_status)

    p = sub.add_parser("delete", help="delete a job's objects from Kubernetes",
                       description="Delete every object labelled with the job: workers, master, "
                                   "its state PVC (the job's progress) and its token Secret.")
    p.add_argument("job", help="job name")
    _cluster_options(p)
    p.set_defaults(run=run_delete)


def _decoders(args: argparse.Namespace) -> tuple[int, int] | None:
    """--decoders as (MIN, MAX); `auto` is one decoder up to one per training process."""
    text = args.decoders
    if text is None:
        return None
    if text == "auto":
        ranks = max(1, args.workers) * max(1, args.gpus_per_worker)
        return 1, max(2, ranks)
    bounds = Bounds.parse(text)
    return bounds.low, bounds.high


def _spec(args: argparse.Namespace, namespace: str | None) -> JobSpec:
    try:
        return JobSpec(
            name=args.name, image=args.image, workers=args.workers, dataset=args.dataset,
            command=tuple(args.train_command), gpus_per_worker=args.gpus_per_worker,
            namespace=namespace, storage=args.storage, storage_pvc=args.storage_pvc,
            s3_secret=args.s3_secret, s3_endpoint=args.s3_endpoint,
            master_image=args.master_image,
            node_selector=parse_node_selector(args.node_selector),
            tolerations=tuple(Toleration.parse(t) for t in args.toleration),
            cpus_per_worker=args.cpus_per_worker, memory_per_worker=args.memory_per_worker,
            decode_threads=args.decode_threads, ttl_after_finished_s=args.ttl_after_finished,
            sync=args.sync, rendezvous_port=args.rendezvous_port,
            checkpoint_pvc=args.checkpoint_pvc,
            image_pull_secrets=tuple(args.image_pull_secrets),
            decoders=_decoders(args), decoder_cpu=args.decoder_cpu)
    except TrainfeedError:
        raise
    except ValueError as e:
        raise ClusterError(str(e)) from None


def _dump_yaml(objects: list[dict[str, Any]]) -> str:
    try:
        import yaml
    except ImportError:
        # A dependency of trainfeed itself (pyproject.toml), so only a broken install gets here.
        raise ClusterError("--dry-run prints YAML and needs PyYAML: pip install PyYAML") from None

    class PlainDumper(yaml.SafeDumper):
        """Writes a value used twice (one fieldRef for RANK and NODE_RANK) out twice, not as
        an `&id001` anchor and `*id001` alias: YAML people read and edit, as kubectl prints."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return str(yaml.dump_all(objects, Dumper=PlainDumper, sort_keys=False,
                             explicit_start=True))


def _port_forward_hint(job: str, namespace: str) -> str:
    return (f"kubectl port-forward -n {namespace} svc/{ObjectNames(job).master} "
            f"{GRPC_PORT}:{GRPC_PORT}")


def run_submit(args: argparse.Namespace) -> int:
    token = secrets.token_urlsafe(TOKEN_BYTES)
    if args.dry_run:  # no kubeconfig needed, not even the kubernetes package
        spec = _spec(args, args.namespace)
        if spec.decoders_autoscaled and spec.namespace is None:
            # `kubectl apply -n NS` places objects, not the namespace a RoleBinding names.
            raise ClusterError(f"--dry-run --decoders {args.decoders}: give -n NAMESPACE; the "
                               f"RoleBinding that lets the master scale the decoders names "
                               f"its ServiceAccount with its namespace")
        # Data for kubectl, not a message: the URLs given go out as given (cli.redacting).
        unredacted(sys.stdout).write(_dump_yaml(job_objects(spec, token)))
        return 0
    spec = _spec(args, args.namespace)  # every flag checked before any cluster call
    api = connect(args.context, advice=NO_CLUSTER_ADVICE["submit"])
    namespace = args.namespace or current_namespace(args.context)
    spec = dataclasses.replace(spec, namespace=namespace)
    with Cluster(api, namespace) as cluster:
        created = cluster.create(spec.name, job_objects(spec, token))
    say(f"submitted job {spec.name!r} to namespace {namespace!r}: {', '.join(created)}")
    print(f"progress: {_port_forward_hint(spec.name, namespace)} &\n"
          f"          trainfeed status {spec.name} -n {namespace} --master localhost:{GRPC_PORT}")
    return 0


def run_scale(args: argparse.Namespace) -> int:
    validate_cluster_job_name(args.job)
    api = connect(args.context, advice=NO_CLUSTER_ADVICE["scale"])
    namespace = args.namespace or current_namespace(args.context)
    with Cluster(api, namespace) as cluster:
        before = cluster.scale(args.job, args.workers)
    print(f"job {args.job!r}: workers {before} -> {args.workers}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    validate_cluster_job_name(args.job)
    api = connect(args.context, advice=NO_CLUSTER_ADVICE["delete"])
    namespace = args.namespace or current_namespace(args.context)
    with Cluster(api, namespace) as cluster:
        deleted = cluster.delete(args.job)
    say(f"deleted job {args.job!r} from namespace {namespace!r}: {', '.join(deleted)}")
    return 0


def _is_cluster_job_name(job: str) -> bool:
    try:
        validate_cluster_job_name(job)
    except TrainfeedError:
        return False
    return True


def _cluster_or_none(args: argparse.Namespace) -> Cluster | None:
    """The cluster if one is configured; None (pods not shown) when only --master is given."""
    try:
        require_kubernetes()
        api = connect(args.context, advice=NO_CLUSTER_ADVICE["status"])
    except ClusterError:
        if args.master:
            return None
        raise
    return Cluster(api, args.namespace or current_namespace(args.context))


def _print_pods(cluster: Cluster, job: str) -> list[diagnose.Problem]:
    pods = cluster.pods(job)
    by_component = diagnose.phases(pods)
    if not pods and not cluster.objects_of(job, "Job") and \
            not cluster.objects_of(job, "Deployment"):
        raise ClusterError(f"no trainfeed job {job!r} in namespace {cluster.namespace!r}")
    for component in ("master", "workers"):
        counts = by_component.get(component)
        shown = ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) \
            if counts else "no pods"
        say(f"{component + ' pods':<11} {shown}")
    found = diagnose.problems(pods, cluster.events(job))
    for problem in found:
        say(f"problem     {problem}")
    return found


def _watch(args: argparse.Namespace, address: str, token: str | None) -> int | None:
    """`status --watch`: the master's /status.json, redrawn every --interval. Without
    --status-url the master says its metrics port (JobStatus); None if it exports none (the
    caller then shows the gRPC counts once, as `status` without --watch)."""
    url = args.status_url
    if url is None:
        with MasterClient(address, give_up_s=STATUS_GIVE_UP_S, token=token) as client:
            answer = client.job_status(args.job)
        # A master from before JobStatus.metrics_port: the default port, as before.
        port = answer.metrics_port if answer.HasField("metrics_port") else METRICS_PORT
        url = status_watch.status_url(address, port)
        if url is None:
            print(f"status --watch: the master at {address} exports no metrics (started with "
                  f"--metrics-port none), so it has no /status.json to watch; showing its "
                  f"counts once instead. Restart it with --metrics-port PORT to watch, or give "
                  f"--status-url.", file=sys.stderr)
            return None
    given = load_token()
    bearer = given[0] if given is not None else token
    return status_watch.watch(lambda: status_watch.fetch(url, bearer), args.job, args.interval,
                              sys.stdout, sys.stdout.isatty(), args.count)


def _print_progress(args: argparse.Namespace, address: str, token: str | None) -> None:
    """The job's counts and rates over gRPC: two samples --interval apart."""
    with MasterClient(address, give_up_s=STATUS_GIVE_UP_S, token=token) as client:
        first, second = progress.sample_twice(lambda: client.job_status(args.job),
                                              args.interval)
    for line in progress.render(second.status, progress.partition_rate(first, second),
                                progress.record_rate(first, second)):
        say(line)  # the master's failed reasons are any job-token holder's text


def _uploads(args: argparse.Namespace) -> int:
    """`status --uploads`: the storage's uploads board, once or redrawn (--watch)."""
    if args.job is not None:
        raise ConfigurationError(f"status --uploads shows a storage's uploads, not job "
                                 f"{args.job!r}: drop one of them")
    read = status_uploads.read(storage_from(args))

    def get() -> list[dict[str, Any]]:
        return [u for u in read() if args.dataset in (None, u["dataset"])]

    if args.watch:
        return status_watch.watch(lambda: {"uploads": get()}, None, args.interval, sys.stdout,
                                  sys.stdout.isatty(), args.count)
    for line in status_uploads.render(get()):  # made visible there
        print(line)
    return 0


def _check_status_job(args: argparse.Namespace) -> None:
    """The job `status` asks about, checked before any cluster or master is contacted.

    With --master, any name the master and readers accept is a job to ask about (readers
    started by hand may use `paddleD-xmap`); the Kubernetes naming rule applies to jobs
    `submit` made, so pods are looked up only for names that could be one."""
    if args.job is None:
        raise ConfigurationError("status: name a job (trainfeed status JOB), or give --uploads "
                                 "for the uploads of a storage")
    if args.master:
        validate_job_name(args.job)
    else:
        validate_cluster_job_name(args.job)


def _master_address(args: argparse.Namespace, cluster: Cluster | None) -> str | None:
    """Where the job's master answers: --master, else its Service when this runs inside the
    cluster (the Service name resolves only there); None when neither applies."""
    if args.master is not None:
        return str(args.master)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and cluster:
        return f"{ObjectNames(args.job).master}.{cluster.namespace}.svc:{GRPC_PORT}"
    return None


def _show_master(args: argparse.Namespace, cluster: Cluster | None) -> int | None:
    """The master's part of `status`: its counts, or its /status.json redrawn (--watch).

    Returns the exit status of a watch that ran, else None (the caller goes on to the pods'
    problems). Without a reachable address, says how to get one instead."""
    address = _master_address(args, cluster)
    if address is None:
        assert cluster is not None  # _cluster_or_none raised otherwise
        print(f"progress    not shown: give --master localhost:{GRPC_PORT} after "
              f"`{_port_forward_hint(args.job, cluster.namespace)}`")
        return None
    # $TRAINFEED_TOKEN[_FILE] if set, else the job's own Secret (RBAC: get secrets).
    token = cluster.token(args.job) if cluster and load_token() is None else None
    watched = _watch(args, address, token) if args.watch else None
    if watched is None:
        _print_progress(args, address, token)
    return watched


def _raise_blocking(job: str, problems: list[diagnose.Problem]) -> None:
    """Fail `status` when a pod problem keeps the job from running, after all is shown."""
    blocking = [p for p in problems if p.blocking]
    if blocking:
        raise ClusterError(f"job {job!r} cannot run as it is: "
                           + "; ".join(str(p) for p in blocking))


def run_status(args: argparse.Namespace) -> int:
    if args.uploads:
        return _uploads(args)
    _check_status_job(args)
    cluster = _cluster_or_none(args) if _is_cluster_job_name(args.job) else None
    problems: list[diagnose.Problem] = []
    try:
        if cluster is not None:
            problems = _print_pods(cluster, args.job)
        watched = _show_master(args, cluster)
        if watched is not None:
            return watched
    finally:
        if cluster is not None:
            cluster.close()
    _raise_blocking(args.job, problems)
    return 0
