"""Issue 4's example: a small Keras model trained for one epoch by two worker processes that
share one epoch of an uploaded image dataset through a real master."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from optional import require
from sample_data import make_image_list

from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]
WORKER = str(Path(__file__).with_name("keras_worker.py"))
N = 200
LABELS = ("cat", "dog", "bird")  # record i has LABELS[i % 3]; class ids in sorted label order
# Liveness bounds, not speed claims: beside `stress-ng --cpu 8 --io 2 --vm 2 --vm-bytes 1G`
# (load ~20 on 2 cores) two TensorFlow processes took minutes to import and train, past the
# 120 s once here and the suite's 300 s default timeout (the test: 25-40 s on a quiet machine).
TIMEOUT_S = 600


def wait_ready(procs: list[subprocess.Popen[bytes]], flags: list[Path]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not all(flag.exists() for flag in flags):
        for p in procs:
            assert p.poll() is None, f"worker exited with {p.returncode} before it was ready"
        assert time.monotonic() < deadline, "workers not ready in time"
        time.sleep(0.05)


@pytest.mark.timeout(3 * TIMEOUT_S)
def test_two_keras_workers_train_one_epoch_on_every_record_once(tmp_path: Path) -> None:
    require("tensorflow")
    source = make_image_list(tmp_path / "source", N, labels=LABELS)
    storage = str(tmp_path / "storage")
    # 8-row row groups: 25 partitions to share.
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    go = tmp_path / "go"
    with MasterProcess(storage) as master, ExitStack() as files:
        env = {**os.environ, "TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train",
               "TRAIN_LOCAL": ""}
        procs = [subprocess.Popen([sys.executable, WORKER, "--dataset", "flowers", "--out",
                                   str(out), "--ready", str(flag), "--go", str(go),
                                   "--delay", "0.05"], env=env,
                                  stderr=files.enter_context(log.open("wb")))
                 for out, flag, log in zip(outs, ready, logs)]
        try:
            wait_ready(procs, ready)
            go.touch()
            for p, log in zip(procs, logs):
                assert p.wait(TIMEOUT_S) == 0, (
                    f"worker exited with {p.returncode}:\n{log.read_text()[-3000:]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    results = [json.loads(out.read_text()) for out in outs]
    trained = Counter(i for r in results for batch in r["ids"] for i in batch)
    assert trained == Counter(range(N)), (
        f"missing {sorted(set(range(N)) - set(trained))}, "
        f"repeated {[i for i, n in trained.items() if n > 1]}")
    for r in results:
        assert r["epoch"] == 0
        # Both trained (the split is real), one step per batch the reader handed over.
        assert r["steps"] == len(r["ids"]) > 0
        assert math.isfinite(r["loss"])
        for ids, classes in zip(r["ids"], r["classes"]):
            assert classes == [sorted(LABELS).index(LABELS[i % 3]) for i in ids]
    for log in logs:  # no pass was cut short (see trainfeed.reader.adapters.ABANDONED)
        assert "abandoned" not in log.read_text()
