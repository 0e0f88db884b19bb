"""A job's life on a cluster: create its objects, scale its workers, read its pods, delete it.

Every call goes through `Cluster._call`, which turns the API's refusals into ClusterErrors
(trainfeed.cluster.kube.api_error) and an unreachable API server into one that names it.
Objects are plain dicts (trainfeed.cluster.objects); pods and events come back as dicts in the
API's own camelCase, so that the code reading them (trainfeed.cluster.diagnose) is pure.
"""
from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from trainfeed.cluster.kube import api_error, require_kubernetes
from trainfeed.cluster.objects import Obj, job_selector
from trainfeed.cluster.spec import TOKEN_KEY, ObjectNames
from trainfeed.errors import ClusterError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)
T = TypeVar("T")

# kind -> (API group class, the snake_case resource in its method names). Listed in creation
# order; deletion goes backwards, so the workers stop before their master.
KINDS = {
    "Secret": ("CoreV1Api", "secret"),
    "PersistentVolumeClaim": ("CoreV1Api", "persistent_volume_claim"),
    # The master's API access when it scales the decoders (objects.scaler_objects).
    "ServiceAccount": ("CoreV1Api", "service_account"),
    "Role": ("RbacAuthorizationV1Api", "role"),
    "RoleBinding": ("RbacAuthorizationV1Api", "role_binding"),
    "Service": ("CoreV1Api", "service"),
    "Deployment": ("AppsV1Api", "deployment"),
    "Job": ("BatchV1Api", "job"),
}
# A Job's pods (and a Deployment's ReplicaSet) go with it, in the background.
PROPAGATION = "Background"
# Every call waits at most this long (connect, read): a dead API server is not a hung CLI.
REQUEST_TIMEOUT_S = 30.0


# The object that owns a job's others: its workers Job, whose end (deleted, or expired by
# ttlSecondsAfterFinished) is the job's end.
OWNER_KIND = "Job"


def _suspended(job: Obj) -> Obj:
    """A copy of a Job created suspended: its pods wait until `_resume`."""
    return {**job, "spec": {**job["spec"], "suspend": True}}


def _owner_reference(owner: Obj) -> Obj:
    """A reference to `owner` as the API server returned it (with its uid). Not
    `blockOwnerDeletion`: setting it needs permission on the owner's finalizers, and deleting
    the owner need not wait for its dependents."""
    meta = owner["metadata"]
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
            "uid": meta["uid"]}


def _owned_by(obj: Obj, references: list[Obj]) -> Obj:
    """A copy of `obj` whose metadata names `references` as its owners."""
    if not references:
        return obj
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": references}}


