"""The edge to the Kubernetes API: finding a configuration, and turning its refusals into
ClusterErrors that say what to do.

The `kubernetes` package is an extra (`trainfeed[k8s]`), imported here and only when a command
needs a cluster, so the core and `submit --dry-run` work without it.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from trainfeed import settings
from trainfeed.errors import ClusterError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient
    from kubernetes.client.exceptions import ApiException

NO_CONFIG = "no Kubernetes configuration found: set KUBECONFIG or run inside a cluster"
INSTALL_HINT = "pip install 'trainfeed[k8s]'"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def require_kubernetes() -> Any:
    """The `kubernetes` module, or a ClusterError saying which extra to install."""
    try:
        import kubernetes
    except ImportError:
        raise ClusterError(f"this command talks to Kubernetes and needs its client: "
                           f"{INSTALL_HINT}") from None
    return kubernetes


def kubeconfig_path() -> str:
    """`$KUBECONFIG` (one path or several joined by ':') now, else ~/.kube/config. Read at
    each call: the client library reads it once, when it is imported."""
    return settings.KUBECONFIG.get() or os.path.expanduser("~/.kube/config")


def connect(context: str | None = None, *, advice: str = "") -> ApiClient:
    """An API client from the kubeconfig (`$KUBECONFIG`, else ~/.kube/config), else from the
    service account of the pod this runs in, the order kubectl uses.

    Args:
        context: The kubeconfig context (default: the current one).
        advice: What the calling command can do without a cluster (`submit`: its --dry-run),
            appended to the error; each command says its own, so none is told of a flag it
            does not have.

    Raises:
        ClusterError: neither exists (the message says how to get one, then `advice`).
    """
    kubernetes = require_kubernetes()
    config = kubernetes.config
    try:
        return config.new_client_from_config(config_file=kubeconfig_path(), context=context)
    except (config.ConfigException, FileNotFoundError) as e:
        from_file = e
    if context is None:
        configuration = kubernetes.client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
            return kubernetes.client.ApiClient(configuration)
        except config.ConfigException:
            pass
    raise ClusterError(f"{NO_CONFIG}{'; ' + advice if advice else ''} ({from_file})")


def current_namespace(context: str | None = None) -> str:
    """The namespace kubectl would use: the kubeconfig context's, else the pod's own (in a
    cluster), else "default"."""
    config = require_kubernetes().config
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig_path())
    except (config.ConfigException, FileNotFoundError):
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    chosen = next((c for c in contexts if c.get("name") == context), active) \
        if context else active
    return str((chosen or {}).get("context", {}).get("namespace") or "default")


def _status_message(e: ApiException) -> str:
    """The API server's explanation: the `message` of the Status object it answers with."""
    body = e.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status = json.loads(body) if body else {}
    except ValueError:
        return str(body or e.reason or "").strip()
    return str(status.get("message") or e.reason or "").strip()


def api_error(e: ApiException, action: str, job: str, namespace: str) -> ClusterError:
    """The ClusterError for an API refusal of `action` ("create Job example-workers") on a job.

    Translates what users meet: an unknown job or namespace (404), an exceeded ResourceQuota
    and missing permissions (403), a job that already exists (409), an object the cluster
    rejects (422); anything else keeps the server's status and message.
    """
    status = int(e.status or 0)
    message = _status_message(e)
    where = f"namespace {namespace!r}"
    if status == 404:
        if "namespaces" in message and f'"{namespace}" not found' in message:
            return ClusterError(f"{action}: there is no {where} (kubectl create namespace "
                                f"{namespace}, or pick one with --namespace)")
        return ClusterError(f"no trainfeed job {job!r} in {where} ({action}: {message})")
    if status == 403 and "exceeded quota" in message:
        return ClusterError(
            f"{action}: the ResourceQuota of {where} is exceeded: {message}; ask for fewer "
            f"--workers or --gpus-per-worker, delete finished jobs, or ask for a larger quota "
            f"(kubectl describe resourcequota -n {namespace})")
    if status == 403:
        return ClusterError(
            f"{action}: forbidden in {where}: {message}; your account needs the Role of "
            f"deploy/k8s/rbac.yaml (check with `kubectl auth can-i create jobs -n {namespace}`)")
    if status == 401:
        return ClusterError(f"{action}: the cluster did not accept your credentials ({message}); "
                            f"refresh them (kubectl get pods checks them)")
    if status == 409:
        return ClusterError(f"a trainfeed job {job!r} already exists in {where} ({action}: "
                            f"{message}); delete it first (trainfeed delete {job} -n "
                            f"{namespace}) or choose another --name")
    if status == 422:
        return ClusterError(f"{action}: the cluster rejected the object: {message}")
    return ClusterError(f"{action}: Kubernetes API error {status} {e.reason or ''}: "
                        f"{message}".replace("  ", " "))
