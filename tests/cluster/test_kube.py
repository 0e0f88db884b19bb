"""Errors users meet with Kubernetes, as the client library raises them (its own ApiException,
carrying a Status body as the API server sends it) and as trainfeed words them. There is no
Kubernetes cluster on the machines these tests run on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from trainfeed.cli.main import build_parser, main
from trainfeed.cluster.kube import NO_CONFIG, api_error, connect, current_namespace
from trainfeed.errors import ClusterError


def refusal(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status, reason)
    e.body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Failure", "message": message, "reason": reason,
                         "code": status})
    return e


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with no kubeconfig that is not a pod."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)


def test_no_kubeconfig_says_what_to_set(no_cluster: None) -> None:
    with pytest.raises(ClusterError, match=NO_CONFIG.replace("(", r"\(")):
        connect()
    assert NO_CONFIG == "no Kubernetes configuration found: set KUBECONFIG or run inside a cluster"


@pytest.mark.parametrize("argv,advice", [
    (["submit", "--name", "a", "--image", "i", "--workers", "1", "--dataset", "d",
      "--storage-pvc", "p", "--", "python", "t.py"], "; use --dry-run to print the objects"),
    (["scale", "a", "--workers", "3"], "; `kubectl config get-contexts` lists the clusters"),
    (["delete", "a"], "; `kubectl config get-contexts` lists the clusters"),
    (["status", "a"], "; give --master HOST:PORT to see the master's view alone"),
])
def test_every_cluster_command_without_a_cluster_exits_2_with_its_own_hint(
        argv: list[str], advice: str, no_cluster: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, all four advised --dry-run, which only `submit` has."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"trainfeed {argv[0]}: error: no Kubernetes configuration found: set KUBECONFIG" in err
    assert advice in err
    assert ("--dry-run" in err) == (argv[0] == "submit")
    # Every flag advised is one the command has.
    for flag in ("--dry-run", "--master"):
        if flag in err:
            assert flag in main_help(argv[0])


def main_help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    return str(sub.choices[command].format_help())


def test_namespace_defaults_to_the_kubeconfig_context(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "a",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
              "users": [{"name": "u", "user": {"token": "x"}}],
              "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u",
                                                     "namespace": "team-a"}},
                           {"name": "b", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert current_namespace() == "team-a"
    assert current_namespace("b") == "default"


def test_unknown_job() -> None:
    e = refusal(404, "NotFound", 'jobs.batch "ghost-workers" not found')
    error = api_error(e, "read Job ghost-workers", "ghost", "team-a")
    assert str(error).startswith("no trainfeed job 'ghost' in namespace 'team-a'")


def test_unknown_namespace() -> None:
    e = refusal(404, "NotFound", 'namespaces "team-b" not found')
    error = api_error(e, "create Secret x-trainfeed-auth", "x", "team-b")
    assert "there is no namespace 'team-b' (kubectl create namespace team-b" in str(error)


def test_exceeded_quota() -> None:
    message = ('persistentvolumeclaims "resnet-master-state" is forbidden: exceeded quota: '
               'storage, requested: requests.storage=1Gi, used: requests.storage=100Gi, '
               'limited: requests.storage=100Gi')
    error = str(api_error(refusal(403, "Forbidden", message),
                          "create PersistentVolumeClaim resnet-master-state", "resnet", "ml"))
    assert error.startswith("create PersistentVolumeClaim resnet-master-state: the "
                            "ResourceQuota of namespace 'ml' is exceeded: ")
    assert "limited: requests.storage=100Gi" in error
    assert "kubectl describe resourcequota -n ml" in error


def test_missing_permissions_point_at_the_role() -> None:
    message = ('jobs.batch is forbidden: User "alice" cannot create resource "jobs" in API '
               'group "batch" in the namespace "ml"')
    error = str(api_error(refusal(403, "Forbidden", message), "create Job r-workers", "r", "ml"))
    assert "forbidden in namespace 'ml'" in error and "deploy/k8s/rbac.yaml" in error
    assert "kubectl auth can-i create jobs -n ml" in error


def test_existing_job() -> None:
    error = str(api_error(refusal(409, "AlreadyExists",
                                  'secrets "r-trainfeed-auth" already exists'),
                          "create Secret r-trainfeed-auth", "r", "ml"))
    assert error.startswith("a trainfeed job 'r' already exists in namespace 'ml'")
    assert "trainfeed delete r -n ml" in error


def test_other_errors_keep_status_and_message() -> None:
    error = str(api_error(refusal(500, "InternalError", "etcdserver: request timed out"),
                          "create Job r-workers", "r", "ml"))
    assert error == ("create Job r-workers: Kubernetes API error 500 InternalError: "
                     "etcdserver: request timed out")
    e = ApiException(502, "Bad Gateway")
    e.body = "<html>proxy error</html>"
    assert "502 Bad Gateway: <html>proxy error</html>" in str(api_error(e, "x", "r", "ml"))


def test_flags_are_checked_before_looking_for_a_cluster(
        no_cluster: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--name", "a", "--image", "i", "--workers", "1", "--dataset", "d",
                 "--", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "trainfeed submit: error: no storage: pods share no local disk" in err
    assert "Kubernetes configuration" not in err
