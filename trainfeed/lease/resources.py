"""What a worker declares about itself when it joins a job: host, name and GPU count."""
from __future__ import annotations

import shutil
import socket
import subprocess

from trainfeed import settings
from trainfeed.v1 import master_pb2 as pb

GPUS_ENV = settings.GPUS.name
NAME_ENV = settings.WORKER_NAME.name


def count_gpus() -> int:
    """`$TRAINFEED_GPUS` if set; else the devices in `$CUDA_VISIBLE_DEVICES` if set; else the
    GPUs `nvidia-smi -L` lists; else 0. No ML framework is imported (that costs seconds)."""
    declared = settings.GPUS.get()
    if declared is not None:
        return declared
    visible = settings.CUDA_VISIBLE_DEVICES.get()
    if visible is not None:
        return len(visible)
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
    return pb.WorkerResources(hostname=host, name=settings.WORKER_NAME.get() or host,
                              gpus=count_gpus())
