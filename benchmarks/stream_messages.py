#!/usr/bin/env python3
"""What one Session stream message costs the master (issue 28): N reader sessions, each with its
Session stream open, send a progress message a second; the master's CPU per message is measured
with the messages spread over the second (each session at its own phase, as readers send
progress) and aligned (every session on the wall clock's whole seconds): what a message costs
alone, and together with many.

Nothing but the wire protocol runs in the clients (no reads, no trainer): one thread per session
sleeps until its next send, builds the message as the reader does
(trainfeed.lease.client.session_message) and queues it on its stream. The master runs with
`--state memory://` on the dataset of benchmarks/real_readers.py (uploaded once, reused).

    python benchmarks/stream_messages.py                     # 200 sessions, 20 s per mode
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from proc_stats import process_cpu_s
from real_readers import DEFAULT_ROOT, ensure_dataset

JOB = "stream-messages"
MODES = ("spread", "aligned")


def send_for(stream: Any, lease: tuple[int, int, int], held: list[tuple[int, int, int]],
             stats: Any, phase: float, until: float, sent: list[int]) -> None:
    """Sends a progress message on `stream` at every whole second + `phase` of the wall clock
    until the monotonic time `until`; appends how many it sent to `sent`."""
    from trainfeed.lease.client import session_message
    from trainfeed.v1 import master_pb2 as pb

    count = 0
    while True:
        wall = time.time()
        time.sleep(math.floor(wall - phase) + 1 + phase - wall)
        if time.monotonic() >= until:
            break
        count += 1
        report = pb.TaskReport(epoch=lease[0], partition=lease[1], lease=lease[2],
                               outcome=pb.TaskReport.PROGRESS, consumed=count)
        stream.send(session_message(0, [report], held, {lease}, None, stats))
    sent.append(count)


def run(a: argparse.Namespace) -> dict[str, Any]:
    from trainfeed.lease.client import MasterClient
    from trainfeed.master.serve.process import MasterProcess
    from trainfeed.v1 import master_pb2 as pb

    storage = os.path.abspath(a.storage)
    dataset = ensure_dataset(storage, a.records, a.partitions)
    here = os.getcwd()
    os.makedirs(DEFAULT_ROOT, exist_ok=True)
    os.chdir(DEFAULT_ROOT)  # (a master started inside a checkout imports that checkout)
    try:
        master = MasterProcess(storage, state="memory://", extra_args=[
            "--partitions", str(a.partitions), "--max-sessions", str(max(1024, 2 * a.sessions))])
    finally:
        os.chdir(here)
    stats = pb.ReaderStats(wall_s=1.0, input_wait_s=0.5, batches=2, records=2, bytes_read=64,
                           read_s=0.01)
    out: dict[str, Any] = {"sessions": a.sessions, "window_s": a.window}
    with master, MasterClient(master.address) as client:
        sessions = []
        for _ in range(a.sessions):
            opened = client.open_job(JOB, dataset, 0)
            granted = client.get_tasks(opened.job, opened.worker_id, 0, 2, 0).tasks
            held = [(t.epoch, t.partition, t.lease) for t in granted]
            sessions.append((client.session(opened.job, opened.worker_id), held))
        for stream, _ in sessions:
            stream.initial_metadata()
        pid = master.proc.pid
        cpu0, t0 = process_cpu_s(pid), time.monotonic()
        time.sleep(a.window / 2)
        out["idle_cores"] = (process_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
        for mode in MODES:
            until = time.monotonic() + a.window
            sent: list[int] = []
            threads = [threading.Thread(target=send_for, args=(
                stream, held[0], held, stats, random.random() if mode == "spread" else 0.0,
                until, sent)) for stream, held in sessions]
            cpu0, t0 = process_cpu_s(pid), time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cores = (process_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
            rate = sum(sent) / (time.monotonic() - t0)
            out[mode] = {"cores": cores, "messages_per_s": rate,
                         "ms_per_message": 1000 * (cores - out["idle_cores"]) / rate}
        for stream, _ in sessions:
            stream.cancel()
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--window", type=float, default=20.0, help="seconds measured per mode")
    p.add_argument("--records", type=int, default=12_000)
    p.add_argument("--partitions", type=int, default=1_200)
    p.add_argument("--storage", default=os.path.join(DEFAULT_ROOT, "real-readers-storage"))
    a = p.parse_args(argv)
    if a.sessions < 1 or a.window <= 0 or 2 * a.sessions > a.partitions:
        p.error("--sessions must be ≥ 1 and at most half of --partitions; --window > 0")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    s = run(a)
    print(f"{s['sessions']} Session streams, one progress message a second each; master idle "
          f"{s['idle_cores']:.4f} cores")
    print("| sends | messages/s | master CPU | master CPU per message |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        m = s[mode]
        print(f"| {mode} | {m['messages_per_s']:.1f} | {m['cores']:.4f} cores "
              f"| {m['ms_per_message']:.3f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
