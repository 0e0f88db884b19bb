"""Issue 13: `tf.distribute.MultiWorkerMirroredStrategy` with 2 CPU workers (TF_CONFIG on
loopback) fits a Keras model through `as_tf_dataset` of synchronous readers, fed by a real
master and, unchanged, with TRAIN_LOCAL=1: every worker runs the same steps, every epoch, and no
record comes twice in an epoch."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from optional import require
from sample_data import make_image_list

from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKER = str(Path(__file__).with_name("mwms_worker.py"))
N = 100
TIMEOUT_S = 300


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.parametrize("where", ["master", "local"])
def test_multi_worker_mirrored_strategy_fits_two_epochs(where: str, tmp_path: Path) -> None:
    require("tensorflow")
    source = make_image_list(tmp_path / "source", N, labels=["a", "b", "c"])
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    hosts = [f"127.0.0.1:{port}" for port in free_ports(2)]
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]

    def run(env: dict[str, str]) -> None:
        procs = []
        for index, (out, log) in enumerate(zip(outs, logs)):
            config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
            procs.append(subprocess.Popen(
                [sys.executable, WORKER, "--dataset", "flowers", "--out", str(out)],
                env={**os.environ, **env, "TF_CONFIG": json.dumps(config)},
                stderr=log.open("wb")))
        try:
            for p, log in zip(procs, logs):
                assert p.wait(TIMEOUT_S) == 0, log.read_text()[-3000:]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()

    if where == "master":
        with MasterProcess(storage) as master:
            run({"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "mwms",
                 "TRAIN_LOCAL": ""})
    else:
        run({"TRAIN_LOCAL": "1", "TRAINFEED_STORAGE": storage})
    results = [json.loads(out.read_text()) for out in outs]
    steps = N // (2 * 10)
    for result in results:
        assert result["steps_per_epoch"] == steps
        assert result["steps"] == [steps, steps]  # Keras ran every step of both epochs
        assert len(result["loss"]) == 2
    for epoch in range(2):
        seen = Counter(i for r in results for i in r["passes"][epoch])
        assert len(seen) == 2 * steps * 10 and max(seen.values()) == 1
