"""The HTTP memory attacks of issue 35 against a real master, each for --seconds, with an
honest reader reading meanwhile: the master's RSS before, at its peak and after, whether the
reader's epoch was exactly once, and the /metrics scrape latency with no attack.

    python benchmarks/attack_http.py --seconds 60 --json attack_http.json

The attacks (tests/security/http_attacks.py): 300 MiB login bodies one after another (length
announced, then chunked), two held connections announcing 400 MiB, and 2 x MAX_CONNECTIONS idle
connections reopened as the master closes them.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sample_data import make_image_list
from security.http_attacks import (
    MIB,
    closed_by_peer,
    hold,
    login_head,
    proc_status,
    scrape,
    send_big_body,
)

from trainfeed import MasterSource, dist
from trainfeed.master.serve.metrics import MAX_CONNECTIONS
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

RECORDS = 100


def big_bodies(port: int, until: float) -> None:
    chunked = False
    while time.monotonic() < until:
        send_big_body(port, 300 * MIB, chunked, stop=lambda: time.monotonic() >= until)
        chunked = not chunked


def held_lengths(port: int, until: float) -> None:
    while time.monotonic() < until:
        sockets = hold(port, 2, login_head(400 * MIB))
        for sock in sockets:
            closed_by_peer(sock, max(0.1, until - time.monotonic()))
            sock.close()


def idle(port: int, until: float) -> None:
    while time.monotonic() < until:
        sockets = hold(port, 2 * MAX_CONNECTIONS)
        closed_by_peer(sockets[-1], max(0.1, until - time.monotonic()))
        for sock in sockets:
            sock.close()


ATTACKS: dict[str, Callable[[int, float], None]] = {
    "300 MiB login bodies": big_bodies, "held 400 MiB lengths": held_lengths,
    "idle connections": idle}


def read_epoch(address: str, job: str, got: Counter[int]) -> None:
    with dist.reader("flowers", source=MasterSource(address, job=job)) as reader:
        for batch in reader.column_batches(10):
            got.update(batch["_id"].tolist())
            time.sleep(0.05)  # spread over the attack


def attack(master: MasterProcess, name: str, seconds: float) -> dict[str, object]:
    port, pid = master.metrics_port, master.proc.pid
    assert port is not None
    before = proc_status(pid, "VmRSS")
    peak, got = before, Counter[int]()
    until = time.monotonic() + seconds
    attacker = threading.Thread(target=ATTACKS[name], args=(port, until), daemon=True)
    attacker.start()
    job = name.replace(" ", "-")  # a valid job name
    reader = threading.Thread(target=read_epoch, args=(master.address, job, got), daemon=True)
    reader.start()
    scrapes = 0
    while time.monotonic() < until or attacker.is_alive():
        peak = max(peak, proc_status(pid, "VmRSS"))
        try:
            scrape(port, timeout_s=30)
            scrapes += 1
        except OSError:
            pass
        time.sleep(0.05)
    reader.join(120)
    after = proc_status(pid, "VmRSS")
    once = sorted(got) == list(range(RECORDS)) and set(got.values()) == {1}
    return {"attack": name, "seconds": seconds, "rss_before_mb": before / 1e6,
            "rss_peak_mb": peak / 1e6, "rss_after_mb": after / 1e6, "scrapes": scrapes,
            "epoch_exactly_once": once}


def scrape_latency(port: int, count: int) -> dict[str, float]:
    took = []
    for _ in range(count):
        started = time.perf_counter()
        scrape(port)
        took.append(time.perf_counter() - started)
    took.sort()
    return {"scrapes": count, "median_ms": 1000 * statistics.median(took),
            "p99_ms": 1000 * took[int(0.99 * (count - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="per attack (default 60)")
    parser.add_argument("--scrapes", type=int, default=300, help="for the latency figure")
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        storage = str(Path(work) / "storage")
        upload(str(make_image_list(Path(work) / "src", RECORDS)), "flowers", storage,
               UploadOptions(row_group_rows=10), progress=False)
        with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master:
            assert master.metrics_port is not None
            latency = scrape_latency(master.metrics_port, args.scrapes)
            print(f"/metrics: {latency['scrapes']} scrapes, median {latency['median_ms']:.2f}"
                  f" ms, p99 {latency['p99_ms']:.2f} ms")
            results = []
            print(f"{'attack':<24}{'s':>5}{'RSS before':>12}{'peak':>9}{'after':>9}"
                  f"{'scrapes':>9}  exactly once")
            for name in args.attacks:
                r = attack(master, name, args.seconds)
                results.append(r)
                print(f"{name:<24}{args.seconds:>5.0f}{r['rss_before_mb']:>9.1f} MB"
                      f"{r['rss_peak_mb']:>6.1f} MB{r['rss_after_mb']:>6.1f} MB"
                      f"{r['scrapes']:>9}  {r['epoch_exactly_once']}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": platform.platform(), "python": platform.python_version(),
            "records": RECORDS, "scrape_latency": latency, "attacks": results}, indent=1))


if __name__ == "__main__":
    main()
