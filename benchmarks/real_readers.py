#!/usr/bin/env python3
"""Real readers on one master (issue 28's last target): N `dist.reader`s, as threads in P
processes, each trainer taking raw records at a fixed rate, against a master process with
`--state memory://`.

The target is ≤ 1 call per reader-second and ≤ 0.5 ms of master CPU per reader-second. The fleet
simulator (benchmarks/fleet.py) measures the lease protocol with simulated reads; this one runs
the whole read path (session, Watch stream, prefetch, partition reads) so what a real reader costs
the master is measured, not modelled.

It uploads (or reuses) a text dataset of --records records in --partitions row groups, starts the
master, starts the readers and waits until every one has its first batch (joined). Then, over a
window of --window seconds, it reads:
- master CPU (cores, /proc/<pid>/stat) and master CPU ms per reader-second;
- calls/s by method (the master's trainfeed_rpc_duration_seconds_count) and calls per
  reader-second;
and after stopping the readers, per epoch: records delivered, missing and duplicated. An epoch
some reader's pass ran to its end is complete: every record must have come exactly once; an epoch
cut by the stop must have no record twice.

    python benchmarks/real_readers.py                          # 200 readers, 2 processes, 60 s
    python benchmarks/real_readers.py --readers 6 --window 10 --records 240 --partitions 24
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from proc_stats import process_cpu_s, rpc_counts
from stop_cleanly import exit_cleanly_on_signals

DEFAULT_ROOT = os.path.join(tempfile.gettempdir(), "trainfeed-bench")
TARGET_CALLS = 1.0  # calls per reader-second (issue 28)
TARGET_CPU_MS = 0.5  # master CPU ms per reader-second (issue 28)
JOB = "real-readers"


# -- the readers (in the child processes) ----------------------------------------------------------
def trainer(address: str, dataset: str, batch: int, rate: float, stop: threading.Event,
            joined: threading.Semaphore, out: dict[str, Any], got: Counter[str],
            readers: list[Any]) -> None:
    """One reader and its trainer: passes of `batch`-record batches, a sleep of batch/rate per
    batch, until `stop`. Records the ids it got per epoch and the epochs whose pass ended."""
    from trainfeed import MasterSource, dist

    ids: dict[int, list[int]] = defaultdict(list)
    finished: list[int] = []
    first = True
    reader = dist.reader(dataset, source=MasterSource(address, JOB))
    readers.append(reader)
    try:
        while not stop.is_set():
            batches = reader.column_batches(batch)
            ended = True
            try:
                for batch_got in batches:
                    mine = batch_got["_id"].tolist()
                    ids[int(reader.epoch or 0)].extend(mine)
                    got[threading.current_thread().name] += len(mine)
                    if first:
                        first = False
                        joined.release()
                    if stop.wait(len(mine) / rate):
                        ended = False
                        break
            finally:
                batches.close()  # type: ignore[attr-defined]
            if ended:
                finished.append(int(reader.epoch or 0))
    except Exception as e:  # reported to the parent, which fails the run
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if first:
            joined.release()  # (a reader that failed before its first batch: do not hang)
        reader.close()
        out["ids"] = {str(k): v for k, v in ids.items()}
        out["finished"] = finished


def client_main(address: str, dataset: str, readers: int, batch: int, rate: float,
                out_path: str, conn: multiprocessing.connection.Connection) -> None:
    """A reader process: `readers` trainer threads; says "joined" once each has its first batch,
    answers "count" with the records its trainers got so far, stops them on "stop" (or
    SIGTERM), writes their ids to `out_path`, then says "done"."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C: it sends "stop"
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    joined = threading.Semaphore(0)
    outs: list[dict[str, Any]] = [{} for _ in range(readers)]
    got: Counter[str] = Counter()  # records per trainer thread (each adds to its own key)
    made: list[Any] = []  # the readers, for their Session message counts
    threads = [threading.Thread(target=trainer, name=f"reader-{k}", daemon=True,
                                args=(address, dataset, batch, rate, stop, joined, outs[k], got,
                                      made))
               for k in range(readers)]
    for t in threads:
        t.start()
    for _ in range(readers):
        joined.acquire()
    conn.send("joined")
    while not stop.is_set():
        if conn.poll(0.5):
            word = conn.recv()
            if word == "stop":
                stop.set()
            elif word == "count":
                conn.send((sum(got.values()), stream_messages(made)))
    for t in threads:
        t.join(60)
    stuck = sum(t.is_alive() for t in threads)
    with open(out_path, "w") as f:
        json.dump({"readers": outs, "stuck": stuck}, f)
    conn.send("done")


