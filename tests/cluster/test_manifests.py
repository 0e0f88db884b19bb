"""Every manifest of deploy/k8s/ and every `submit --dry-run` output validates offline against
the OpenAPI schema of Kubernetes 1.37 (kubernetes-validate's newest, strict: unknown fields are
errors), and deploy/k8s/ holds exactly what `submit` builds for its example job."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import JobSpec

# The newest release kubernetes-validate 1.37 ships schemas for; raise it with the package.
KUBERNETES_VERSION = "1.37"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"

# The example job of deploy/k8s/, as `trainfeed submit` would be told it.
EXAMPLE = JobSpec(name="example", image="trainfeed-torch:0.1.0", master_image="trainfeed:0.1.0",
                  workers=2, dataset="flowers", command=("python", "train.py"),
                  storage_pvc="trainfeed-data")

DRY_RUNS = {
    "shared volume": ["--storage-pvc", "datasets"],
    "s3 with secret and endpoint": ["--storage", "s3://bucket/prefix", "--s3-secret", "s3",
                                    "--s3-endpoint", "http://seaweedfs:8333"],
    "cpu only, in a namespace": ["--storage-pvc", "datasets", "--gpus-per-worker", "0",
                                 "--cpus-per-worker", "4", "--memory-per-worker", "16Gi",
                                 "-n", "team-a"],
    "gpu nodes": ["--storage-pvc", "datasets", "--gpus-per-worker", "8",
                  "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
                  "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "spot=yes",
                  "--master-image", "trainfeed:0.1.0"],
    "synchronous ranks": ["--storage-pvc", "datasets", "--sync", "--rendezvous-port", "29400"],
    # Issue 38, papercut 6: a writable checkpoint volume and a private registry's Secret.
    "sync, checkpoints, private registry": [
        "--storage-pvc", "datasets", "--sync", "--gpus-per-worker", "0",
        "--checkpoint-pvc", "checkpoints", "--image-pull-secret", "regcred"],
}


def validate(obj: dict[str, Any], where: str) -> None:
    """Strict validation; a kind the schema does not know is an error too, not a warning."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        pytest.fail(f"{where}: {obj['kind']}/{obj['metadata']['name']}: {path}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError as e:
        pytest.fail(f"{where}: {e.message}")


def manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_pinned_version_is_the_newest_schema_shipped() -> None:
    assert kubernetes_validate.latest_version().startswith(KUBERNETES_VERSION)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [p.name for p in manifest_files()]


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_deploy_manifests_validate(path: Path) -> None:
    docs = load(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        validate(doc, path.name)
        assert "namespace" not in doc["metadata"], "kustomize (or kubectl -n) sets namespaces"


def test_deploy_manifests_are_what_submit_builds_for_the_example_job() -> None:
    """One source of truth: the documented manifests cannot drift from the CLI's objects."""
    deployed = {(d["kind"], d["metadata"]["name"]): d for p in manifest_files() for d in load(p)}
    for built in job_objects(EXAMPLE, token=""):
        key = (built["kind"], built["metadata"]["name"])
        assert key in deployed, f"deploy/k8s has no {key}"
        assert deployed[key] == built, f"deploy/k8s {key} differs from what submit builds"


def test_rbac_grants_what_the_cli_calls() -> None:
    from trainfeed.cluster.jobs import KINDS

    role = next(d for d in load(DEPLOY / "rbac.yaml") if d["kind"] == "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    plural = {"Secret": ("", "secrets"), "PersistentVolumeClaim": ("", "persistentvolumeclaims"),
              "Service": ("", "services"), "Deployment": ("apps", "deployments"),
              "Job": ("batch", "jobs"), "ServiceAccount": ("", "serviceaccounts"),
              "Role": ("rbac.authorization.k8s.io", "roles"),
              "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings")}
    for kind in KINDS:
        group, resource = plural[kind]
        for verb in ("create", "list", "delete"):
            assert (group, resource, verb) in granted, (kind, verb)
    needed = {("batch", "jobs", "get"), ("batch", "jobs", "patch"), ("", "secrets", "get"),
              ("", "pods", "list"), ("", "events", "list")}
    # What the master's Role of `--decoders MIN:MAX` grants: the submitter must hold it too.
    scaler = job_objects(JobSpec(**{**EXAMPLE.__dict__, "decoders": (1, 4)}), token="")
    role = next(o for o in scaler if o["kind"] == "Role")
    needed |= {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert needed <= granted


@pytest.mark.parametrize("flags", DRY_RUNS.values(), ids=DRY_RUNS.keys())
def test_submit_dry_run_output_validates(flags: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainfeed.cli.main", "submit", "--name", "resnet", "--image",
         "reg/trainfeed-torch:0.1.0", "--workers", "4", "--dataset", "public/flowers", "--dry-run",
         *flags, "--", "python", "train.py", "--lr", "0.1"],
        capture_output=True, text=True, timeout=60,
        # No cluster at all: a kubeconfig that does not exist, not inside a pod.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")},
             "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 0, result.stderr
    # Plain YAML: before, --sync's shared fieldRef came out as `&id001` and `*id001`.
    assert not re.search(r"[&*]id\d", result.stdout), result.stdout
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    sync = ["Service"] if "--sync" in flags else []  # the ranks' headless Service
    assert [d["kind"] for d in docs] == ["Secret", "PersistentVolumeClaim", "Service",
                                         "Deployment", *sync, "Job"]
    for doc in docs:
        validate(doc, "submit --dry-run " + " ".join(flags))
    job = docs[-1]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"] == ["python", "train.py", "--lr", "0.1"]
    assert docs[-1]["spec"]["parallelism"] == 4


DECODER_DRY_RUNS = {
    "fixed pool": (["--decoders", "3"], []),
    "autoscaled pool": (["--decoders", "1:8", "-n", "team-a"],
                        ["ServiceAccount", "Role", "RoleBinding"]),
    "auto, s3": (["--decoders", "auto", "-n", "team-a", "--storage", "s3://bucket/prefix",
                  "--s3-secret", "s3", "--decoder-cpu", "8", "--toleration",
                  "nvidia.com/gpu:NoSchedule"], ["ServiceAccount", "Role", "RoleBinding"]),
}


@pytest.mark.parametrize("flags, scaler", DECODER_DRY_RUNS.values(),
                         ids=DECODER_DRY_RUNS.keys())
def test_submit_dry_run_with_decoders_validates(flags: list[str], scaler: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: the decoders' Deployment and Service (and, when the master scales them, its
    ServiceAccount, Role and RoleBinding) pass the strict schema."""
    from trainfeed.cli.main import main

    storage = [] if "--storage" in flags else ["--storage-pvc", "datasets"]
    assert main(["submit", "--name", "resnet", "--image", "reg/t:1", "--workers", "4",
                 "--dataset", "flowers", *storage, *flags, "--dry-run", "--", "python",
                 "train.py"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in docs] == ["Secret", "PersistentVolumeClaim", *scaler, "Service",
                                         "Deployment", "Service", "Deployment", "Job"]
    for doc in docs:
        validate(doc, "submit --dry-run " + " ".join(flags))
    decoders = docs[-2]
    assert decoders["metadata"]["name"] == "resnet-decoders"
    container = decoders["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["decoder", "--listen", "0.0.0.0:50052"]
    assert container["args"][3] == "--storage"
    # The master's token, from the job's Secret, as the master gets it.
    token = next(e for e in container["env"] if e["name"] == "TRAINFEED_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "resnet-trainfeed-auth",
                                                  "key": "token"}
    master = docs[-4]["spec"]["template"]["spec"]
    assert master["automountServiceAccountToken"] is bool(scaler)
    low, high = decoders["metadata"]["annotations"]["trainfeed.io/decoders"].split(":")
    assert decoders["spec"]["replicas"] == int(low)
    if "auto" in flags:
        assert (low, high) == ("1", "4")  # one per training process at most


@pytest.mark.parametrize("flags, why", [
    (["--decoders", "0"], "1 <= MIN"), (["--decoders", "4:2"], "1 <= MIN"),
    (["--decoders", "many"], "expected N, MIN:MAX or auto"),
    (["--decoders", "1:4"], "give -n NAMESPACE"),
    (["--decoders", "2", "--decoder-cpu", "lots"], "--decoder-cpu: 'lots' is not a Kubernetes "
                                                   "quantity")])
def test_submit_refuses_bad_decoders(flags: list[str], why: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.cli.main import main

    assert main(["submit", "--name", "resnet", "--image", "reg/t:1", "--workers", "4",
                 "--dataset", "flowers", "--storage-pvc", "d", *flags, "--dry-run", "--",
                 "true"]) != 0
    assert why in capsys.readouterr().err


def test_dry_run_tokens_are_fresh_and_strong(capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.cli.main import main

    tokens = []
    for _ in range(2):
        assert main(["submit", "--name", "a", "--image", "i", "--workers", "1", "--dataset", "d",
                     "--storage-pvc", "p", "--dry-run", "--", "true"]) == 0
        secret = next(yaml.safe_load_all(capsys.readouterr().out))
        tokens.append(secret["stringData"]["token"])
    assert tokens[0] != tokens[1] and all(len(t) >= 43 for t in tokens)


def test_invalid_objects_fail_validation() -> None:
    """The validator is not a rubber stamp: a misspelt field and a wrong type are caught."""
    deployment = job_objects(EXAMPLE, token="")[3]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    job = job_objects(EXAMPLE, token="")[4]
    job["spec"]["paralelism"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


def test_objects_owned_by_the_workers_job_validate() -> None:
    """What `submit` sends: the Job created suspended, the others naming it as their owner."""
    from trainfeed.cluster.jobs import _owned_by, _owner_reference, _suspended

    objects = job_objects(EXAMPLE, token="")
    job = next(o for o in objects if o["kind"] == "Job")
    validate(_suspended(job), "the suspended Job")
    created = {**job, "metadata": {**job["metadata"],
                                   "uid": "6f1c2a4e-8d0b-4a53-9a8e-2f5d1c7b9e01"}}
    for obj in objects:
        if obj is not job:
            validate(_owned_by(obj, [_owner_reference(created)]), "owned by the Job")


# What `python -c` runs with the `kubernetes` package made unimportable (a None in sys.modules
# makes `import kubernetes` raise ImportError), as on a machine without the `k8s` extra.
NO_KUBERNETES = ("import sys; sys.modules['kubernetes'] = None; "
                 "from trainfeed.cli.main import main; sys.exit(main(sys.argv[1:]))")
DRY_RUN_COMMANDS = {
    "submit": ["submit", "--name", "resnet", "--image", "reg/t:1", "--workers", "2",
               "--dataset", "flowers", "--storage-pvc", "datasets", "--sync", "--dry-run",
               "--", "python", "train.py"],
    "submit-upload": ["submit-upload", "train.list", "--source-pvc", "photos", "--dataset",
                      "photos", "--image", "reg/t:1", "--storage-pvc", "datasets", "--dry-run"],
}


@pytest.mark.parametrize("argv", DRY_RUN_COMMANDS.values(), ids=DRY_RUN_COMMANDS.keys())
def test_dry_runs_print_yaml_without_the_kubernetes_client(argv: list[str],
                                                           tmp_path: Path) -> None:
    """Issue 38, papercut 7: printing YAML needs PyYAML alone, which trainfeed itself depends
    on; before, PyYAML came only with the `k8s` extra (and the error said to install it)."""
    result = subprocess.run(
        [sys.executable, "-c", NO_KUBERNETES, *argv], capture_output=True, text=True,
        timeout=60, env={**{k: v for k, v in os.environ.items()
                            if not k.startswith("KUBERNETES_")},
                         "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert docs and docs[-1]["kind"] == "Job"
    for doc in docs:
        validate(doc, " ".join(argv[:1]) + " --dry-run without kubernetes")
    # (Read as text: tomllib is Python 3.11's, and trainfeed supports 3.10.)
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    core = pyproject.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    assert re.search(r'^\s*"pyyaml\b', core, re.I | re.M), \
        "PyYAML must be a dependency of trainfeed itself, not of the k8s extra alone"
