"""etcd's ceiling for the master's journal: txns per second through the store's own client.

What it measures: `EtcdStateStore.append_batch` in a loop, one txn in flight at a time (as the
master's journal writer does), each txn holding the ops of C calls, for several C. A call's ops
are those of one `GetTasks` of benchmarks/master_load.py with 4 tasks per call (4 DONE reports
and one lease), so "tasks/s" is 4 x calls/s: the most master_load's workers could complete per
second if etcd, reached this way, were the only limit. Per row: txns/s, calls/s, tasks/s, the
txn's p50/p99 latency, the client's CPU per txn and etcd's own CPU (from /proc when etcd runs on
this machine, `--etcd-pid`).

Why (issue 28: "with etcd, >= 2,000 partitions/s at p99 < 100 ms"): it tells whether etcd, or
the master around it, bounds master_load's etcd rows. The master's group commit puts every call
that arrived during the previous txn into the next, so C is about calls/s x txn latency.

    python benchmarks/etcd_ceiling.py --etcd 127.0.0.1:23790 [--calls 1 5 10 50] [--seconds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from proc_stats import process_cpu_s

from trainfeed.master.stores.etcd import EtcdStateStore

# One GetTasks of master_load (K = 4): the DONE reports of the previous 4 tasks and a lease.
WORKER = "load-0-12-0123456789abcdef"
CALL_OPS: list[list[Any]] = [["D", i, WORKER] for i in range(4)] + [["L", WORKER, [1, 2, 3, 4]]]
TASKS_PER_CALL = 4


def measure(store: EtcdStateStore, calls: int, seconds: float, etcd_pid: int | None
            ) -> dict[str, Any]:
    ops = CALL_OPS * calls
    latencies: list[float] = []
    etcd0 = process_cpu_s(etcd_pid) if etcd_pid else 0.0
    cpu0, start = time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        store.append_batch({"ceiling": ops})
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    etcd_cpu = process_cpu_s(etcd_pid) - etcd0 if etcd_pid else None
    latencies.sort()
    n = len(latencies)
    return {"calls_per_txn": calls, "value_bytes": len(json.dumps(ops, separators=(",", ":"))),
            "txns": n, "txns_per_s": n / wall, "calls_per_s": n * calls / wall,
            "tasks_per_s": n * calls * TASKS_PER_CALL / wall,
            "p50_ms": latencies[n // 2] * 1000,
            "p99_ms": latencies[min(n - 1, n * 99 // 100)] * 1000,
            "client_cpu_ms_per_txn": cpu / n * 1000,
            "etcd_cores": etcd_cpu / wall if etcd_cpu is not None else None}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--etcd", required=True, metavar="HOST:PORT", help="a running etcd")
    p.add_argument("--calls", type=int, nargs="+", default=[1, 5, 10, 50],
                   help="calls' ops per txn (default 1 5 10 50)")
    p.add_argument("--seconds", type=float, default=5.0, help="per row (default 5)")
    p.add_argument("--etcd-pid", type=int, default=None,
                   help="etcd's process id, for its CPU (only when it runs on this machine)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    store = EtcdStateStore(f"etcd://{args.etcd}/etcd-ceiling-{uuid.uuid4().hex[:6]}")
    rows = []
    try:
        store.acquire(f"etcd-ceiling:{os.getpid()}", wait_s=10)
        store.save_snapshot("ceiling", {"version": 1})
        print(f"load average {os.getloadavg()[0]:.1f} at the start", file=sys.stderr)
        print("| calls/txn | value bytes | txns/s | calls/s | tasks/s (x4) | p50 ms | p99 ms "
              "| client CPU ms/txn | etcd cores |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for calls in args.calls:
            r = measure(store, calls, args.seconds, args.etcd_pid)
            rows.append(r)
            etcd = f"{r['etcd_cores']:.2f}" if r["etcd_cores"] is not None else "-"
            print(f"| {calls} | {r['value_bytes']:,} | {r['txns_per_s']:,.0f} "
                  f"| {r['calls_per_s']:,.0f} | {r['tasks_per_s']:,.0f} | {r['p50_ms']:.1f} "
                  f"| {r['p99_ms']:.1f} | {r['client_cpu_ms_per_txn']:.2f} | {etcd} |",
                  flush=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
    finally:
        store.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "etcd_ceiling", "etcd": args.etcd, "rows": rows,
                       "loadavg_end": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
