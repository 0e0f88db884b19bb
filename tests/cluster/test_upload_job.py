"""`trainfeed submit-upload` (issue 30 §3): its Indexed Job of packers validates strictly
against Kubernetes' schema, as the training jobs' objects do, and is created through the real
`kubernetes` client against the stand-in API server of apiserver.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster.apiserver import FakeApiServer
from cluster.test_jobs import NS, kube  # noqa: F401 (the fixture, defined once)
from cluster.test_manifests import validate

from trainfeed.cli.main import main
from trainfeed.cluster.upload_job import (
    DEFAULT_PACKERS,
    UploadJobSpec,
    list_path_in_pods,
    packers_job,
)

DRY_RUNS = {
    "s3": ["--storage", "s3://bucket/datasets", "--s3-secret", "s3", "--s3-endpoint",
           "http://seaweedfs:8333", "--source-pvc", "photos"],
    "shared volume, resized": ["--storage-pvc", "datasets", "--source-pvc", "photos",
                               "--max-side", "256", "--jpeg-restarts", "-n", "team-a"],
}


@pytest.mark.parametrize("flags", DRY_RUNS.values(), ids=DRY_RUNS.keys())
def test_dry_run_output_validates(flags: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainfeed.cli.main", "submit-upload", "/source/train.list",
         "--dataset", "public/photos", "--workers", "8", "--image", "reg/trainfeed:0.1.0",
         "--dry-run", *flags], capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")},
             "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in docs] == ["Job"]
    validate(docs[0], "submit-upload --dry-run " + " ".join(flags))
    spec = docs[0]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 8
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert args[:6] == ["upload-slice", "/source/train.list", "--dataset", "public/photos",
                        "--workers", "8"]
    assert "--created-at" in args and args[args.index("--processes") + 1] == "1"
    if "--max-side" in flags:
        assert args[-3:] == ["--max-side", "256", "--jpeg-restarts"]


def test_the_spec_refuses_what_cannot_work() -> None:
    base = dict(name="up", image="i", list_path="/source/a.list", dataset="d", workers=2,
                created_at="t", source_pvc="photos")
    with pytest.raises(ValueError, match="exactly one of --storage"):
        UploadJobSpec(**base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is a local path: each pod would write to its own"):
        UploadJobSpec(**base, storage="/data")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--workers must be at least 1"):
        UploadJobSpec(**{**base, "workers": 0}, storage_pvc="p")  # type: ignore[arg-type]
    validate(packers_job(UploadJobSpec(**base, storage_pvc="p")), "packers_job")  # type: ignore[arg-type]


def test_submit_upload_creates_the_indexed_job(kube: FakeApiServer,  # noqa: F811
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit-upload", "/source/train.list", "--dataset", "photos", "--workers", "4",
                 "--image", "reg/trainfeed:0.1.0", "--storage-pvc", "datasets",
                 "--source-pvc", "photos"]) == 0
    out = capsys.readouterr().out
    assert f"submitted upload 'upload-photos' of 'photos' to namespace '{NS}'" in out
    calls = [(method, path) for method, path, _ in kube.requests]
    assert calls == [("POST", f"/apis/batch/v1/namespaces/{NS}/jobs"),
                     ("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/upload-photos-packers")]
    job = kube.objects("jobs", NS)["upload-photos-packers"]
    assert job["spec"]["parallelism"] == 4 and job["spec"]["completionMode"] == "Indexed"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]  # read-write


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["submit-upload", *args, "--dataset", "photos", "--image", "reg/trainfeed:0.1.0",
                 "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


UNSEEN_LISTS = {
    # Issue 38: the laptop's path, printed as a Job every packer of which would fail.
    "a path on this machine": (["photos/train_data.list", "--storage-pvc", "datasets"],
                               "'photos/train_data.list' is a path on this machine"),
    "an absolute one": (["/home/ana/photos/train.list", "--storage", "s3://b/d"],
                        "'/home/ana/photos/train.list' is a path on this machine|not on a "
                        "volume the packers mount"),
    "outside the source volume": (["/home/ana/train.list", "--storage", "s3://b/d",
                                   "--source-pvc", "photos"],
                                  r"not on a volume the packers mount \(they see /source/"),
    "out of it by '..'": (["/source/../etc/train.list", "--storage-pvc", "datasets",
                           "--source-pvc", "photos"], "not on a volume the packers mount"),
    "under /source with no volume there": (["/source/train.list", "--storage", "s3://b/d"],
                                           "they see nothing: no volume is mounted"),
    # Packers open the list and its files as files (trainfeed.ingest.inputs): a URL would
    # be a Job that can only fail too.
    "a URL": (["s3://bucket/train.list", "--storage", "s3://b/d"],
              "'s3://bucket/train.list' is a URL: packers read the list"),
}


@pytest.mark.parametrize("args,reason", UNSEEN_LISTS.values(), ids=UNSEEN_LISTS.keys())
def test_a_list_no_packer_can_see_is_refused_even_at_dry_run(
        args: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = dry_run(capsys, *args)
    assert code == 2 and out == ""  # no Job printed
    assert re.search(reason, err), err
    assert "--source-pvc NAME with the list's path inside that volume" in err  # what to do


def test_a_list_inside_the_source_volume_is_read_there(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A relative path with --source-pvc is inside the volume; --workers defaults (issue 38,
    papercut 7: it was required); --image-pull-secret reaches the pods (papercut 6)."""
    code, out, err = dry_run(capsys, "photos/train_data.list", "--source-pvc", "photos",
                             "--storage-pvc", "datasets", "--image-pull-secret", "regcred")
    assert code == 0, err
    job = yaml.safe_load(out)
    validate(job, "submit-upload --dry-run with a relative list")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == DEFAULT_PACKERS
    pod = job["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[:2] == ["upload-slice", "/source/photos/train_data.list"]
    assert args[args.index("--workers") + 1] == str(DEFAULT_PACKERS)
    assert {"name": "source", "mountPath": "/source", "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    # The dataset volume is mounted too: a list staged there is seen by every packer.
    code, out, err = dry_run(capsys, "/data/incoming/train.list", "--storage-pvc", "datasets")
    assert code == 0, err
    assert yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["args"][1] == \
        "/data/incoming/train.list"


def test_list_paths_in_pods() -> None:
    assert list_path_in_pods("a/b.list", "photos") == "/source/a/b.list"
    assert list_path_in_pods("/source/b.list", "photos") == "/source/b.list"
    assert list_path_in_pods("a/b.list", None) == "a/b.list"  # refused by the spec
    assert list_path_in_pods("s3://b/a.list", "photos") == "s3://b/a.list"  # refused too
    assert list_path_in_pods("../b.list", "photos") == "/b.list"  # refused: out of /source
