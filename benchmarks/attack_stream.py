#!/usr/bin/env python3
"""The Session stream attacks of issue 35, against a real master, with an honest reader beside them.

A job-token holder opens a Session stream and writes without ever reading its answers:

- `grants`: it leases every partition of its job, then floods `get_tasks` messages that
  long-poll (MAX_GRANTS_IN_FLIGHT of them wait; each one past that bound was answered with a
  refusal text, queued without end on f44c545: +285 MB in 45 s);
- `refused`: messages of 5,000 reports on leases it does not hold (each answer listed all 5,000,
  queued without end: +286 MB in 30 s).

Meanwhile an honest reader (job `honest`, its own token) reads whole epochs of the same dataset;
every record id is counted. Printed: the master's RSS (VmRSS) before, at its peak and after the
attack streams were cancelled, the messages the master took from the attackers, and whether each
epoch of the honest reader delivered every record exactly once.

    python benchmarks/attack_stream.py                 # both attacks together, 60 s
    python benchmarks/attack_stream.py --seconds 15 --attacks refused --json out.json

The test (tests/security/test_stream_doors.py) imports Attack, RssWatch and rss_mb from here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from trainfeed.lease.client import MasterClient, tasks_request
from trainfeed.master.serve.service import MAX_WAIT_MS
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

ATTACKS = ("grants", "refused")
# What the issue measured: messages of this many refused reports each.
REFUSED_PER_MESSAGE = 5000
# The attacker's channel grows no receive window of its own (no BDP probing): what it does not
# read stays with the master, as with a client that reads nothing off its socket.
READ_NOTHING = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 0)]


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid` now (VmRSS), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status: is {pid} a live process?")


class RssWatch:
    """Samples a process's RSS every `period_s` on a thread: its peak since start. Context
    manager; the thread is joined on exit."""

    def __init__(self, pid: int, period_s: float = 0.05):
        self.pid, self.period_s = pid, period_s
        self.peak = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, rss_mb(self.pid))


class Attack:
    """A Session stream of job `job` that writes `kind` messages as fast as the master takes
    them and never reads an answer. `sent` counts the messages gRPC took from it (the master's
    flow control holds it back once the master stops reading). `cancel()` ends it; idempotent."""

    def __init__(self, address: str, token: str | None, job: str, dataset: str, kind: str):
        if kind not in ATTACKS:
            raise ValueError(f"unknown attack {kind!r}; expected one of {sorted(ATTACKS)}")
        self.kind, self.sent = kind, 0
        self._stop = threading.Event()
        self._client = MasterClient(address, token=token, give_up_s=10)
        worker = self._client.open_job(job, dataset, seed=0).worker_id
        self._message = self._first_message(job, worker)
        opening = pb.WatchRequest(job=job, worker_id=worker,
                                  session_secret=self._client.secret(job, worker))
        self._channel = grpc.insecure_channel(address, options=READ_NOTHING)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._call = master_pb2_grpc.MasterStub(self._channel).Session(
            self._messages(opening), metadata=metadata)

    def _first_message(self, job: str, worker: str) -> pb.SessionMessage:
        if self.kind == "grants":  # every partition its own, so that each get_tasks long-polls
            partitions = self._client.job_status(job).num_partitions
            mine = self._client.get_tasks(job, worker, 0, partitions, 0).tasks
            held = [(t.epoch, t.partition, t.lease) for t in mine]
            return pb.SessionMessage(seq=1, get_tasks=tasks_request(
                0, 1, MAX_WAIT_MS, [], held, 0, (), None, None))
        partitions = self._client.job_status(job).num_partitions
        return pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=[
            pb.TaskReport(epoch=0, partition=i % partitions, lease=i + 1,
                          outcome=pb.TaskReport.DONE) for i in range(REFUSED_PER_MESSAGE)]))

    def _messages(self, opening: pb.WatchRequest) -> Iterator[pb.SessionMessage]:
        yield pb.SessionMessage(open=opening)
        data = self._message.SerializeToString()
        while not self._stop.is_set():
            message = pb.SessionMessage.FromString(data)
            message.seq = self.sent + 1
            yield message
            self.sent += 1

    def cancel(self) -> None:
        self._stop.set()
        self._call.cancel()
        self._channel.close()
        self._client.close()


def honest_epochs(address: str, dataset: str, stop: threading.Event,
                  got: Counter[tuple[int, int]], at_least: int = 1) -> None:
    """An honest reader of job `honest`: whole epochs of `dataset`, each record id counted in
    `got` by (epoch, id), until `stop` is set (and `at_least` epochs are read)."""
    from trainfeed import MasterSource, dist

    reader = dist.reader(dataset, source=MasterSource(address, "honest", prefetch_partitions=2))
    try:
        epochs = 0
        while epochs < at_least or not stop.is_set():
            for batch in reader.column_batches(8):
                for record in batch["_id"].tolist():
                    got[(int(reader.epoch or 0), int(record))] += 1
            epochs += 1
    finally:
        reader.close()


def exactly_once(got: Counter[tuple[int, int]], records: int) -> bool:
    """Whether every epoch in `got` delivered each of `records` ids once."""
    epochs = {e for e, _ in got}
    return bool(epochs) and all(
        sorted(r for (ep, r) in got if ep == e) == list(range(records))
        and all(n == 1 for (ep, _), n in got.items() if ep == e) for e in epochs)


def run(a: argparse.Namespace) -> dict[str, Any]:
    from sample_data import make_image_list

    from trainfeed.master.serve.process import MasterProcess
    from trainfeed.security import job_token
    from trainfeed.upload import UploadOptions, upload

    master_token = "attack-stream-master-token-0123456789"
    with tempfile.TemporaryDirectory() as work:
        source = make_image_list(Path(work) / "source", a.records)
        storage = os.path.join(work, "storage")
        upload(str(source), "flowers", storage, UploadOptions(row_group_rows=4), progress=False)
        os.environ["TRAINFEED_TOKEN"] = job_token(master_token, "honest")
        with MasterProcess(storage, token=master_token) as master:
            pid = master.proc.pid
            time.sleep(1)
            before = rss_mb(pid)
            got: Counter[tuple[int, int]] = Counter()
            stop = threading.Event()
            attacks = [Attack(master.address, job_token(master_token, f"attack-{k}"),
                              f"attack-{k}", "flowers", k) for k in a.attacks]
            honest = threading.Thread(target=honest_epochs,
                                      args=(master.address, "flowers", stop, got), daemon=True)
            with RssWatch(pid) as watch:
                honest.start()
                time.sleep(a.seconds)
                stop.set()
                honest.join(120)
                for attack in attacks:
                    attack.cancel()
                time.sleep(2)
            after = rss_mb(pid)
    return {"machine": platform.node(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "records": a.records, "seconds": a.seconds, "attacks": list(a.attacks),
            "rss_before_mb": round(before, 1), "rss_peak_mb": round(watch.peak, 1),
            "rss_after_mb": round(after, 1),
            "messages_taken": {attack.kind: attack.sent for attack in attacks},
            "honest_epochs": len({e for e, _ in got}),
            "honest_exactly_once": exactly_once(got, a.records) and not honest.is_alive()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the attacks run")
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS),
                        help="which attack streams to open (each on a job of its own)")
    parser.add_argument("--records", type=int, default=64, help="records of the dataset")
    parser.add_argument("--json", help="also write the figures to this file")
    a = parser.parse_args()
    figures = run(a)
    print(f"{'attacks':<16} {'RSS before':>10} {'peak':>8} {'after':>8} {'taken':>18} "
          f"{'honest epochs':>14} {'exactly once':>13}")
    taken = ",".join(f"{k}={n}" for k, n in figures["messages_taken"].items())
    print(f"{'+'.join(figures['attacks']):<16} {figures['rss_before_mb']:>8.1f}MB "
          f"{figures['rss_peak_mb']:>6.1f}MB {figures['rss_after_mb']:>6.1f}MB {taken:>18} "
          f"{figures['honest_epochs']:>14} {str(figures['honest_exactly_once']):>13}")
    print(f"peak - before: {figures['rss_peak_mb'] - figures['rss_before_mb']:+.1f} MB; "
          f"after - before: {figures['rss_after_mb'] - figures['rss_before_mb']:+.1f} MB")
    if a.json:
        with open(a.json, "w") as out:
            json.dump(figures, out, indent=2)
    return 0 if figures["honest_exactly_once"] else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    sys.exit(main())
