"""The peers trainfeed's decode figures are compared with, measured in the same run.

Each method reads one epoch of a `train_data.list` of JPEGs, decodes every image to uint8 HxWx3,
converts it to float32 / 255, one-hot encodes its label (10 classes) and hands batches of
`--batch` to the same consumer, which checks shapes, counts images and sums the labels. A method
runs `--repeat` epochs in one process; the last one counts (warm page cache, TensorFlow graphs
built). Output: one JSON line {seconds, cpu_s, samples, check, runs_s}, `cpu_s` being the CPU
seconds of this process and its children (the tf.data service's dispatcher and workers).

- `plain`: the loop engineers write first: Pillow opens each file, numpy stacks a batch.
- `tfdata`: a tuned local tf.data pipeline: file names and labels, `map(read + decode_jpeg,
  AUTOTUNE)`, batch, a vectorized `map(cast, one_hot)`, prefetch(AUTOTUNE).
- `tfdata-service`: the same pipeline distributed by tf.data service (one dispatcher and
  `--workers` worker servers in processes of their own on loopback, dynamic sharding), with the
  float conversion done by the consumer, as a trainer would.

    python benchmarks/peers.py plain --data DIR
    python benchmarks/peers.py tfdata --data DIR --repeat 2
    python benchmarks/peers.py tfdata-service --data DIR --workers 2
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image
from stop_cleanly import exit_cleanly_on_signals

NUM_CLASSES = 10
METHODS = ("plain", "tfdata", "tfdata-service")


def read_list(data: str) -> tuple[list[str], list[int]]:
    base = os.path.abspath(data)
    paths, labels = [], []
    with open(os.path.join(base, "train_data.list"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                rel, label = line.rstrip("\n").split("\t")
                paths.append(os.path.join(base, rel))
                labels.append(int(label))
    return paths, labels


class Consumer:
    """What every method feeds: shape checks, an image count and a label checksum."""

    def __init__(self) -> None:
        self.samples = 0
        self.label_sum = 0

    def __call__(self, images: np.ndarray, one_hot: np.ndarray) -> None:
        assert images.dtype == np.float32 and images.ndim == 4 and images.shape[-1] == 3
        assert one_hot.shape == (len(images), NUM_CLASSES)
        self.samples += len(images)
        self.label_sum += int(one_hot.argmax(1).sum())


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    me, children = os.times(), None
    children = (me.children_user + me.children_system)
    return me.user + me.system + children


def process_tree_cpu(pids: Sequence[int]) -> float:
    """CPU seconds of running processes (the tf.data service servers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            pass
    return total


# -- the plain loop ----------------------------------------------------------------------------
def plain_epochs(paths: list[str], labels: list[int], batch: int) -> Callable[[Consumer], None]:
    eye = np.eye(NUM_CLASSES, dtype=np.float32)

    def epoch(consume: Consumer) -> None:
        for start in range(0, len(paths), batch):
            images = []
            for path in paths[start:start + batch]:
                with Image.open(path) as image:
                    images.append(np.asarray(image.convert("RGB")))
            x = np.stack(images).astype(np.float32) / 255.0
            consume(x, eye[labels[start:start + batch]])
    return epoch


# -- tf.data -----------------------------------------------------------------------------------
def tf_module() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    return tf


def tf_decoded(tf: Any, paths: list[str], labels: list[int], batch: int) -> Any:
    """Decoded uint8 batches: the part of the pipeline a tf.data service worker runs."""
    def load(path: Any, label: Any) -> tuple[Any, Any]:
        return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(batch)


def tf_finish(tf: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
    def finish(x: Any, y: Any) -> tuple[Any, Any]:
        return tf.cast(x, tf.float32) / 255.0, tf.one_hot(y, NUM_CLASSES)
    return finish


def tfdata_epochs(paths: list[str], labels: list[int], batch: int) -> Callable[[Consumer], None]:
    tf = tf_module()
    ds = tf_decoded(tf, paths, labels, batch).map(tf_finish(tf),
                                                   num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    def epoch(consume: Consumer) -> None:
        for x, y in ds.as_numpy_iterator():
            consume(x, y)
    return epoch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(role: str, port: int, dispatcher: int) -> int:
    """Runs one tf.data service server (a process of its own) until killed."""
    tf = tf_module()
    service = tf.data.experimental.service
    if role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=port))
    else:
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=f"localhost:{dispatcher}", worker_address=f"localhost:{port}",
            port=port))
    print("serving", flush=True)
    server.join()
    return 0


class Servers:
    """A dispatcher and `workers` workers in subprocesses; stopped on exit."""

    def __init__(self, workers: int):
        self.dispatcher_port = free_port()
        self.procs = [self._start("dispatcher", self.dispatcher_port)]
        self.procs += [self._start("worker", free_port()) for _ in range(workers)]

    def _start(self, role: str, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, __file__, "--_serve", role, "--port", str(port),
                                 "--dispatcher", str(getattr(self, "dispatcher_port", port))],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
        return proc

    def cpu_s(self) -> float:
        return process_tree_cpu([p.pid for p in self.procs])

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(30)


def tfdata_service_epochs(paths: list[str], labels: list[int], batch: int,
                          servers: Servers) -> Callable[[Consumer], None]:
    tf = tf_module()
    finish = tf_finish(tf)

    def epoch(consume: Consumer) -> None:
        ds = tf_decoded(tf, paths, labels, batch).apply(tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=f"grpc://localhost:{servers.dispatcher_port}"))
        ds = ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        for x, y in ds.as_numpy_iterator():
            consume(x, y)
    return epoch


# -- the run -----------------------------------------------------------------------------------
def measure(epoch: Callable[[Consumer], None], repeat: int, expected: tuple[int, int],
            extra_cpu: Callable[[], float] = lambda: 0.0) -> dict[str, Any]:
    runs: list[tuple[float, float, Consumer]] = []
    for _ in range(repeat):
        consume = Consumer()
        cpu0, extra0, t0 = cpu_seconds(), extra_cpu(), time.perf_counter()
        epoch(consume)
        seconds = time.perf_counter() - t0
        runs.append((seconds, cpu_seconds() - cpu0 + extra_cpu() - extra0, consume))
    seconds, cpu, last = runs[-1]
    check = "ok" if (last.samples, last.label_sum) == expected else "MISMATCH"
    return {"seconds": seconds, "cpu_s": cpu, "samples": last.samples, "check": check,
            "runs_s": [r[0] for r in runs]}


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # servers and temp data go on SIGTERM/SIGINT too
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("method", nargs="?", choices=METHODS)
    p.add_argument("--data", help="folder of train_data.list and its images")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2, help="epochs in this process; last counts")
    p.add_argument("--workers", type=int, default=2, help="tf.data service workers")
    p.add_argument("--_serve", choices=("dispatcher", "worker"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dispatcher", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._serve:
        return serve(args._serve, args.port, args.dispatcher)
    if args.method is None or args.data is None:
        p.error("give a method and --data")
    paths, labels = read_list(args.data)
    expected = (len(labels), sum(labels))
    try:
        if args.method == "plain":
            result = measure(plain_epochs(paths, labels, args.batch), args.repeat, expected)
        elif args.method == "tfdata":
            result = measure(tfdata_epochs(paths, labels, args.batch), args.repeat, expected)
        else:
            servers = Servers(args.workers)
            try:
                result = measure(tfdata_service_epochs(paths, labels, args.batch, servers),
                                 args.repeat, expected, servers.cpu_s)
            finally:
                servers.close()
    except ImportError as e:
        result = {"error": f"{e} (pip install tensorflow-cpu)"}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