class Cluster:
    """One namespace of one cluster, as the CLI uses it. Context manager; close() idempotent."""

    def __init__(self, api: ApiClient, namespace: str):
        self.api = api
        self.namespace = namespace
        client = require_kubernetes().client
        self._groups = {name: getattr(client, name)(api) for name, _ in KINDS.values()}

    def _method(self, verb: str, kind: str) -> Callable[..., Any]:
        group, resource = KINDS[kind]
        return getattr(self._groups[group], f"{verb}_namespaced_{resource}")

    def _call(self, action: str, job: str, method: Callable[..., T], *args: Any,
              missing_ok: bool = False, **kwargs: Any) -> T | None:
        """`method(*args, **kwargs)`; None for an object not found if `missing_ok`."""
        kubernetes = require_kubernetes()
        import urllib3

        try:
            return method(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except kubernetes.client.exceptions.ApiException as e:
            if missing_ok and e.status == 404:
                return None
            raise api_error(e, action, job, self.namespace) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ClusterError(f"{action}: cannot reach the Kubernetes API at "
                               f"{self.api.configuration.host}: {e}") from None

    def _to_dict(self, obj: object) -> Obj:
        return self.api.sanitize_for_serialization(obj)

    # -- submit -----------------------------------------------------------------------------
    def create(self, job: str, objects: Iterable[Obj]) -> list[str]:
        """Creates the objects; returns "Kind/name" of each, in the order created.

        The workers Job, if among them, is created first and suspended (no pod starts), so
        that every other object can name it as its owner: deleting the Job (`trainfeed
        delete`, or Kubernetes once `ttlSecondsAfterFinished` has passed) then deletes the
        master's Deployment, its Service and state PVC and the token Secret too (the garbage
        collector follows owner references). The Job is resumed once everything it needs
        exists, so no pod starts before its Secret and master.

        All or nothing: if one is refused (quota, a name taken), those already created are
        deleted again before the error is raised, so a failed submit leaves nothing behind.
        """
        objects = list(objects)
        owners = [o for o in objects if o["kind"] == OWNER_KIND]
        owned = [o for o in objects if o["kind"] != OWNER_KIND]
        created: list[tuple[str, str]] = []
        try:
            references: list[Obj] = []
            for owner in owners:
                answer = self._create(job, _suspended(owner))
                created.append((owner["kind"], owner["metadata"]["name"]))
                references.append(_owner_reference(answer))
            for obj in owned:
                self._create(job, _owned_by(obj, references))
                created.append((obj["kind"], obj["metadata"]["name"]))
            for owner in owners:
                if not owner["spec"].get("suspend"):
                    self._resume(job, owner["metadata"]["name"])
        except ClusterError:
            for kind, name in reversed(created):
                try:
                    self._delete(job, kind, name)
                except ClusterError as e:  # report the first error, not the clean-up's
                    logger.warning("could not delete %s/%s after a failed submit: %s",
                                   kind, name, e)
            raise
        return [f"{kind}/{name}" for kind, name in created]

    def _create(self, job: str, obj: Obj) -> Obj:
        kind, name = obj["kind"], obj["metadata"]["name"]
        answer = self._call(f"create {kind} {name}", job, self._method("create", kind),
                            self.namespace, obj)
        logger.debug("created %s/%s in %s", kind, name, self.namespace)
        return self._to_dict(answer)

    def _resume(self, job: str, name: str) -> None:
        patch = [{"op": "replace", "path": "/spec/suspend", "value": False}]
        self._call(f"start Job {name}", job, self._method("patch", "Job"), name,
                   self.namespace, patch, _content_type="application/json-patch+json")

    # -- scale ------------------------------------------------------------------------------
    def read_workers(self, job: str) -> Obj:
        name = ObjectNames(job).workers
        return self._to_dict(self._call(f"read Job {name}", job,
                                        self._method("read", "Job"), name, self.namespace))

    def scale(self, job: str, workers: int) -> int:
        """Sets the number of worker pods; returns the number before.

        An Indexed Job's completions change with its parallelism (elastic Indexed Jobs need
        completions == parallelism): scaling up starts new indexes, scaling down stops the
        highest ones, whose leases go back to the master's todo list.
        """
        if workers < 1:
            # An Indexed Job with 0 completions is complete at once: that would end the job.
            raise ClusterError(f"--workers must be at least 1, got {workers} (to pause a job, "
                               f"suspend its Job: kubectl patch job {ObjectNames(job).workers} "
                               f"-p '{{\"spec\":{{\"suspend\":true}}}}')")
        current = self.read_workers(job)
        spec, status = current.get("spec", {}), current.get("status", {})
        if (current.get("metadata", {}).get("labels") or {}).get("trainfeed.io/sync") == "true":
            raise ClusterError(f"job {job!r} is synchronous: its world size is fixed at submit "
                               f"(every rank's WORLD_SIZE); submit it again with --workers "
                               f"{workers}, resuming from the ranks' reader.state_dict()")
        finished = [c["type"] for c in status.get("conditions") or ()
                    if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"]
        if finished:
            raise ClusterError(f"the workers of job {job!r} have finished ({finished[0]}); a "
                               f"finished Job cannot be scaled: submit the job again")
        patch = [{"op": "replace", "path": "/spec/parallelism", "value": workers}]
        if spec.get("completionMode") == "Indexed":
            patch.append({"op": "replace", "path": "/spec/completions", "value": workers})
        name = ObjectNames(job).workers
        self._call(f"scale Job {name}", job, self._method("patch", "Job"), name,
                   self.namespace, patch, _content_type="application/json-patch+json")
        return int(spec.get("parallelism") or 0)

    def read_deployment(self, job: str, name: str) -> Obj:
        return self._to_dict(self._call(f"read Deployment {name}", job,
                                        self._method("read", "Deployment"), name,
                                        self.namespace))

    def set_replicas(self, job: str, name: str, replicas: int) -> None:
        """Sets a Deployment's spec.replicas (the decoders': trainfeed.cluster.decoders)."""
        patch = [{"op": "replace", "path": "/spec/replicas", "value": replicas}]
        self._call(f"scale Deployment {name}", job, self._method("patch", "Deployment"), name,
                   self.namespace, patch, _content_type="application/json-patch+json")

    # -- delete -----------------------------------------------------------------------------
    def _delete(self, job: str, kind: str, name: str) -> None:
        # Missing is fine: the Job goes first, and the garbage collector may take the objects
        # it owns before their own turn comes.
        self._call(f"delete {kind} {name}", job, self._method("delete", kind), name,
                   self.namespace, propagation_policy=PROPAGATION, missing_ok=True)

    def delete(self, job: str) -> list[str]:
        """Deletes every object labelled with the job (its state PVC too); returns them.

        Raises:
            ClusterError: nothing of that job is in the namespace.
        """
        found = [(kind, item["metadata"]["name"])
                 for kind in reversed(KINDS) for item in self.objects_of(job, kind)]
        if not found:
            raise ClusterError(f"no trainfeed job {job!r} in namespace {self.namespace!r} "
                               f"(nothing labelled {job_selector(job)})")
        for kind, name in found:
            self._delete(job, kind, name)
        return [f"{kind}/{name}" for kind, name in found]

    # -- status -----------------------------------------------------------------------------
    def objects_of(self, job: str, kind: str) -> list[Obj]:
        answer = self._call(f"list {kind}s of job {job}", job, self._method("list", kind),
                            self.namespace, label_selector=job_selector(job))
        return list(self._to_dict(answer).get("items") or [])

    def pods(self, job: str) -> list[Obj]:
        """The pods of the job's master and workers (both carry the job's label)."""
        list_pods = self._groups["CoreV1Api"].list_namespaced_pod
        answer = self._call(f"list the pods of job {job}", job, list_pods, self.namespace,
                            label_selector=job_selector(job))
        return list(self._to_dict(answer).get("items") or [])

    def events(self, job: str) -> list[Obj]:
        """Warning events about the job's objects, pods and ReplicaSets (their names all start
        with the job's name): failed pulls, failed scheduling, refused pod creations."""
        list_events = self._groups["CoreV1Api"].list_namespaced_event
        answer = self._call(f"list the events of job {job}", job, list_events, self.namespace,
                            field_selector="type=Warning")
        prefix = f"{job}-"
        return [e for e in self._to_dict(answer).get("items") or ()
                if str(e.get("involvedObject", {}).get("name", "")).startswith(prefix)]

    def token(self, job: str) -> str | None:
        """The job's token from its Secret, or None if the Secret has none."""
        name = ObjectNames(job).auth
        secret = self._to_dict(self._call(f"read Secret {name}", job,
                                          self._method("read", "Secret"), name, self.namespace))
        value = (secret.get("data") or {}).get(TOKEN_KEY)
        return base64.b64decode(value).decode() if value else None

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
