from __future__ import annotations

from typing import Any

import pytest

from trainfeed.cluster.spec import (
    MAX_JOB_NAME,
    JobSpec,
    ObjectNames,
    Toleration,
    parse_node_selector,
    validate_cluster_job_name,
)
from trainfeed.errors import InvalidNameError


def spec(**changes: Any) -> JobSpec:
    base: dict[str, Any] = dict(name="resnet", image="trainfeed-torch:0.1.0", workers=2,
                                dataset="flowers", command=("python", "train.py"),
                                storage_pvc="datasets")
    base.update(changes)
    return JobSpec(**base)


def test_every_derived_name_is_a_dns_label_at_the_longest_job_name() -> None:
    name = "j" * MAX_JOB_NAME
    validate_cluster_job_name(name)
    names = ObjectNames(name)
    for derived in (names.master, names.state, names.workers, names.auth):
        assert len(derived) <= 63 and derived.startswith(name)
    with pytest.raises(InvalidNameError, match=f"at most {MAX_JOB_NAME}"):
        validate_cluster_job_name(name + "j")


@pytest.mark.parametrize("name", ["Resnet", "res_net", "res.net", "9lives", "resnet-", "",
                                  "../x", "a/b"])
def test_job_names_kubernetes_cannot_take_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid job name"):
        validate_cluster_job_name(name)


def test_master_address_is_the_service_in_the_pods_namespace() -> None:
    assert ObjectNames("resnet").master_address == "resnet-master:50051"


@pytest.mark.parametrize("text, expected", [
    ("nvidia.com/gpu:NoSchedule", {"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}),
    ("dedicated=ml:NoExecute", {"key": "dedicated", "operator": "Equal", "value": "ml",
                                "effect": "NoExecute"}),
    ("spot", {"key": "spot", "operator": "Exists"}),
])
def test_tolerations_parse_like_kubectl_taints(text: str, expected: dict[str, str]) -> None:
    assert Toleration.parse(text).to_dict() == expected


@pytest.mark.parametrize("text", ["", ":NoSchedule", "k=:NoSchedule", "k:Sometimes"])
def test_bad_tolerations_name_the_syntax(text: str) -> None:
    with pytest.raises(ValueError, match=r"KEY\[=VALUE\]\[:EFFECT\]"):
        Toleration.parse(text)


def test_node_selectors() -> None:
    assert parse_node_selector(["a=b", "gpu.product=A100=x"]) == {"a": "b",
                                                                  "gpu.product": "A100=x"}
    with pytest.raises(ValueError, match="invalid node selector 'a'"):
        parse_node_selector(["a"])


@pytest.mark.parametrize("changes, message", [
    (dict(workers=0), "--workers must be at least 1"),
    (dict(gpus_per_worker=-1), "--gpus-per-worker"),
    (dict(command=()), "give it after '--'"),
    (dict(dataset="../etc"), "invalid dataset name"),
    (dict(namespace="Team_A"), "invalid namespace"),
    (dict(image="my image"), "invalid image"),
    (dict(memory_per_worker="lots"), "not a Kubernetes quantity"),
    (dict(storage_pvc=None, storage="/mnt/data"), "pods share no local disk"),
    (dict(storage_pvc=None, storage=None), "pods share no local disk"),
    (dict(storage_pvc=None, storage="file:///x"), "pods share no local disk"),
    (dict(storage="/elsewhere"), "give a path under it"),
    (dict(storage_pvc="Bad_Claim"), "invalid claim name"),
])
def test_specs_that_cannot_run_are_refused_with_the_flag(changes: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec(**changes)


def test_storage_url_the_pods_see() -> None:
    assert spec().storage_url == "/data"
    assert spec(storage="/data/team").storage_url == "/data/team"
    assert spec(storage_pvc=None, storage="s3://b/p").storage_url == "s3://b/p"


def test_a_refused_storage_url_is_named_without_its_password() -> None:
    with pytest.raises(ValueError) as caught:
        JobSpec(name="a", image="i", workers=1, dataset="d", command=("x",), storage_pvc="p",
                storage="http://key:s3cret-Qx9@seaweedfs:8333/data")
    assert "--storage 'http://key:***@seaweedfs:8333/data': with --storage-pvc" in str(caught.value)
    assert "s3cret-Qx9" not in str(caught.value)