def stream_messages(readers: list[Any]) -> dict[str, int]:
    """Session stream messages this process's readers sent so far: their GetTasks asked on the
    stream, and all their own messages (none from a tree without them)."""
    sessions = [getattr(getattr(r, "_backend", None) or getattr(r, "backend", None),
                        "session", None) for r in list(readers)]
    return {"grants": sum(getattr(s, "grants_on_stream", 0) for s in sessions),
            "own": sum(getattr(getattr(s, "transport", None), "messages", 0)  # (issue 36)
                       or getattr(s, "stream_messages", 0) for s in sessions)}


# -- the data set and the master -------------------------------------------------------------------
def ensure_dataset(storage: str, records: int, partitions: int) -> str:
    """A text dataset of `records` records in `partitions` row groups, uploaded once and reused
    (a marker beside the storage says the upload finished)."""
    from trainfeed.upload import UploadOptions, upload

    if records % partitions:
        raise SystemExit(f"--records {records} is not a multiple of --partitions {partitions}: "
                         "every partition is one row group of records/partitions records")
    name = f"real-{records}x{partitions}"
    marker = f"{storage}.{name}.done"
    if not os.path.exists(marker):
        os.makedirs(storage, exist_ok=True)
        listing = os.path.join(os.path.dirname(storage), f"{name}.list")
        with open(listing, "w") as f:
            f.write("".join(f"sentence {i}\tclass{i % 3}\n" for i in range(records)))
        upload(listing, name, storage,
               UploadOptions(kind="text", row_group_rows=records // partitions), progress=False)
        open(marker, "w").close()
    return name


def _wait(pipes: list[multiprocessing.connection.Connection], word: str, timeout: float,
          what: str) -> None:
    """Waits for `word` from every pipe, saying what for when it takes over 5 s."""
    deadline = time.monotonic() + timeout
    said = False
    for p in pipes:
        while not p.poll(min(5.0, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise SystemExit(f"{what}: not within {timeout:.0f} s")
            if not said:
                until = time.strftime("%H:%M:%S", time.localtime(
                    time.time() + deadline - time.monotonic()))
                print(f"waiting for {what} (until {until})", file=sys.stderr, flush=True)
                said = True
        if p.recv() != word:
            raise SystemExit(f"{what}: a reader process said something else than {word!r}")


def records_got(pipes: list[multiprocessing.connection.Connection]
                ) -> tuple[int, Counter[str]]:
    """Records the trainers of every reader process got so far, and the Session messages
    their readers sent (see stream_messages)."""
    for p in pipes:
        p.send("count")
    records, messages = 0, Counter[str]()
    for p in pipes:
        got, sent = p.recv()
        records += int(got)
        messages.update(sent)
    return records, messages


def run(a: argparse.Namespace) -> dict[str, Any]:
    from trainfeed.master.serve.process import MasterProcess

    storage = os.path.abspath(a.storage)
    dataset = ensure_dataset(storage, a.records, a.partitions)
    args = ["--partitions", str(a.partitions), "--max-sessions", str(max(1024, 2 * a.readers))]
    # Started outside any checkout: `python -m trainfeed.cli.main` imports trainfeed from its
    # working directory first (benchmarks/fleet.py says more).
    here = os.getcwd()
    os.makedirs(DEFAULT_ROOT, exist_ok=True)
    os.chdir(DEFAULT_ROOT)
    try:
        master = MasterProcess(storage, state="memory://", extra_args=args)
    finally:
        os.chdir(here)
    # The reader processes write their results here; gone however the run ends.
    with tempfile.TemporaryDirectory(prefix="trainfeed-real-readers-") as folder:
        ctx = multiprocessing.get_context("spawn")
        pipes: list[multiprocessing.connection.Connection] = []
        procs: list[Any] = []
        outs = [os.path.join(folder, f"process-{k}.json") for k in range(a.processes)]
        with master:
            try:
                for k in range(a.processes):
                    parent, child = ctx.Pipe()
                    n = len(range(k, a.readers, a.processes))
                    proc = ctx.Process(target=client_main, args=(
                        master.address, dataset, n, a.batch, a.rate, outs[k], child))
                    proc.start()
                    pipes.append(parent)
                    procs.append(proc)
                started = time.monotonic()
                _wait(pipes, "joined", a.join_timeout, f"{a.readers} readers to get a first batch")
                joined_s = time.monotonic() - started
                calls0, cpu0, t0 = rpc_counts(master.metrics_url), \
                    process_cpu_s(master.proc.pid), time.monotonic()
                got0, sent0 = records_got(pipes)
                time.sleep(a.window)
                calls1, cpu1, t1 = rpc_counts(master.metrics_url), \
                    process_cpu_s(master.proc.pid), time.monotonic()
                got1, sent1 = records_got(pipes)
                for p in pipes:
                    p.send("stop")
                _wait(pipes, "done", 120, "the readers to stop")
            finally:
                for p in pipes:  # (after an error or a signal: stop them all the same)
                    try:
                        p.send("stop")
                    except (OSError, ValueError):
                        pass
                for proc in procs:
                    proc.join(90)
                    if proc.is_alive():
                        print(f"reader process {proc.pid} did not stop in 90 s: terminating it",
                              file=sys.stderr, flush=True)
                        proc.terminate()
                        proc.join(10)
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
    wall, cpu = t1 - t0, cpu1 - cpu0
    calls = {m: (calls1.get(m, 0.0) - calls0.get(m, 0.0)) / wall
             for m in sorted(set(calls0) | set(calls1))}
    calls = {m: v for m, v in calls.items() if v > 0}
    reader_s = a.readers * wall
    records_per_s = (got1 - got0) / wall
    return {
        "readers": a.readers, "processes": a.processes, "rate": a.rate, "batch": a.batch,
        "records": a.records, "partitions": a.partitions, "window_s": wall, "joined_s": joined_s,
        "master_cores": cpu / wall, "calls_per_s": calls,
        "calls_per_reader_s": sum(calls.values()) * wall / reader_s,
        # Messages the readers sent on their Session streams (not calls): GetTasks asked on the
        # stream, and all of their own messages (those grants included).
        "stream_messages_per_s": {k: (sent1[k] - sent0[k]) / wall for k in sorted(sent1)},
        "cpu_ms_per_reader_s": 1000 * cpu / reader_s,
        # What the trainers got in the window: on a loaded machine they fall behind --rate, and
        # the master's CPU per reader-second with them; per record it does not.
        "records_per_s": records_per_s,
        "cpu_ms_per_record": 1000 * cpu / max(1, got1 - got0),
        "cpu_ms_per_reader_s_at_rate": 1000 * cpu / max(1, got1 - got0) * a.rate,
        "epochs": coverage(a.records, results),
        "errors": [r["error"] for res in results for r in res["readers"] if "error" in r],
        "stuck": sum(res["stuck"] for res in results),
    }


def coverage(records: int, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epoch: records delivered, distinct, missing (complete epochs only) and duplicated."""
    seen: dict[int, Counter[int]] = defaultdict(Counter)
    complete: set[int] = set()
    for res in results:
        for r in res["readers"]:
            for epoch, ids in r.get("ids", {}).items():
                seen[int(epoch)].update(ids)
            complete.update(r.get("finished", []))
    out = []
    for epoch, counts in sorted(seen.items()):
        done = epoch in complete
        out.append({"epoch": epoch, "complete": done, "delivered": sum(counts.values()),
                    "distinct": len(counts),
                    "missing": records - len(counts) if done else None,
                    "duplicated": sum(n - 1 for n in counts.values()),
                    "foreign": sum(1 for i in counts if not 0 <= i < records)})
    return out


def exactly_once(summary: dict[str, Any]) -> bool:
    """Every complete epoch had every record once; no epoch had one twice; no reader failed."""
    epochs = summary["epochs"]
    return (not summary["errors"] and not summary["stuck"]
            and all(e["duplicated"] == 0 and e["foreign"] == 0 for e in epochs)
            and all(e["missing"] == 0 for e in epochs if e["complete"]))


def render(s: dict[str, Any]) -> str:
    calls = sum(s["calls_per_s"].values())
    per_call, per_ms = s["calls_per_reader_s"], s["cpu_ms_per_reader_s"]
    lines = [
        f"{s['readers']} real dist.readers in {s['processes']} processes, {s['rate']} records/s "
        f"each (batches of {s['batch']}), {s['records']} records in {s['partitions']} "
        f"partitions; all joined in {s['joined_s']:.1f} s; window {s['window_s']:.1f} s",
        "",
        "| readers | window | master CPU | gRPC calls/s | calls per reader-second "
        "| master CPU per reader-second | exactly once |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {s['readers']} | {s['window_s']:.0f} s | {s['master_cores']:.3f} cores "
        f"| {calls:.0f} | {per_call:.3f} ({per_call / TARGET_CALLS:.2f}× the target "
        f"{TARGET_CALLS:g}) | {per_ms:.3f} ms ({per_ms / TARGET_CPU_MS:.2f}× the target "
        f"{TARGET_CPU_MS:g} ms) "
        f"| {'yes' if exactly_once(s) else 'NO'} |",
        "",
        "calls/s by method: " + ", ".join(f"{m} {v:.1f}" for m, v in s["calls_per_s"].items()),
        "Session messages/s the readers sent (not calls): " + ", ".join(
            f"{k} {v:.1f}" for k, v in s.get("stream_messages_per_s", {}).items()),
        f"trainers got {s['records_per_s']:.0f} records/s in the window (offered "
        f"{s['readers'] * s['rate']:g}): master CPU {s['cpu_ms_per_record']:.3f} ms per record, "
        f"{s['cpu_ms_per_reader_s_at_rate']:.3f} ms per reader-second at {s['rate']:g} "
        f"records/s",
    ]
    for e in s["epochs"]:
        state = (f"complete, {e['missing']} missing" if e["complete"]
                 else "cut by the stop")
        lines.append(f"epoch {e['epoch']}: {e['delivered']} records delivered, {e['distinct']} "
                     f"distinct ({state}), {e['duplicated']} duplicated")
    for error in s["errors"][:10]:
        lines.append(f"reader error: {error}")
    if s["stuck"]:
        lines.append(f"{s['stuck']} readers did not stop within 60 s")
    lines.append(f"exactly once: {'yes' if exactly_once(s) else 'NO'}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readers", type=int, default=200)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--rate", type=float, default=2.5, help="records/s each trainer takes")
    p.add_argument("--batch", type=int, default=1, help="records per batch")
    p.add_argument("--window", type=float, default=60.0,
                   help="seconds measured, from when every reader has its first batch")
    p.add_argument("--records", type=int, default=12_000)
    p.add_argument("--partitions", type=int, default=1_200)
    p.add_argument("--join-timeout", type=float, default=600.0,
                   help="seconds the readers have to get their first batch")
    p.add_argument("--storage", default=os.path.join(DEFAULT_ROOT, "real-readers-storage"))
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)
    if a.readers < 1 or a.processes < 1 or a.rate <= 0 or a.batch < 1 or a.window <= 0:
        p.error("--readers, --processes, --batch must be ≥ 1; --rate, --window > 0")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # the master and the reader processes stop on SIGTERM too
    a = parse_args(argv)
    summary = run(a)
    print(render(summary), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if exactly_once(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
