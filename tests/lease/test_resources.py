from __future__ import annotations

import pytest

from trainfeed.lease.resources import count_gpus, detect_resources


def test_gpu_count_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFEED_GPUS", "4")
    assert count_gpus() == 4
    monkeypatch.delenv("TRAINFEED_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert count_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert count_gpus() == 0


def test_worker_name_defaults_to_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINFEED_WORKER_NAME", raising=False)
    res = detect_resources()
    assert res.name == res.hostname != ""
    monkeypatch.setenv("TRAINFEED_WORKER_NAME", "gpu-node-7")
    assert detect_resources().name == "gpu-node-7"
