"""What a worker declares about itself when it joins a job: host, name and GPU count."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess

from trainfeed.v1 import master_pb2 as pb

GPUS_ENV = "TRAINFEED_GPUS"
NAME_ENV = "TRAINFEED_WORKER_NAME"


def count_gpus() -> int:
    """`$TRAINFEED_GPUS` if set; else the devices in `$CUDA_VISIBLE_DEVICES` if set; else the
    GPUs `nvidia-smi -L` lists; else 0. No ML framework is imported (that costs seconds)."""
    if os.environ.get(GPUS_ENV, "").strip():
        return int(os.environ[GPUS_ENV])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def detect_resources() -> pb.WorkerResources:
    host = socket.gethostname()
    return pb.WorkerResources(hostname=host, name=os.environ.get(NAME_ENV) or host,
                              gpus=count_gpus())
