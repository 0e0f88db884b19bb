"""The quickstart: make a small image dataset, upload it, run a master and two readers locally.

The master requires a token, generated per run and handed to the readers in $TRAINFEED_TOKEN:
the path a cluster takes (there from a Secret), not a shortcut that works only here.

Everything runs on the embedded default (a local storage folder, the master's SQLite state file,
local processes), so `trainfeed demo` works on a fresh machine with nothing else running.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from trainfeed import settings
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.stores import DEFAULT_STATE_PATH
from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV
from trainfeed.storage import Storage
from trainfeed.upload import upload

if TYPE_CHECKING:
    from trainfeed.upload import UploadResult

DEMO_DATASET = "demo-images"
NUM_CLASSES = 10


def make_images(folder: str, count: int, size: int = 64, seed: int = 0) -> str:
    """Writes `count` JPEGs (a coloured gradient per class plus noise) and a .list; returns it."""
    from PIL import Image

    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    list_path = os.path.join(folder, "train_data.list")
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    with open(list_path, "w") as listing:
        for i in range(count):
            rng = np.random.default_rng((seed, i))
            label = int(rng.integers(NUM_CLASSES))
            base = np.array([label * 25, 255 - label * 25, 128], np.float32)
            pixels = base * ramp[:, None, None] + rng.normal(0, 20, (size, size, 3))
            name = f"images/{i:06d}.jpg"
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                os.path.join(folder, name), quality=90)
            listing.write(f"{name}\tclass-{label}\n")
    return list_path


def worker_main(dataset: str) -> None:
    """One demo reader process: reads one epoch through the master, prints a JSON summary."""
    from trainfeed import batch, dist

    reader = dist.reader(dataset)
    assert reader.field_names == ("image", "label")  # connects (OpenJob)
    # A start barrier: an epoch of this small set takes milliseconds, less than the readers'
    # start-up skew, so without it the first reader would take the whole epoch alone.
    print("ready", flush=True)
    sys.stdin.readline()
    records = payload = 0
    labels: dict[str, int] = {}
    for columns in batch(reader, 128, columnar=True)():
        records += len(columns["label"])
        payload += sum(map(len, columns["image"]))
        for label in columns["label"]:
            labels[label] = labels.get(label, 0) + 1
    epoch = reader.epoch
    reader.close()
    # No input-bound share: this loop trains nothing, so it waits for data all the time by
    # construction, and a share of 100% would read as an alarm (issue 38).
    print(json.dumps({"pid": os.getpid(), "epoch": epoch, "records": records,
                      "bytes": payload, "labels": labels}), flush=True)


def summary(summaries: list[dict[str, Any]], num_records: int, wall_s: float) -> list[str]:
    """What the demo measured, said so that nothing reads as an alarm it is not: each reader's
    share of the epoch (not a rate: every reader runs until the epoch ends, so records over its
    own time is its share again, and two shares of one epoch can differ 50-fold), the readers'
    rate together, and why there is no input-bound share (no trainer is attached)."""
    total = sum(s["records"] for s in summaries)
    lines = [f"reader {i} (pid {s['pid']}, epoch {s['epoch']}): {s['records']} records "
             f"({s['records'] / max(total, 1):.0%} of those read), {s['bytes'] / 1e6:.1f} MB, "
             f"{len(s['labels'])} classes" for i, s in enumerate(summaries)]
    epochs = {s["epoch"] for s in summaries}
    whole = total == num_records and len(epochs) == 1
    lines += [
        f"together: {total} of {num_records} records of epoch "
        f"{'/'.join(map(str, sorted(epochs)))}, each once: {'yes' if whole else 'NO'}; "
        f"{total / max(wall_s, 1e-9):,.0f} records/s in {wall_s:.1f} s",
        "the split: the master leases partitions to whichever reader asks; with no trainer to "
        "pace them, the reader that got going first reads most of an epoch this short (with "
        "trainers, the faster one reads more)",
        "input-bound: none shown; these readers feed no trainer (each only counts records, so it "
        "always waits for the next one); with a trainer, the status page shows the share of its "
        "time it waits for data",
    ]
    return lines


def run_demo(storage: Storage, workers: int = 2, images: int = 2000) -> int:
    result = _upload_demo_set(storage, images)
    # As on a cluster: the master requires a token, and its readers get it from their
    # environment (a fresh one per run; the job's state does not depend on it).
    token = secrets.token_urlsafe(32)
    with MasterProcess(storage.url, state=DEFAULT_STATE_PATH, token=token) as master:
        status_url = (master.metrics_url or "").replace("/metrics", "/status")
        print(f"master running at {master.address} (token required, metrics at "
              f"{master.metrics_url}, status page at {status_url}); starting {workers} reader "
              f"processes")
        read = _read_one_epoch(workers, _reader_env(master.address, token))
        if read is None:
            return 1
        summaries, wall = read
        for line in summary(summaries, result.num_records, wall):
            print(line)
        whole = (sum(s["records"] for s in summaries) == result.num_records
                 and len({s["epoch"] for s in summaries}) == 1)
        _show_status_page(status_url, token)
    print(f"next: read it without a master (then see README.md):\n"
          f"  {next_command(storage)}")
    return 0 if whole else 1


def _upload_demo_set(storage: Storage, images: int) -> UploadResult:
    """The demo's dataset in `storage`: its JPEGs made once (kept in _demo-source for the next
    run), then uploaded (a no-op when already published)."""
    data_dir = os.path.join(storage.root if storage.is_local else ".", "_demo-source")
    list_path = os.path.join(data_dir, "train_data.list")
    if not os.path.exists(list_path):
        print(f"making {images} 64x64 JPEGs in {data_dir} …", flush=True)
        make_images(data_dir, images)
    result = upload(list_path, DEMO_DATASET, storage)
    state = "already uploaded" if result.already_published else "uploaded"
    print(f"{state}: dataset {DEMO_DATASET!r}, {result.num_records} records at {result.url}")
    return result


def _reader_env(address: str, token: str) -> dict[str, str]:
    """The readers' environment: this one, pointed at the master with its token, and without
    what would bypass it (TRAIN_LOCAL) or name another token (a token file)."""
    env = {**os.environ, settings.MASTER.name: address, settings.JOB.name: "demo",
           TOKEN_ENV: token}
    env.pop(settings.TRAIN_LOCAL.name, None)
    env.pop(TOKEN_FILE_ENV, None)
    return env


def _read_one_epoch(workers: int, env: dict[str, str]) \
        -> tuple[list[dict[str, Any]], float] | None:
    """Runs `workers` reader processes through one epoch, started together once all have
    joined the job; returns their summaries and the seconds from the start to the last one's
    end, or None (said on stderr) when one failed."""
    command = [sys.executable, "-m", "trainfeed.demo", "--worker", DEMO_DATASET]
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(workers)]
    if not _all_ready(procs):  # every reader has joined the job …
        return None
    started = time.perf_counter()
    for proc in procs:  # … then all start together
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    summaries = _summaries(procs)
    if summaries is None:
        return None
    return summaries, time.perf_counter() - started


def _all_ready(procs: list[subprocess.Popen[str]]) -> bool:
    """Waits for each reader's "ready" (it has opened the job); False, said on stderr, at the
    first that ends or says anything else."""
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            print(f"reader {proc.pid} failed to start", file=sys.stderr)
            return False
    return True


def _summaries(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]] | None:
    """Each reader's JSON summary (its last line of output) once it has exited; None, said on
    stderr, at the first that failed."""
    summaries = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        if proc.returncode != 0:
            print(f"reader {proc.pid} failed (exit {proc.returncode})", file=sys.stderr)
            return None
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return summaries


def _interactive() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _show_status_page(url: str, token: str) -> None:
    """The status page's URL and this run's token (a throw-away one, made for this local demo);
    on a terminal the master serves it until Enter is pressed."""
    print(f"status page: {url} (log in with this run's token: {token})")
    if not _interactive():
        print("(the master stops with the demo; run `trainfeed demo` in a terminal to keep it "
              "serving the page)")
        return
    try:
        input("the master serves the page until you press Enter … ")
    except (EOFError, KeyboardInterrupt):
        print()


def next_command(storage: Storage) -> str:
    """A shell command that reads the demo's dataset again, in this process alone, without a
    master (TRAIN_LOCAL=1), and prints how many records it got: the step after the demo, as a
    line to paste. Quoted for POSIX shells; the interpreter is this one, where trainfeed is
    installed."""
    code = (f"from trainfeed import dist; "
            f"print(sum(1 for _ in dist.reader({DEMO_DATASET!r})()), 'records read')")
    return (f"{settings.TRAIN_LOCAL.name}=1 {settings.STORAGE.name}={shlex.quote(storage.url)} "
            f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="demo reader process (used by trainfeed demo)")
    parser.add_argument("--worker", metavar="DATASET", required=True)
    worker_main(parser.parse_args().worker)
