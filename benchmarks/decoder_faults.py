"""Remote decode under faults and elasticity (issue 37): what a trainer sees while decoders die,
join and leave.

Real processes on loopback: a `trainfeed master` (with a token), `trainfeed decoder --master ADDR
--threads 1` processes that register with it, and a trainer (this process, its main thread)
reading ImageNet-like JPEGs (benchmarks/make_imagenet_like.py) through `dist.reader` with
`MasterSource` and `TRAINFEED_DECODE=remote` (no TRAINFEED_DECODERS: the decoders the master
lists), the train workload of benchmarks/remote_decode.py (224x224 uint8, RandomResizedCrop +
flip, batches of 64). Nothing is asserted: the figures are printed and written to --json.

1. **reference**: the same job through a master of its own with local decode (same seed): each
   record's pixels hashed (blake2b) by (epoch, id), and each batch's ids.
2. **faults**: three decoders; a supervisor thread SIGKILLs one (round robin) every --kill-every
   seconds and starts it again on its port, through --epochs epochs. Measured: records per
   epoch, duplicates and missing (every sample id counted), each record's hash and each batch
   against the reference, the trainer's errors (an exception, and its WARNING+ log lines), and
   the gaps between consecutive batches: the longest (the stall), their percentiles, and for each
   kill the gap it fell in and the longest gap in the --window seconds after it; with the times
   each restarted decoder took to listen and to be registered.
3. **elastic**: one decoder; a second is started once --join-at of epoch 0's batches came, and
   the first is stopped (SIGTERM, as a scale-down does) once --leave-at of epoch 1's came. For
   the one that joins: its start, listening, registration (its log line), the trainer's pool told
   it (the master's list), its first request and its first call answered, each from its start;
   and the records of both epochs against the reference.

Each phase records the machine's load: the busy cores of this process tree and the foreign load
(benchmarks/fairness.py), and the load average before and after.

    python benchmarks/decoder_faults.py --images 6000 --workdir /tmp/df --json decoder_faults.json

The trainer consumes as fast as batches come (no training step): every gap is the input
pipeline's, the worst case for a stall.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fairness import children_cpu_s, machine_busy_s  # noqa: E402 (benchmarks/ on the path)
from remote_decode import BATCH, IMAGE, TRAIN, make_storage  # noqa: E402

TOKEN = "decoder-faults-benchmark-token-0123"
JOB = "faults"
SEED = 7
DATASET = "imagenet"
REGISTERED = "registered with master"
WATCH_EVERY_S = 0.02  # how often the decoders' logs are read for their registration line


# --- the machine's load over a phase --------------------------------------------------------
def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@contextmanager
def load_meter(out: dict[str, Any]) -> Iterator[None]:
    """Fills `out` with the phase's wall seconds, this process tree's busy cores (this process
    and its children, every child waited for inside the block) and the foreign load (the
    machine's other busy cores), and the load average before and after."""
    out["load_avg_before"] = os.getloadavg()
    wall, machine, own = time.perf_counter(), machine_busy_s(), _self_cpu_s() + children_cpu_s()
    try:
        yield
    finally:
        wall = time.perf_counter() - wall
        machine = machine_busy_s() - machine
        own = _self_cpu_s() + children_cpu_s() - own
        out.update(wall_s=round(wall, 2), own_cores=round(own / wall, 2),
                   foreign_cores=round(max(0.0, machine - own) / wall, 2),
                   load_avg_after=os.getloadavg(), cpus=os.cpu_count())


# --- the trainer ------------------------------------------------------------------------------
def pipeline_options() -> Any:
    from trainfeed.reader.options import BatchOptions, DecodeOptions, PipelineOptions
    return PipelineOptions(decode=DecodeOptions(
        enabled=True, image_size=IMAGE, random_resized_crop=TRAIN["random_resized_crop"],
        random_flip=True), batch=BatchOptions(size=BATCH))


def set_decode(where: str) -> None:
    """This process's readers made from now on decode `where` ("local" or "remote", the
    decoders the master lists), with the job's token."""
    from trainfeed.security import job_token
    os.environ["TRAINFEED_DECODE"] = where
    os.environ.pop("TRAINFEED_DECODERS", None)
    os.environ.pop("TRAINFEED_TOKEN_FILE", None)
    os.environ["TRAINFEED_TOKEN"] = job_token(TOKEN, JOB)


class Problems(logging.Handler):
    """The trainer's WARNING and ERROR log lines (trainfeed's loggers), counted and kept."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:500])


@dataclass
class Trace:
    """What the trainer got: each batch's arrival (monotonic), epoch and ids; each record's
    hash by (epoch, id); the error that ended it, if any."""

    arrivals: list[float] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)
    hashes: dict[tuple[int, int], str] = field(default_factory=dict)
    counts: Counter[tuple[int, int]] = field(default_factory=Counter)
    pass_starts: list[float] = field(default_factory=list)
    error: str | None = None


def read_epochs(reader: Any, epochs: int, trace: Trace,
                on_batch: Callable[[int, int], None] = lambda epoch, n: None) -> None:
    """Reads `epochs` passes into `trace` (hashing every record's pixels); `on_batch(epoch,
    batches so far in it)` after each batch. An exception ends it, kept in trace.error."""
    try:
        for epoch in range(epochs):
            trace.pass_starts.append(time.monotonic())
            for n, batch in enumerate(reader(), 1):
                trace.arrivals.append(time.monotonic())
                trace.epochs.append(epoch)
                ids = [int(i) for i in batch["_id"]]
                trace.batches.append(ids)
                for i, image in zip(ids, batch["image"]):
                    trace.counts[(epoch, i)] += 1
                    trace.hashes[(epoch, i)] = hashlib.blake2b(
                        image.tobytes(), digest_size=16).hexdigest()
                on_batch(epoch, n)
    except Exception:
        trace.error = traceback.format_exc(limit=8)


def open_reader(master: str) -> Any:
    from trainfeed import MasterSource, dist
    return dist.reader(DATASET, source=MasterSource(master, JOB, seed=SEED),
                       pipeline=pipeline_options())


class PoolEvents:
    """The trainer's decoder pool, watched (the pool's methods wrapped for this process): when
    each address was first told by the master, first asked, first answered whole, and the calls
    cut off (a decoder died mid-call)."""

    def __init__(self) -> None:
        from trainfeed.decode.remote.client import DecoderPool
        self.told: dict[str, float] = {}
        self.asked: dict[str, float] = {}
        self.served: dict[str, float] = {}
        self.cut: list[tuple[float, str]] = []
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        take, give, listed = DecoderPool._take, DecoderPool._give, DecoderPool.listed_by_master
        events = self

        def _take(pool: Any) -> Any:
            chosen = take(pool)
            if chosen is not None:
                events._first(events.asked, chosen.address)
            return chosen

        def _give(pool: Any, decoder: Any, failed: bool, served: bool = False) -> None:
            give(pool, decoder, failed, served)
            with events._lock:
                events.calls[decoder.address] += 1
                if failed:
                    events.cut.append((time.monotonic(), decoder.address))
            if served:
                events._first(events.served, decoder.address)

        def listed_by_master(pool: Any, decoders: Sequence[tuple[str, float]]) -> None:
            listed(pool, decoders)
            for address, _ in decoders:
                events._first(events.told, address)

        DecoderPool._take = _take  # type: ignore[method-assign]
        DecoderPool._give = _give  # type: ignore[method-assign]
        DecoderPool.listed_by_master = listed_by_master  # type: ignore[method-assign]

    def _first(self, table: dict[str, float], address: str) -> None:
        now = time.monotonic()
        with self._lock:
            table.setdefault(address, now)

    def reset(self) -> None:
        """A new phase: nothing seen yet (ports may be used again)."""
        with self._lock:
            for table in (self.told, self.asked, self.served):
                table.clear()
            self.cut.clear()
            self.calls.clear()


# --- decoders -------------------------------------------------------------------------------
@dataclass
class Started:
    """One decoder process's life: its start, listening, registration (monotonic)."""

    address: str
    started: float
    listening: float
    registered: float | None = None
    killed: float | None = None
    proc: Any = None


class Decoders:
    """The decoder processes of a phase, each registered with `master`; a watcher thread stamps
    each one's registration line as it appears."""

    def __init__(self, storage: str, master: str):
        self.storage = storage
        self.master = master
        self.lives: list[Started] = []
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watching, daemon=True)
        self._watch.start()

    def start(self, port: int = 0, nice: int = 0) -> Started:
        """A decoder on `port` (0: a free one), at `nice` (0: this process's priority)."""
        from trainfeed.decoder.process import DecoderProcess
        began = time.monotonic()
        proc = DecoderProcess(self.storage, TOKEN, port=port, threads=1, master=self.master,
                              prefix=["nice", "-n", str(nice)] if nice else ())
        life = Started(proc.address, began, time.monotonic(), proc=proc)
        self.lives.append(life)
        return life

    def wait_registered(self, life: Started, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while life.registered is None:
            if time.monotonic() > deadline or life.proc.proc.poll() is not None:
                raise RuntimeError(f"decoder {life.address} not registered:\n"
                                   + "".join(life.proc.log[-20:]))
            time.sleep(WATCH_EVERY_S)

    def _watching(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            for life in list(self.lives):
                if life.registered is None and any(REGISTERED in line
                                                   for line in life.proc.log):
                    life.registered = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._watch.join(5)
        for life in self.lives:
            life.proc.stop()


class Killer:
    """Every `every_s`, on schedule: SIGKILLs the next live decoder (round robin) and starts it
    again on its port in the background (at `nice`: see --restart-nice), so that a slow restart
    never delays the next kill (two may be down at once)."""

    def __init__(self, decoders: Decoders, live: list[Started], every_s: float, nice: int = 0):
        self.decoders = decoders
        self.nice = nice
        self.live = live
        self.every_s = every_s
        self.kills: list[Started] = []  # the lives killed, in order
        self.errors: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._restarts: list[threading.Thread] = []

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        began, n = time.monotonic(), 0
        while not self._done.wait(max(0.0, began + (n + 1) * self.every_s - time.monotonic())):
            up = [k for k in range(len(self.live)) if self.live[k].killed is None]
            if not up:
                continue
            k = min(up, key=lambda i: (i - n) % len(self.live))  # the next one round robin
            n += 1
            old = self.live[k]
            old.killed = time.monotonic()
            old.proc.kill()
            self.kills.append(old)
            restart = threading.Thread(target=self._restart, args=(k, old), daemon=True)
            restart.start()
            self._restarts.append(restart)

    def _restart(self, k: int, old: Started) -> None:
        try:
            self.live[k] = self.decoders.start(port=old.proc.port, nice=self.nice)
        except RuntimeError as e:  # the port not free again yet: another one
            self.errors.append(f"restart on {old.address}: {e}"[:300])
            self.live[k] = self.decoders.start(nice=self.nice)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(60)
        for restart in self._restarts:
            restart.join(60)


# --- figures --------------------------------------------------------------------------------
def gaps(trace: Trace) -> list[tuple[float, float, int]]:
    """(start, end, epoch) of every wait for a batch: from the previous batch (from the first
    pass's start for the very first)."""
    starts = [trace.pass_starts[0], *trace.arrivals[:-1]] if trace.arrivals else []
    return list(zip(starts, trace.arrivals, trace.epochs))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def gap_figures(trace: Trace, t0: float) -> dict[str, Any]:
    """The longest wait for a batch (the stall) within an epoch, where it was, and the
    distribution; the waits at each epoch's start apart (the first includes the reader's
    start: its connection, the first partition's decoders)."""
    all_gaps = gaps(trace)
    firsts = {i for i, (_, _, e) in enumerate(all_gaps) if i == 0 or all_gaps[i - 1][2] != e}
    within = [g for i, g in enumerate(all_gaps) if i not in firsts]
    lengths = [end - start for start, end, _ in within]
    longest = max(within, key=lambda g: g[1] - g[0], default=(0.0, 0.0, 0))
    return {
        "batches": len(all_gaps),
        "longest_s": round(longest[1] - longest[0], 3),
        "longest_at_s": round(longest[0] - t0, 2),
        "median_s": round(statistics.median(lengths), 4) if lengths else None,
        "p90_s": round(percentile(lengths, 0.90), 4),
        "p99_s": round(percentile(lengths, 0.99), 4),
        "over_1s": sum(g > 1 for g in lengths),
        "over_2s": sum(g > 2 for g in lengths),
        "epoch_starts_s": [round(all_gaps[i][1] - all_gaps[i][0], 3) for i in sorted(firsts)]}


def around(trace: Trace, moment: float, window_s: float) -> dict[str, Any]:
    """The wait for a batch that `moment` fell in, the longest wait ending in the `window_s`
    after it, and the batches that came in that window."""
    waits = gaps(trace)
    spanning = next((end - start for start, end, _ in waits if start <= moment < end), 0.0)
    after = [(end - start) for start, end, _ in waits if moment < end <= moment + window_s]
    return {"wait_spanning_s": round(spanning, 3),
            "longest_after_s": round(max(after, default=0.0), 3),
            "batches_after": len(after)}


def delivery(trace: Trace, reference: Trace, epochs: int, records: int) -> dict[str, Any]:
    """Records per epoch, duplicates, missing, invented, and byte identity against the
    reference: each record's hash, and each batch (its ids, in order) at the same place."""
    per_epoch = [sum(1 for (e, _) in trace.counts if e == epoch) for epoch in range(epochs)]
    want = {key for key in reference.hashes if key[0] < epochs}
    got = set(trace.counts)
    same_batch = sum(1 for a, b in zip(trace.batches, reference.batches) if a == b)
    return {
        "records_per_epoch": per_epoch,
        "dataset_records": records,
        "duplicates": sum(c - 1 for c in trace.counts.values() if c > 1),
        "missing": len(want - got),
        "not_in_reference": len(got - want),
        "hash_mismatches": sum(1 for key in got & want
                               if trace.hashes[key] != reference.hashes[key]),
        "records_compared": len(got & want),
        "batches": len(trace.batches),
        "reference_batches": sum(1 for e in reference.epochs if e < epochs),
        "batches_same_ids_in_order": same_batch}


def life_figures(life: Started, t0: float) -> dict[str, Any]:
    return {"address": life.address, "started_at_s": round(life.started - t0, 2),
            "listening_after_s": round(life.listening - life.started, 2),
            "registered_after_s": (round(life.registered - life.started, 2)
                                   if life.registered is not None else None)}


# --- the phases -------------------------------------------------------------------------------
def reference_run(storage: str, epochs: int) -> tuple[Trace, dict[str, Any]]:
    from trainfeed.master.serve.process import MasterProcess
    set_decode("local")
    trace, load = Trace(), {}
    with load_meter(load), MasterProcess(storage, token=TOKEN) as master:
        reader = open_reader(master.address)
        try:
            read_epochs(reader, epochs, trace)
        finally:
            reader.close()
    load["images_per_s"] = round(len(trace.hashes) / load["wall_s"], 1)
    return trace, load


def faults_run(storage: str, epochs: int, reference: Trace, records: int, every_s: float,
               window_s: float, events: PoolEvents, problems: Problems, nice: int = 0
               ) -> dict[str, Any]:
    from trainfeed.master.serve.process import MasterProcess
    set_decode("remote")
    trace, load = Trace(), {}
    problems.lines.clear()
    with load_meter(load), MasterProcess(storage, token=TOKEN) as master:
        decoders = Decoders(storage, master.address)
        try:
            live = [decoders.start() for _ in range(3)]
            for life in live:
                decoders.wait_registered(life)
            killer = Killer(decoders, live, every_s, nice)
            reader = open_reader(master.address)
            t0 = time.monotonic()
            killer.start()
            try:
                read_epochs(reader, epochs, trace)
            finally:
                killer.stop()
                reader.close()
        finally:
            decoders.close()
    restarted = decoders.lives[3:]
    return {
        "load": load, "kill_every_s": every_s, "restart_nice": nice,
        "kill_intervals_s": [round(b.killed - a.killed, 2) for a, b in
                             zip(killer.kills, killer.kills[1:])
                             if a.killed is not None and b.killed is not None],
        "kills": len(killer.kills),
        "restart_errors": killer.errors,
        "delivery": delivery(trace, reference, epochs, records),
        "trainer_error": trace.error, "trainer_warnings": problems.lines[:40],
        "trainer_warning_count": len(problems.lines),
        "calls_cut_off": len(events.cut),
        "gaps": gap_figures(trace, t0),
        "around_kills": [{"killed_at_s": round(life.killed - t0, 2), "address": life.address,
                          **around(trace, life.killed, window_s)}
                         for life in killer.kills if life.killed is not None],
        "restarts": [life_figures(life, t0) for life in restarted],
        # (raw, for a closer look: seconds from the first pass's start)
        "timeline": {"arrivals": [round(t - t0, 3) for t in trace.arrivals],
                     "cuts": [(round(t - t0, 3), a) for t, a in events.cut],
                     "registered": [(round(life.registered - t0, 3), life.address)
                                    for life in decoders.lives if life.registered]},
        "images_per_s": round(len(trace.hashes) / max(1e-9, trace.arrivals[-1] - t0), 1)
        if trace.arrivals else 0.0}


def elastic_run(storage: str, reference: Trace, records: int, join_at: float, leave_at: float,
                events: PoolEvents, problems: Problems) -> dict[str, Any]:
    from trainfeed.master.serve.process import MasterProcess
    set_decode("remote")
    trace, load = Trace(), {}
    problems.lines.clear()
    per_epoch = -(-records // BATCH)
    joined: list[Started] = []
    left: list[float] = []

    def in_background(work: Callable[[], object]) -> None:  # (the trainer's loop never waits)
        threading.Thread(target=work, daemon=True).start()
    with load_meter(load), MasterProcess(storage, token=TOKEN) as master:
        decoders = Decoders(storage, master.address)
        try:
            first = decoders.start()
            decoders.wait_registered(first)

            def on_batch(epoch: int, n: int) -> None:
                if epoch == 0 and n == max(1, int(join_at * per_epoch)):
                    in_background(lambda: joined.append(decoders.start()))
                if epoch == 1 and n == max(1, int(leave_at * per_epoch)):
                    left.append(time.monotonic())
                    in_background(first.proc.stop)  # SIGTERM: what a scale-down sends
            reader = open_reader(master.address)
            t0 = time.monotonic()
            try:
                read_epochs(reader, 2, trace, on_batch)
            finally:
                reader.close()
        finally:
            decoders.close()
    out: dict[str, Any] = {"load": load, "delivery": delivery(trace, reference, 2, records),
                           "trainer_error": trace.error,
                           "trainer_warnings": problems.lines[:40],
                           "trainer_warning_count": len(problems.lines),
                           "calls_cut_off": len(events.cut), "gaps": gap_figures(trace, t0),
                           "calls": dict(events.calls)}
    if joined:
        out["joined"] = {**life_figures(joined[0], t0), **_firsts(joined[0], events)}
    if left:
        out["left"] = {"address": first.address, "stopped_at_s": round(left[0] - t0, 2),
                       **around(trace, left[0], 3.0)}
    return out


def _firsts(life: Started, events: PoolEvents) -> dict[str, Any]:
    """The joiner's firsts at the trainer, from its start and from its registration."""
    out: dict[str, Any] = {}
    for name, table in (("told", events.told), ("first_asked", events.asked),
                        ("first_served", events.served)):
        at = table.get(life.address)
        out[f"{name}_after_start_s"] = round(at - life.started, 3) if at else None
        out[f"{name}_after_registered_s"] = (round(at - life.registered, 3)
                                             if at and life.registered else None)
    return out


# --- the command ------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=6000, help="ImageNet-like JPEGs (default 6000)")
    p.add_argument("--workdir", required=True,
                   help="where the images and the dataset go (kept for the next run)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the faults run (default 3)")
    p.add_argument("--kill-every", type=float, default=5.0,
                   help="seconds between SIGKILLs (default 5)")
    p.add_argument("--window", type=float, default=3.0,
                   help="seconds after each kill whose waits are reported (default 3)")
    p.add_argument("--join-at", type=float, default=0.4,
                   help="share of epoch 0's batches after which a decoder joins (default 0.4)")
    p.add_argument("--leave-at", type=float, default=0.4,
                   help="share of epoch 1's batches after which the first decoder is stopped "
                        "(default 0.4)")
    p.add_argument("--restart-nice", type=int, default=0, metavar="N",
                   help="restart killed decoders at this nice level (default 0): on a machine "
                        "of few cores a restart's start (Python, its imports) takes the cores "
                        "the surviving decoders decode on, which in a cluster it would not")
    p.add_argument("--only", choices=["faults", "elastic"], help="run one phase (and the "
                                                                 "reference)")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def print_report(report: dict[str, Any]) -> None:
    ref = report["reference"]
    print(f"reference (local decode): {ref['images_per_s']} images/s; load: own "
          f"{ref['own_cores']} cores, foreign {ref['foreign_cores']}, load avg "
          f"{ref['load_avg_before'][0]:.1f} -> {ref['load_avg_after'][0]:.1f}")
    for name in ("faults", "elastic"):
        if name not in report:
            continue
        r = report[name]
        d, g, load = r["delivery"], r["gaps"], r["load"]
        print(f"\n{name}: records per epoch {d['records_per_epoch']} of {d['dataset_records']}"
              f", duplicates {d['duplicates']}, missing {d['missing']}, hash mismatches "
              f"{d['hash_mismatches']} of {d['records_compared']}, batches equal to the "
              f"reference's {d['batches_same_ids_in_order']}/{d['batches']}, trainer error: "
              f"{'none' if r['trainer_error'] is None else r['trainer_error']}, warnings "
              f"{r['trainer_warning_count']}, calls cut off {r['calls_cut_off']}")
        print(f"  waits for a batch: longest {g['longest_s']} s (at {g['longest_at_s']} s), "
              f"median {g['median_s']}, p90 {g['p90_s']}, p99 {g['p99_s']}, over 1 s "
              f"{g['over_1s']}, over 2 s {g['over_2s']}; epoch starts {g['epoch_starts_s']}")
        print(f"  load: {load['wall_s']} s, own {load['own_cores']} cores, foreign "
              f"{load['foreign_cores']} of {load['cpus']}, load avg "
              f"{load['load_avg_before'][0]:.1f} -> {load['load_avg_after'][0]:.1f}")
        for k in r.get("around_kills", []):
            print(f"  kill at {k['killed_at_s']} s ({k['address']}): wait spanning it "
                  f"{k['wait_spanning_s']} s, longest in the next {report['window_s']} s "
                  f"{k['longest_after_s']} s ({k['batches_after']} batches)")
        for life in r.get("restarts", []):
            print(f"  restarted {life['address']}: listening after {life['listening_after_s']}"
                  f" s, registered after {life['registered_after_s']} s")
        if "joined" in r:
            print(f"  joined: {r['joined']}")
        if "left" in r:
            print(f"  left: {r['left']}")


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    problems = Problems()
    logging.getLogger("trainfeed").addHandler(problems)
    storage = make_storage(a.images, a.workdir)
    from trainfeed.formats.manifest import read_manifest
    from trainfeed.storage import open_storage
    records = read_manifest(open_storage(storage), DATASET).num_records
    epochs = max(a.epochs, 2)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": {"images": a.images, "records": records, "image": IMAGE, "batch": BATCH,
                     "workload": TRAIN, "epochs": a.epochs, "decoder_threads": 1},
        "window_s": a.window, "command": " ".join(sys.argv)}
    reference, report["reference"] = reference_run(storage, epochs)
    events = PoolEvents()
    if a.only in (None, "faults"):
        report["faults"] = faults_run(storage, a.epochs, reference, records, a.kill_every,
                                      a.window, events, problems, a.restart_nice)
    if a.only in (None, "elastic"):
        events.reset()
        report["elastic"] = elastic_run(storage, reference, records, a.join_at, a.leave_at,
                                        events, problems)
    print_report(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
