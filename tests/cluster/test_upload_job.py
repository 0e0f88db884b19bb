"""`trainfeed submit-upload` (issue 30 §3): its Indexed Job of packers validates strictly
against Kubernetes' schema, as the training jobs' objects do, and is created through the real
`kubernetes` client against the stand-in API server of apiserver.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster.apiserver import FakeApiServer
from cluster.test_jobs import NS, kube  # noqa: F401 (the fixture, defined once)
from cluster.test_manifests import validate

from trainfeed.cli.main import main
from trainfeed.cluster.upload_job import UploadJobSpec, packers_job

DRY_RUNS = {
    "s3": ["--storage", "s3://bucket/datasets", "--s3-secret", "s3", "--s3-endpoint",
           "http://seaweedfs:8333", "--source-pvc", "photos"],
    "shared volume, resized": ["--storage-pvc", "datasets", "--max-side", "256",
                               "--jpeg-restarts", "-n", "team-a"],
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
                created_at="t")
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
                 "--image", "reg/trainfeed:0.1.0", "--storage-pvc", "datasets"]) == 0
    out = capsys.readouterr().out
    assert f"submitted upload 'upload-photos' of 'photos' to namespace '{NS}'" in out
    calls = [(method, path) for method, path, _ in kube.requests]
    assert calls == [("POST", f"/apis/batch/v1/namespaces/{NS}/jobs"),
                     ("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/upload-photos-packers")]
    job = kube.objects("jobs", NS)["upload-photos-packers"]
    assert job["spec"]["parallelism"] == 4 and job["spec"]["completionMode"] == "Indexed"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]  # read-write
