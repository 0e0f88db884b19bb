"""`trainfeed submit-upload`, `upload-slice` and `upload-commit`: an upload as a cluster job.

`submit-upload` creates an Indexed Job whose index i runs `upload-slice` (the slice from
$JOB_COMPLETION_INDEX); `upload-commit` publishes once every slice is done, naming any that is
not. The same two commands run locally as N processes (trainfeed.ingest.slices).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from trainfeed import settings
from trainfeed.cli.cluster_cmd import _cluster_options, _dump_yaml, add_image_pull_secret_option
from trainfeed.cli.common import add_storage_options, storage_from
from trainfeed.cli.redacting import unredacted
from trainfeed.cli.upload_cmd import add_upload_options, at_least, options_from, upload_arguments
from trainfeed.cluster.jobs import Cluster
from trainfeed.cluster.kube import connect, current_namespace
from trainfeed.cluster.upload_job import (
    DEFAULT_PACKERS,
    SOURCE_MOUNT,
    UploadJobSpec,
    list_path_in_pods,
    packers_job,
)
from trainfeed.errors import ConfigurationError
from trainfeed.ingest.slices import SliceJob, commit, pack_slice

# What submit-upload can do when no cluster is configured (trainfeed.cluster.kube.connect).
NO_CLUSTER_ADVICE = "use --dry-run to print the Job as YAML"


def _slice_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("list", help="the .list file, at the same path for every packer")
    p.add_argument("--dataset", required=True, help="dataset name")
    p.add_argument("--workers", type=at_least(1), required=True, metavar="N",
                   help="packers (indexes) the upload is cut into")
    p.add_argument("--created-at", metavar="TIME",
                   help="the manifest's created_at, the same for every packer and the commit "
                        "(submit-upload sets it; default: now)")
    add_storage_options(p)
    add_upload_options(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit-upload", help="upload a .list as a Kubernetes Indexed Job of packers",
        description="Create an Indexed Job of N packers: index i packs the i-th slice of the "
                    "list's shards into the dataset's staging area (resumable, idempotent), and "
                    "the last packer to finish validates every slice and publishes the manifest "
                    "atomically. The list and its files must be on a volume every pod mounts "
                    f"(--source-pvc mounts one at {SOURCE_MOUNT}); a path on this machine is "
                    "refused.")
    p.add_argument("list", help=f"the .list file inside the --source-pvc volume (train.list, or "
                                f"{SOURCE_MOUNT}/train.list), or under /data with --storage-pvc; "
                                f"the files it names are relative to its folder")
    p.add_argument("--dataset", required=True, help="dataset name")
    p.add_argument("--workers", type=at_least(1), default=DEFAULT_PACKERS, metavar="N",
                   help=f"packer pods (indexes), one CPU each (default {DEFAULT_PACKERS})")
    p.add_argument("--image", required=True, help="the trainfeed image the packers run")
    p.add_argument("--name", help="job name (default: upload-<dataset>)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--storage", metavar="URL", help="where the dataset goes: s3://bucket/…")
    where.add_argument("--storage-pvc", metavar="NAME",
                       help="where the dataset goes: a shared volume (RWX PVC), read-write")
    p.add_argument("--source-pvc", metavar="NAME",
                   help=f"a volume holding the list and its files, mounted read-only at "
                        f"{SOURCE_MOUNT}")
    p.add_argument("--s3-secret", metavar="NAME",
                   help="Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY for --storage")
    p.add_argument("--s3-endpoint", metavar="URL", help="endpoint of a non-AWS S3 server")
    add_image_pull_secret_option(p)
    p.add_argument("--dry-run", action="store_true", help="print the Job as YAML; create nothing")
    _cluster_options(p)
    add_upload_options(p)
    p.set_defaults(run=run_submit)

    p = sub.add_parser(
        "upload-slice", help="pack one slice of an upload (an index of submit-upload's Job)",
        description="Pack slice $JOB_COMPLETION_INDEX (or --index) of N of a list into the "
                    "dataset's staging area, resuming after the shards an earlier attempt "
                    "finished; then publish if every slice is done.")
    _slice_arguments(p)
    p.add_argument("--index", type=at_least(0), metavar="I",
                   help="the slice (default $JOB_COMPLETION_INDEX)")
    p.add_argument("--no-commit", action="store_true",
                   help="do not try to publish after the slice")
    p.set_defaults(run=run_slice)

    p = sub.add_parser(
        "upload-commit", help="publish an upload packed as slices, once every slice is done",
        description="Validate every slice of an upload run as N packers and publish its "
                    "manifest atomically; refuse, naming each slice missing or failed, "
                    "otherwise.")
    _slice_arguments(p)
    p.set_defaults(run=run_commit)


def _job(args: argparse.Namespace) -> SliceJob:
    created_at = args.created_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return SliceJob(args.list, args.dataset, storage_from(args), args.workers, created_at,
                    options_from(args))


def run_slice(args: argparse.Namespace) -> int:
    index = args.index if args.index is not None else settings.JOB_COMPLETION_INDEX.get()
    if index is None:
        raise ConfigurationError("upload-slice: no slice given: pass --index I, or set "
                                 "$JOB_COMPLETION_INDEX (Kubernetes does in an Indexed Job)")
    result = pack_slice(_job(args), index, commit_after=not args.no_commit)
    shards = (f"shards {result.shards[0]}-{result.shards[-1]}" if result.shards
              else "no shards")
    print(f"slice {index} of {args.workers} packed ({shards}, {result.resumed} resumed)"
          + ("; every slice done: published" if result.published else ""))
    return 0


def run_commit(args: argparse.Namespace) -> int:
    manifest = commit(_job(args))
    print(f"published {manifest.name!r}: {manifest.num_records} records in "
          f"{len(manifest.shards)} shard(s)")
    return 0


def _spec(args: argparse.Namespace) -> UploadJobSpec:
    name = args.name or "upload-" + args.dataset.replace("/", "-").replace("_", "-").lower()
    return UploadJobSpec(
        name=name, image=args.image, list_path=list_path_in_pods(args.list, args.source_pvc),
        dataset=args.dataset,
        workers=args.workers, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        upload_args=tuple(upload_arguments(args)), namespace=args.namespace,
        storage=args.storage, storage_pvc=args.storage_pvc, source_pvc=args.source_pvc,
        s3_secret=args.s3_secret, s3_endpoint=args.s3_endpoint,
        image_pull_secrets=tuple(args.image_pull_secrets))


def run_submit(args: argparse.Namespace) -> int:
    try:
        spec = _spec(args)  # every flag checked before any cluster call
    except ValueError as e:
        raise ConfigurationError(f"submit-upload: {e}") from None
    if args.dry_run:
        unredacted(sys.stdout).write(_dump_yaml([packers_job(spec)]))
        return 0
    api = connect(args.context, advice=NO_CLUSTER_ADVICE)
    namespace = args.namespace or current_namespace(args.context)
    spec = dataclasses.replace(spec, namespace=namespace)
    with Cluster(api, namespace) as cluster:
        created = cluster.create(spec.name, [packers_job(spec)])
    print(f"submitted upload {spec.name!r} of {spec.dataset!r} to namespace {namespace!r}: "
          f"{', '.join(created)}; `kubectl get job {spec.job_name} -n {namespace}` shows its "
          f"indexes")
    if args.storage:
        print(f"progress: trainfeed status --uploads --storage {args.storage} --watch")
    return 0
