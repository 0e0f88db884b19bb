"""Fleet simulator (issue 28): N readers on one real master, only the payload reads simulated.

What it measures: a master process (`trainfeed master`, any state store) serving N simulated
readers, spread as threads over `--processes` client processes so that 1,000 fit on a small
machine. Each reader speaks the one conversation of trainfeed's readers (protocol 3): OpenJob
through trainfeed.lease.client.MasterClient, then everything on its one Session stream, which it
keeps in a trainfeed.lease.transport.Transport, the real reader's own: its requests for tasks
(`tasks_request` as `get_tasks` messages, answered by WatchEvent.grant), its heartbeats and
reports (answered), matched to their answers by seq; what the master pushes (give-backs,
revocations, epoch ends) comes on it. A broken stream is reopened with the Transport's backoff
(full jitter, RETRY_MIN_S to RETRY_MAX_S) and what went unanswered is sent again on the new one;
there is no other dialect. Readers start once their stream is up; LeaveJob ends a session.
What a reader "reads" is time: it consumes a partition's records at its own rate (records/s),
so the load on the master is the protocol's and nothing else's. Readers come in kinds: `slow`
and `fast` (a share of them, at a factor of the base rate) and `dying` (they stop dead, without
LeaveJob, part way through the first epoch: their leases expire and go to others).

It reports, over the run:
- master CPU (cores, from /proc of the master's pid), per reader-second and per partition read;
- Session messages/s sent by the readers (heartbeats, reports, `get_tasks`) and per
  reader-second, and how many grants came, were refused, or went unanswered (asked again);
- Session streams opened (one per reader unless one broke) and unary calls/s by method (the
  master's own metrics, trainfeed_rpc_duration_seconds_count: OpenJob, LeaveJob);
- grant latency p50/p99 (`get_tasks` asked with work in hand, wait_ms=0, that got tasks: from
  the message sent to its answer received);
- per-reader starvation: time with nothing to read while its epoch still had work (waits that
  ended with tasks; the wait at an epoch's tail that ends with EPOCH_DONE is counted apart);
- stealing traffic: give-backs received, partitions released;
- records missing and duplicated per epoch (every record a reader consumed is counted; a dying
  reader's records after its last reported progress died with its trainer and are not).
With `--sync` the readers are the ranks of one synchronous group (world size N): it also reports
the steps per rank (they must be equal) and how long after the last rank finished an epoch the
last rank started the next.

The simulated reader's bookkeeping (`SimReader`) is small and written here, on top of the
Transport: trainfeed.lease.book.LeaseBook speaks in TaskRefs and reports of a real trainer's
progress, more than a reader that only counts records needs; the simulator keeps the same rules
where they matter (a synchronous rank's cut listed as held until its RELEASED is answered, then
read to its kept end with no DONE; leases begun never given back).

Run from the repository root:

    python benchmarks/fleet.py --readers 1000 --processes 4 --partitions 5000 --records 600 \\
        --rate 3000 --epochs 1
    python benchmarks/fleet.py --readers 1000 --rate 10 --records 600 --duration 60   # idle
    python benchmarks/fleet.py --readers 256 --sync --batch 4 --records 100 --rate 400
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from proc_stats import process_cpu_s, rpc_counts
from stop_cleanly import exit_cleanly_on_signals

import trainfeed
from trainfeed.errors import JobError, MasterUnavailableError
from trainfeed.formats.manifest import FieldSpec, Manifest, RowGroupInfo, ShardInfo, write_manifest
from trainfeed.lease.client import CALL_TIMEOUT_S, MasterClient, session_message, tasks_request
from trainfeed.lease.session import ANSWER_TIMEOUT_S, REFUSED_RETRY_S
from trainfeed.lease.transport import Transport
from trainfeed.master.serve.process import MasterProcess
from trainfeed.planning.order import epoch_order
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb

DEFAULT_ROOT = os.path.join(tempfile.gettempdir(), "trainfeed-bench")
JOB = "fleet"
# A long-poll of a reader with nothing to read (the master caps it at 5 s).
LONG_POLL_MS = 5000
ROW_GROUPS_PER_SHARD = 1000


@dataclass(frozen=True)
class FleetOptions:
    """One simulated fleet. Validated on creation."""

    readers: int = 200
    processes: int = 2
    partitions: int = 400
    records: int = 100  # per partition
    rate: float = 200.0  # records/s of a normal reader
    slow_share: float = 0.1
    slow_factor: float = 0.25
    fast_share: float = 0.1
    fast_factor: float = 4.0
    dying_share: float = 0.02
    epochs: int = 1
    duration_s: float = 0.0  # > 0: stop after this long instead (idle runs)
    window_after_s: float = 0.0  # measure from this long after the start (sessions opened)
    # Leases held (the one being read included); a reader asks again once half are read, so a
    # deep reader leases several per call.
    depth: int = 2
    lease_timeout_s: float = 30.0
    # > 0: each reader cancels its Session stream about this often (a network that drops
    # connections): the Transport reopens it with its backoff and sends again what went
    # unanswered, and every record must still be delivered once.
    break_every_s: float = 0.0
    sync: bool = False
    batch: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.readers < 1 or self.processes < 1 or self.partitions < 1 or self.records < 1:
            raise ValueError(f"readers, processes, partitions and records must be ≥ 1: {self}")
        if self.break_every_s < 0:
            raise ValueError(f"break_every_s must be ≥ 0 (0: never), got {self.break_every_s}")
        if self.rate <= 0 or self.depth < 1:
            raise ValueError(f"rate must be > 0 and depth ≥ 1, got {self.rate}, {self.depth}")
        if self.slow_share + self.fast_share + self.dying_share > 1:
            raise ValueError("slow, fast and dying shares add up to more than 1")

    def kind(self, index: int) -> str:
        """Reader `index`'s kind, spread evenly over the indices (so over the processes)."""
        r = random.Random(self.seed * 1_000_003 + index).random()
        if r < self.dying_share and not self.sync:
            return "dying"
        if r < self.dying_share + self.slow_share:
            return "slow"
        if r < self.dying_share + self.slow_share + self.fast_share:
            return "fast"
        return "normal"

    def rate_of(self, kind: str) -> float:
        return self.rate * {"slow": self.slow_factor, "fast": self.fast_factor}.get(kind, 1.0)


@dataclass
class ReaderStats:
    """What one simulated reader saw (merged by the parent)."""

    kind: str = ""
    calls: Counter[str] = field(default_factory=Counter)
    grant_ms: list[float] = field(default_factory=list)
    starved_s: float = 0.0  # waits that ended with tasks
    max_starved_s: float = 0.0
    tail_s: float = 0.0  # waits that ended with EPOCH_DONE
    give_backs: int = 0
    released: int = 0
    revoked: int = 0
    events: int = 0
    stream_messages: int = 0  # heartbeats, reports and get_tasks sent on the Session stream
    answers: int = 0  # the master's answers to heartbeats (grants apart)
    unanswered: int = 0  # heartbeats sent again on a new stream (it broke, or no answer came)
    sent_at: list[float] = field(default_factory=list)  # when each message went (monotonic)
    grants_on_stream: int = 0  # get_tasks answered with a grant
    grants_refused: int = 0  # refused (then asked again)
    grants_unanswered: int = 0  # no answer (timed out or the stream broke: asked again)
    streams_opened: int = 0  # Session streams this reader opened (1 unless one broke)
    breaks: int = 0  # streams it cancelled itself (`break_every_s`)
    # epoch -> partition -> [(first, stop)] record ranges consumed
    ranges: dict[int, dict[int, list[tuple[int, int]]]] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)  # epoch -> records consumed
    # Ranges of a reader that gave up whose DONE went unanswered (see `_unconsume`).
    uncertain: dict[int, dict[int, list[tuple[int, int]]]] = field(default_factory=dict)
    done_at: list[float] = field(default_factory=list)  # when each partition was read (monotonic)
    finished: dict[int, float] = field(default_factory=dict)  # epoch -> when its last record
    started: dict[int, float] = field(default_factory=dict)  # epoch -> when its first record
    errors: list[str] = field(default_factory=list)


@dataclass
class _Lease:
    epoch: int
    partition: int
    lease: int
    skip: int
    end: int  # records of the partition this reader delivers: [skip, end)
    # A synchronous rank's cut: the rest went back with a RELEASED at `end` (as LeaseBook.cut),
    # so the kept part ends with no DONE (the master refuses one: the lease is no longer held).
    cut: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.epoch, self.partition, self.lease)


class SimReader:
    """One reader: the lease protocol as trainfeed's reader session speaks it, consumption
    simulated.

    Per epoch: keep `depth` leases in hand (the one being read and those ahead, unstarted);
    reports ride on the next `get_tasks` message; a heartbeat (answered) goes every
    lease_timeout/3 if no other message went, and at once on a reopened stream; reports that
    cannot wait go alone, as a heartbeat. Everything goes on the reader's one Session stream, a
    trainfeed.lease.transport.Transport (the reader's own: answers matched by seq, a broken
    stream reopened with its backoff, a message whose answer was lost sent again on the next
    stream); what the master pushes (give-backs, revocations, epoch ends) comes on it too.
    """

    def __init__(self, client: MasterClient, cfg: FleetOptions, dataset: str, index: int,
                 go: threading.Event):
        self.client, self.cfg, self.dataset, self.index = client, cfg, dataset, index
        self.kind = cfg.kind(index)
        self.rate = cfg.rate_of(self.kind)
        self.stats = ReaderStats(kind=self.kind)
        self.go = go  # set once every reader of the fleet has opened its session
        self.opened = threading.Event()
        self.deadline = float("inf")
        self.worker = ""
        self.cond = threading.Condition()
        # Pushed events, and the answers to messages sent on the reader's own (applied by the
        # reading loop, as events are).
        self.inbox: list[pb.WatchEvent] = []
        self.transport = Transport(client, self.cond, self.deliver, self._broke)
        self.resync = False  # the stream broke: a heartbeat goes at once on the next one
        # When (after the start) a dying reader dies: within its first epoch's share.
        self.dies_after = (random.Random(index).uniform(0.2, 0.8)
                           * cfg.partitions * cfg.records / cfg.readers / self.rate
                           if self.kind == "dying" else float("inf"))
        self.dies_at = float("inf")
        self.breaks_at = float("inf")  # when it next cancels its stream (`break_every_s`)
        self.rng = random.Random(cfg.seed * 1_000_003 + index + 1)
        # The epoch being read and its DONE reports not yet acknowledged (see `_unconsume`).
        self.epoch = 0
        self.unsent: list[pb.TaskReport] = []
        self.current: _Lease | None = None  # the lease being read
        self.sync = (pb.SyncGroup(world_size=cfg.readers, rank=index, batch_size=cfg.batch)
                     if cfg.sync else None)

    # -- the session --------------------------------------------------------------------------
    def run(self) -> ReaderStats:
        try:
            opened = self.client.open_job(JOB, self.dataset, self.cfg.seed, sync=self.sync)
            self.stats.calls["OpenJob"] += 1
            self.worker = opened.worker_id
            self.transport.start(JOB, self.worker)
            self.transport.wait_up()  # its stream up (its first event) before the fleet starts
            self.opened.set()
            self.go.wait()
            start = time.monotonic()
            self.deadline = start + (self.cfg.duration_s or float("inf"))
            self.dies_at = start + self.dies_after
            self._next_break(start)
            epoch = opened.current_epoch
            for _ in range(self.cfg.epochs):
                if not self.read_epoch(epoch):
                    break
                epoch += 1
            if self.kind != "dying" or time.monotonic() < self.dies_at:
                self.client.leave_job(JOB, self.worker)
                self.stats.calls["LeaveJob"] += 1
        except (JobError, MasterUnavailableError) as e:
            self.stats.errors.append(f"reader {self.index}: {e}")
            # Gave up: the last message's reports may or may not have counted (its answer was
            # lost), so their records are neither missing nor duplicated: uncertain.
            self._unconsume(self.epoch, self.unsent, uncertain=True)
        finally:
            self.opened.set()
            self.transport.close()
            self.stats.streams_opened = self.transport.opened
        return self.stats

    def read_epoch(self, epoch: int) -> bool:
        """Reads `epoch` to its end; False if this reader died or must stop."""
        ahead: deque[_Lease] = deque()
        current: _Lease | None = None
        began = 0.0  # when the current partition's first record was consumed
        reports: list[pb.TaskReport] = []
        todo_left, last_sent, idle_since = 1, time.monotonic(), None
        quota = self._quota(epoch)  # sync: records this rank still takes
        self.epoch = epoch
        while True:
            self.unsent, self.current = reports, current
            now = time.monotonic()
            if now >= self.dies_at or now >= self.deadline:
                if now >= self.dies_at:  # what the master did not hear of died with the trainer
                    self._unconsume(epoch, reports)
                return False
            if current is not None and now >= began + (current.end - current.skip) / self.rate:
                self._consumed(epoch, current, current.skip, current.end)
                self.stats.finished[epoch] = now
                self.stats.done_at.append(now)
                if not current.cut:
                    reports.append(pb.TaskReport(epoch=epoch, partition=current.partition,
                                                 outcome=pb.TaskReport.DONE, lease=current.lease))
                current = None
            if current is None and ahead:
                current, began = ahead.popleft(), now
                self.current = current
                self.stats.started.setdefault(epoch, now)
            self._maybe_break(now)
            held = ([current] if current else []) + list(ahead)
            stop = self._events(ahead, reports)
            if stop:
                return False
            if quota is not None and quota <= 0 and current is None and not ahead:
                self._flush(reports, held)
                return True  # a rank's quota is read: the next epoch starts when all are
            want = self.cfg.depth - len(held)
            refill = want >= max(1, self.cfg.depth // 2) and todo_left > 0
            if (not held or refill) and (quota is None or quota > 0):
                idle = not held
                if idle and idle_since is None:
                    idle_since = now
                answer = self._get_tasks(epoch, want, 0 if held else LONG_POLL_MS, reports,
                                         held, current, quota)
                last_sent = time.monotonic()
                reports = []
                # WAIT with work in hand: what todo holds is reserved for others; ask again
                # once this reader has nothing (a long-poll), not in a loop.
                todo_left = answer.todo_left if answer.status != pb.GetTasksResponse.WAIT else 0
                self._answered(answer, ahead, reports)
                if answer.status == pb.GetTasksResponse.EPOCH_DONE:
                    if idle_since is not None:
                        self.stats.tail_s += last_sent - idle_since
                    return True
                quota = self._take(answer.tasks, quota, current, ahead)
                if answer.tasks and idle_since is not None:
                    waited = last_sent - idle_since
                    self.stats.starved_s += waited
                    self.stats.max_starved_s = max(self.stats.max_starved_s, waited)
                    idle_since = None
                continue
            due = last_sent + self.cfg.lease_timeout_s / 3
            if reports and (todo_left == 0 or len(reports) >= self.cfg.depth) or self.resync:
                due = now  # at an epoch's tail the others wait for these reports
            if now >= due:
                sent, reports = reports, []
                self._post(sent, held, current)
                last_sent = time.monotonic()
                continue
            wake = due if current is None else min(due, began + (current.end - current.skip)
                                                   / self.rate)
            with self.cond:
                if not self.inbox:
                    self.cond.wait(max(0.0, min(wake, self.dies_at, self.deadline,
                                                self.breaks_at) - now))

    def _maybe_break(self, now: float) -> None:
        """`break_every_s`: cancels the stream when due (the Transport reopens it)."""
        if now >= self.breaks_at:
            self.stats.breaks += 1
            self.transport.reconnect()
            self._next_break(now)

    def _next_break(self, now: float) -> None:
        if self.cfg.break_every_s:
            self.breaks_at = now + self.cfg.break_every_s * self.rng.uniform(0.5, 1.5)

    def _quota(self, epoch: int) -> int | None:
        if not self.cfg.sync:
            return None
        total = self.cfg.partitions * self.cfg.records
        return total // (self.cfg.readers * self.cfg.batch) * self.cfg.batch

    def _lease(self, task: pb.Task, quota: int | None) -> _Lease:
        end = task.stop_records or task.num_records
        lease = _Lease(task.epoch, task.partition, task.lease, task.skip_records, end)
        if quota is not None and end - lease.skip > quota:  # a rank keeps its quota's part
            lease.end, lease.cut = lease.skip + max(0, quota), True
        return lease

    def _take(self, tasks: Sequence[pb.Task], quota: int | None, current: _Lease | None,
              ahead: deque[_Lease]) -> int | None:
        """Queues the leases granted; returns the quota left. A synchronous rank's cut ones
        hand their rest back at once (another rank waits for it)."""
        cuts = []
        for task in tasks:
            lease = self._lease(task, quota)
            if quota is not None:
                quota -= lease.end - lease.skip
            ahead.append(lease)
            if lease.cut:
                cuts.append(lease)
        if cuts:
            self._cut(cuts, current, ahead)
        return quota

    def _cut(self, cuts: list[_Lease], current: _Lease | None, ahead: deque[_Lease]) -> None:
        """A synchronous rank's cut leases: the rest of each goes back with a RELEASED at the
        count it keeps, the lease listed as held until the master answered (as LeaseBook.keep
        and its `releasing`); it keeps reading the kept part, with no DONE."""
        held = ([current] if current else []) + list(ahead)
        self._post([pb.TaskReport(epoch=x.epoch, partition=x.partition,
                                  outcome=pb.TaskReport.RELEASED, lease=x.lease, consumed=x.end)
                    for x in cuts], held, current, releasing=True)

    # -- what the master tells it -------------------------------------------------------------
    def _events(self, ahead: deque[_Lease], reports: list[pb.TaskReport]) -> bool:
        """Applies the events pushed and the answers received; True if the reader must stop."""
        with self.cond:
            events, self.inbox = self.inbox, []
        stop = False
        for event in events:
            if not event.answers:
                self.stats.events += 1
            self._answered(event, ahead, reports)
            stop = stop or bool(event.group_broken or event.superseded)
        return stop

    def _answered(self, answer: Any, ahead: deque[_Lease], reports: list[pb.TaskReport]
                  ) -> None:
        """Applies what an answer or an event says of this reader's leases: revoked ones are
        dropped, asked ones not started are handed back at once (the thief waits for them)."""
        self._drop(answer.revoked, ahead)
        kept = self._give_back(answer.give_back, ahead, reports)
        sent = [r for r in reports if r.outcome == pb.TaskReport.RELEASED]
        if sent or kept:  # (kept: asks for leases begun: listing them started voids the asks,
            # and the thief, woken, asks elsewhere at once rather than after ASK_AGAIN_S)
            reports[:] = [r for r in reports if r.outcome != pb.TaskReport.RELEASED]
            held = ([self.current] if self.current else []) + list(ahead)
            self._post(sent, held, self.current)

    def _drop(self, revoked: Sequence[pb.HeldTask], ahead: deque[_Lease]) -> None:
        gone = {(t.epoch, t.partition, t.lease) for t in revoked}
        if gone:
            self.stats.revoked += len(gone)
            # (a cut lease is not the rank's since its RELEASED: its kept part is still read)
            for lease in [x for x in ahead if x.key in gone and not x.cut]:
                ahead.remove(lease)

    def _give_back(self, asked: Sequence[pb.HeldTask], ahead: deque[_Lease],
                   reports: list[pb.TaskReport]) -> bool:
        """Hands back the asked leases not started (all of `ahead` is unstarted); returns
        whether it keeps some asked lease because it began it."""
        keys = {(t.epoch, t.partition, t.lease) for t in asked}
        self.stats.give_backs += len(keys)
        back = [x for x in ahead if x.key in keys and not x.cut]
        for lease in back:
            ahead.remove(lease)
            reports.append(pb.TaskReport(epoch=lease.epoch, partition=lease.partition,
                                         outcome=pb.TaskReport.RELEASED, lease=lease.lease,
                                         consumed=lease.skip))
        self.stats.released += len(back)
        return self.current is not None and self.current.key in keys

    def deliver(self, event: pb.WatchEvent) -> None:
        """From the stream's thread (Transport's `on_event`): an event the master pushed (the
        answers to this reader's messages go to their asker)."""
        with self.cond:
            self.inbox.append(event)
            self.cond.notify_all()

    def _broke(self) -> None:
        """From the stream's thread, under `cond` (Transport's `on_break`): a heartbeat goes
        at once on the next stream, so that what the master could not push meanwhile comes
        in its answer (as WorkerSession)."""
        self.resync = True
        self.cond.notify_all()

    # -- messages -----------------------------------------------------------------------------
    def _get_tasks(self, epoch: int, want: int, wait_ms: int, reports: list[pb.TaskReport],
                   held: list[_Lease], current: _Lease | None, quota: int | None
                   ) -> pb.GetTasksResponse:
        """A `get_tasks` message, asked until answered with a grant (as WorkerSession.get_tasks):
        sent again on the next stream when the stream broke or no answer came; when refused,
        its reports go alone first, and one refused for the master's load goes again after
        REFUSED_RETRY_S."""
        started = time.monotonic()
        while True:
            request = tasks_request(epoch, want, wait_ms, reports, self._keys(held),
                                    max(1, quota) if quota is not None else 0,
                                    [current.key] if current else [], self.sync, None)
            event = self._ask(pb.SessionMessage(get_tasks=request), wait_ms / 1000,
                              CALL_TIMEOUT_S + wait_ms / 1000, "a request for tasks")
            if event is None:
                self.stats.grants_unanswered += 1
                continue
            if not event.grant_refused:
                break
            self.stats.grants_refused += 1
            if reports:
                self._post(list(reports), held, current)
                reports.clear()
            elif event.grant_refused.startswith("RESOURCE_EXHAUSTED"):
                time.sleep(REFUSED_RETRY_S)
            else:
                raise JobError(f"master {self.client.address} refused the request for tasks "
                               f"of reader {self.index}: {event.grant_refused}")
        self.stats.grants_on_stream += 1
        answer = event.grant
        answer.revoked.extend(event.refused)
        if wait_ms == 0 and answer.tasks:
            self.stats.grant_ms.append((time.monotonic() - started) * 1000)
        return answer

    def _post(self, reports: list[pb.TaskReport], held: list[_Lease], current: _Lease | None,
              releasing: bool = False) -> None:
        """A heartbeat, with any reports, until answered (sent again on the next stream if the
        stream broke or no answer came: the master takes a repeated report as a REPEAT); its
        answer is applied by the reading loop, as an event. `releasing`: `held` lists the cut
        leases this message hands back."""
        keys = self._keys(held, releasing)
        started = [current.key] if current else []
        while True:
            event = self._ask(session_message(0, reports, keys, started, self.sync, None), 0.0,
                              ANSWER_TIMEOUT_S, "a heartbeat")
            if event is not None:
                break
            self.stats.unanswered += 1
        self.stats.answers += 1
        event.revoked.extend(event.refused)
        with self.cond:
            self.inbox.append(event)

    def _ask(self, message: pb.SessionMessage, expect_s: float, timeout_s: float, what: str
             ) -> pb.WatchEvent | None:
        """`message` on the stream once it is up (Transport.ask: None if it broke or no answer
        came, the stream then reopened); raises why no stream will come."""
        self.transport.wait_up()
        with self.cond:
            self.resync = False
        self.stats.stream_messages += 1
        self.stats.sent_at.append(time.monotonic())
        return self.transport.ask(message, expect_s, timeout_s, what)

    @staticmethod
    def _keys(held: list[_Lease], releasing: bool = False) -> list[tuple[int, int, int]]:
        """The leases a message lists as held: not the cut ones, whose RELEASED the master
        answered (unless this message carries it)."""
        return [x.key for x in held if releasing or not x.cut]

    def _unconsume(self, epoch: int, reports: list[pb.TaskReport],
                   uncertain: bool = False) -> None:
        """A dying reader: the partitions whose DONE it never sent are not delivered (its
        trainer died with them; another reader delivers them again). `uncertain`: they were
        sent, but no answer came back."""
        ranges = self.stats.ranges.get(epoch, {})
        for r in reports:
            if r.outcome == pb.TaskReport.DONE and ranges.get(r.partition):
                first, stop = ranges[r.partition].pop()
                self.stats.records[epoch] -= stop - first
                if uncertain:
                    self.stats.uncertain.setdefault(epoch, {}).setdefault(
                        r.partition, []).append((first, stop))

    def _consumed(self, epoch: int, lease: _Lease, first: int, stop: int) -> None:
        if stop > first:
            self.stats.ranges.setdefault(epoch, {}).setdefault(lease.partition, []).append(
                (first, stop))
            self.stats.records[epoch] = self.stats.records.get(epoch, 0) + stop - first

    def _flush(self, reports: list[pb.TaskReport], held: list[_Lease]) -> None:
        if reports:
            self._post(list(reports), held, None)
            reports.clear()


def client_main(address: str, cfg: FleetOptions, dataset: str, indices: list[int],
                conn: multiprocessing.connection.Connection) -> None:
    """One client process: its readers as threads, each with its Session stream's own thread,
    as each reader process of a real fleet has (grpc's blocking API; mixing it with grpc.aio in
    one process slowed the blocking calls under load)."""
    client = MasterClient(address, give_up_s=30, token=None)
    go = threading.Event()
    readers = [SimReader(client, cfg, dataset, i, go) for i in indices]
    results: list[ReaderStats] = [ReaderStats() for _ in readers]

    def run(k: int) -> None:
        results[k] = readers[k].run()
    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(readers))]
    conn.recv()  # open the sessions
    for t in threads:
        t.start()
    for r in readers:
        r.opened.wait()
    conn.send("opened")
    conn.recv()  # go: every process's readers have their sessions
    go.set()
    for t in threads:
        t.join()
    client.close()
    conn.send([asdict(r) for r in results])
    conn.close()


# -- the data set and the master -------------------------------------------------------------------
def ensure_dataset(storage_url: str, partitions: int, records: int) -> str:
    """A manifest of `partitions` row groups of `records` rows (nobody reads the shards)."""
    name = f"fleet-{partitions}x{records}"
    shards = []
    for first in range(0, partitions, ROW_GROUPS_PER_SHARD):
        n = min(ROW_GROUPS_PER_SHARD, partitions - first)
        shards.append(ShardInfo(
            path=f"data/shard-{first // ROW_GROUPS_PER_SHARD:05d}.parquet", num_rows=n * records,
            num_bytes=n * records, sha256="0" * 64,
            row_groups=tuple(RowGroupInfo(num_rows=records, num_bytes=records,
                                          first_id=(first + i) * records) for i in range(n))))
    manifest = Manifest(
        name=name, kind="text", fields=(FieldSpec("text", "string"),), label_field=None,
        num_records=partitions * records, num_bytes=partitions * records, shards=tuple(shards),
        label_histogram={}, fingerprint=f"fleet-{partitions}x{records}",
        source="benchmarks/fleet.py", created_at="2026-11-26T00:00:00Z")
    manifest.check()
    write_manifest(open_storage(storage_url), manifest)
    return name


# -- the run ---------------------------------------------------------------------------------------
def run(cfg: FleetOptions, storage: str, state: str) -> dict[str, Any]:
    dataset = ensure_dataset(storage, cfg.partitions, cfg.records)
    args = ["--partitions", str(cfg.partitions), "--lease-timeout", str(cfg.lease_timeout_s),
            "--max-sessions", str(max(1024, 2 * cfg.readers))]
    # The master runs `python -m trainfeed.cli.main`, which imports trainfeed from its working
    # directory first: started in a checkout it would run that checkout's master, whatever
    # PYTHONPATH says (a baseline of another tree would silently measure this one). So it starts
    # in a folder without one, and runs the trainfeed this script imports.
    here = os.getcwd()
    os.makedirs(DEFAULT_ROOT, exist_ok=True)
    os.chdir(DEFAULT_ROOT)
    try:
        master = MasterProcess(storage, state=state, extra_args=args)
    finally:
        os.chdir(here)
    with master:
        ctx = multiprocessing.get_context("spawn")
        pipes, procs = [], []
        for k in range(cfg.processes):
            parent, child = ctx.Pipe()
            indices = list(range(k, cfg.readers, cfg.processes))
            proc = ctx.Process(target=client_main,
                               args=(master.address, cfg, dataset, indices, child))
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        for p in pipes:
            p.send("open")
        for p in pipes:  # every session open (1,000 OpenJobs are not the steady state)
            if not p.poll(600):
                raise SystemExit("the readers did not open their sessions within 600 s")
            p.recv()
        for p in pipes:
            p.send("go")
        time.sleep(cfg.window_after_s)
        calls0, cpu0, t0 = rpc_counts(master.metrics_url), process_cpu_s(master.proc.pid), \
            time.monotonic()
        if cfg.duration_s:  # a fixed window: read before the readers leave
            time.sleep(max(0.0, cfg.duration_s - cfg.window_after_s - 0.5))
            calls1, cpu1, t1 = rpc_counts(master.metrics_url), \
                process_cpu_s(master.proc.pid), time.monotonic()
        results: list[dict[str, Any]] = []
        for p in pipes:
            results += p.recv()
        if not cfg.duration_s:
            calls1, cpu1, t1 = rpc_counts(master.metrics_url), \
                process_cpu_s(master.proc.pid), time.monotonic()
        for proc in procs:
            proc.join(30)
    read = sum(1 for r in results for t in r["done_at"] if t0 <= t <= t1)
    messages = sum(1 for r in results for t in r["sent_at"] if t0 <= t <= t1)
    summary = summarize(cfg, results, t1 - t0, cpu1 - cpu0, calls0, calls1, state, read,
                        messages)
    # What the master warned of (a stall, expiries, refusals), by kind: the first words.
    summary["master_warnings"] = dict(Counter(
        " ".join(line.split()[3:9]) for line in master.log
        if " WARNING " in line or " ERROR " in line).most_common(10))
    return summary


def percentile(samples: Sequence[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def coverage(cfg: FleetOptions, results: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Per epoch: records expected, missing and duplicated (a synchronous epoch keeps the
    records before its cut, in the epoch's partition order)."""
    per_epoch = _gather(results, "ranges")
    unsure = _gather(results, "uncertain")
    out = {}
    for epoch, parts in sorted(per_epoch.items()):
        expected = expected_records(cfg, epoch)
        missing = duplicated = uncertain = 0
        for p, want in expected.items():
            seen = Counter(i for first, stop in parts.get(p, []) for i in range(first, stop))
            maybe = {i for first, stop in unsure.get(epoch, {}).get(p, [])
                     for i in range(first, stop)}
            missing += sum(1 for i in range(want) if seen[i] == 0 and i not in maybe)
            duplicated += sum(n - 1 for n in seen.values() if n > 1)
            uncertain += len(maybe)
        out[epoch] = {"expected": sum(expected.values()), "missing": missing,
                      "duplicated": duplicated, "uncertain": uncertain}
    return out


def _gather(results: list[dict[str, Any]], key: str
            ) -> dict[int, dict[int, list[tuple[int, int]]]]:
    """epoch -> partition -> the ranges of every reader, from each reader's `key`."""
    out: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for epoch, parts in r[key].items():
            for p, ranges in parts.items():
                out[int(epoch)][int(p)] += [(int(a), int(b)) for a, b in ranges]
    return out


def expected_records(cfg: FleetOptions, epoch: int) -> dict[int, int]:
    """partition -> records of it the epoch delivers."""
    if not cfg.sync:
        return {p: cfg.records for p in range(cfg.partitions)}
    total = cfg.partitions * cfg.records
    keep = total // (cfg.readers * cfg.batch) * cfg.readers * cfg.batch
    out, taken = {}, 0
    for p in epoch_order(cfg.partitions, cfg.seed, epoch):
        if taken >= keep:
            break
        out[p] = min(cfg.records, keep - taken)
        taken += out[p]
    return out


def summarize(cfg: FleetOptions, results: list[dict[str, Any]], wall: float, cpu: float,
              calls0: dict[str, float], calls1: dict[str, float], state: str,
              read: int, messages: int) -> dict[str, Any]:
    # Unary calls (the master's histogram times those only: OpenJob, LeaveJob, GetJobStatus);
    # a session's OpenJob and LeaveJob are once per session, not per second: not counted.
    calls = {m: calls1.get(m, 0) - calls0.get(m, 0) for m in calls1}
    total_calls = sum(n for m, n in calls.items() if m not in ("OpenJob", "LeaveJob"))
    grants = [ms for r in results for ms in r["grant_ms"]]
    starved = [r["max_starved_s"] for r in results]
    summary: dict[str, Any] = {
        "options": asdict(cfg), "state": state.split("://")[0], "wall_s": round(wall, 2),
        "loadavg": os.getloadavg(), "master_cores": round(cpu / wall, 3),
        "master_cpu_ms_per_reader_s": round(1000 * cpu / (wall * cfg.readers), 3),
        "calls_per_s": {m: round(n / wall, 1) for m, n in sorted(calls.items())},
        "calls_per_reader_s": round(total_calls / (wall * cfg.readers), 3),
        "partitions_per_s": round(read / wall, 1),  # partitions read inside the window
        "master_cpu_ms_per_partition": round(1000 * cpu / read, 3) if read else None,
        # Session messages the readers sent inside the window (each answered but progress).
        "messages_per_s": round(messages / wall, 1),
        "messages_per_reader_s": round(messages / (wall * cfg.readers), 3),
        "grants": {"on_stream": sum(r["grants_on_stream"] for r in results),
                   "refused": sum(r["grants_refused"] for r in results),
                   "unanswered": sum(r["grants_unanswered"] for r in results)},
        # Session streams the readers opened over the whole run: one each, more only where a
        # stream broke and was reopened (Transport's backoff).
        "streams": {"opened": sum(r["streams_opened"] for r in results),
                    "reopened": sum(max(0, r["streams_opened"] - 1) for r in results),
                    "broken_on_purpose": sum(r["breaks"] for r in results),
                    "heartbeats_unanswered": sum(r["unanswered"] for r in results)},
        "grant_ms": {"p50": round(percentile(grants, 0.5), 2),
                     "p99": round(percentile(grants, 0.99), 2), "n": len(grants)},
        "starved_s": {"max": round(max(starved, default=0), 3),
                      "p99": round(percentile(starved, 0.99), 3),
                      "total": round(sum(r["starved_s"] for r in results), 2)},
        "tail_s_total": round(sum(r["tail_s"] for r in results), 2),
        "stealing": {"give_backs": sum(r["give_backs"] for r in results),
                     "released": sum(r["released"] for r in results),
                     "revoked": sum(r["revoked"] for r in results)},
        # Over the whole run (not the window): events the master pushed on the streams,
        # messages the readers sent (heartbeats, reports, get_tasks), the answers to heartbeats.
        "watch_events": sum(r["events"] for r in results),
        "stream_messages": sum(r["stream_messages"] for r in results),
        "stream_answers": sum(r["answers"] for r in results),
        "kinds": dict(Counter(r["kind"] for r in results)),
        "epochs": coverage(cfg, results) if not cfg.duration_s else {},
        # Distinct errors (the reader's index cut off), with how many readers met each.
        "errors": dict(Counter(e.split(": ", 1)[-1][:300] for r in results
                               for e in r["errors"]).most_common(20)),
    }
    if cfg.sync:
        summary["sync"] = sync_summary(results)
    return summary


def sync_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps per rank per epoch, and the lag of the next epoch's last start behind this one's
    last finish."""
    out: dict[str, Any] = {}
    epochs = sorted({int(e) for r in results for e in r["records"]})
    for e in epochs:
        per_rank = sorted({r["records"].get(e, r["records"].get(str(e), 0)) for r in results})
        last_finish = max(r["finished"].get(e, r["finished"].get(str(e), 0)) for r in results)
        starts = [r["started"].get(e + 1, r["started"].get(str(e + 1))) for r in results]
        lag = (max(s for s in starts if s is not None) - last_finish
               if all(s is not None for s in starts) else None)
        out[str(e)] = {"records_per_rank": per_rank, "next_start_lag_s":
                       None if lag is None else round(lag, 3)}
    return out


def render(summary: dict[str, Any]) -> str:
    o = summary["options"]
    lines = [f"trainfeed of {summary.get('trainfeed', '?')}",
             f"fleet: {o['readers']} readers ({summary['kinds']}) in {o['processes']} processes, "
             f"{o['partitions']} partitions × {o['records']} records, {summary['state']} state, "
             f"one Session stream per reader{', sync' if o['sync'] else ''}; "
             f"{summary['wall_s']} s, load {summary['loadavg'][0]:.1f}",
             "| master cores | CPU ms per partition | CPU ms per reader-s | partitions/s | "
             "Session messages per reader-s | Session messages/s | grant p50 / p99 ms | "
             "max starved s | give-backs | released |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {summary['master_cores']} | {summary['master_cpu_ms_per_partition']} | "
             f"{summary['master_cpu_ms_per_reader_s']} | {summary['partitions_per_s']} | "
             f"{summary['messages_per_reader_s']} | {summary['messages_per_s']} | "
             f"{summary['grant_ms']['p50']} / {summary['grant_ms']['p99']} | "
             f"{summary['starved_s']['max']} | {summary['stealing']['give_backs']} | "
             f"{summary['stealing']['released']} |",
             f"unary calls/s by method: {summary['calls_per_s']} "
             f"({summary['calls_per_reader_s']} per reader-s but OpenJob and LeaveJob)",
             f"grants (whole run): {summary['grants']}",
             f"Session streams (whole run): {summary['streams']['opened']} opened "
             f"({summary['streams']['reopened']} reopened after a break, "
             f"{summary['streams']['broken_on_purpose']} broken on purpose), "
             f"{summary['watch_events']} events pushed, {summary['stream_messages']} Session "
             f"messages sent, {summary['stream_answers']} heartbeats answered "
             f"({summary['streams']['heartbeats_unanswered']} sent again)"]
    for epoch, c in summary["epochs"].items():
        lines.append(f"epoch {epoch}: {c['expected']} records expected, {c['missing']} missing, "
                     f"{c['duplicated']} duplicated"
                     + (f", {c['uncertain']} uncertain (readers that gave up)"
                        if c["uncertain"] else ""))
    for epoch, s in summary.get("sync", {}).items():
        lines.append(f"sync epoch {epoch}: records per rank {s['records_per_rank']}, next epoch's "
                     f"last start {s['next_start_lag_s']} s after the last finish")
    if summary.get("master_warnings"):
        lines.append(f"master warnings: {summary['master_warnings']}")
    if summary["errors"]:
        lines.append(f"errors: {summary['errors']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = FleetOptions()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("readers", "processes", "partitions", "records", "epochs", "depth", "batch",
                 "seed"):
        p.add_argument(f"--{name}", type=int, default=getattr(d, name))
    for name in ("rate", "slow_share", "slow_factor", "fast_share", "fast_factor",
                 "dying_share", "lease_timeout_s", "break_every_s"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(d, name))
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds")
    p.add_argument("--window-after", type=float, default=0.0,
                   help="measure from this many seconds after the start")
    p.add_argument("--sync", action="store_true", help="one synchronous group of all readers")
    p.add_argument("--state", default="memory://", help="the master's state store URL")
    p.add_argument("--storage", default=f"{DEFAULT_ROOT}/fleet-storage")
    p.add_argument("--json", default=f"{DEFAULT_ROOT}/fleet.json")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()
    a = parse_args(argv)
    cfg = FleetOptions(readers=a.readers, processes=a.processes, partitions=a.partitions,
                       records=a.records, rate=a.rate, slow_share=a.slow_share,
                       slow_factor=a.slow_factor, fast_share=a.fast_share,
                       fast_factor=a.fast_factor, dying_share=a.dying_share, epochs=a.epochs,
                       duration_s=a.duration, window_after_s=a.window_after, depth=a.depth,
                       lease_timeout_s=a.lease_timeout_s, break_every_s=a.break_every_s,
                       sync=a.sync, batch=a.batch, seed=a.seed)
    storage, out = os.path.abspath(a.storage), os.path.abspath(a.json)
    summary = run(cfg, storage, a.state)
    summary["trainfeed"] = os.path.dirname(os.path.dirname(trainfeed.__file__))
    print(render(summary), flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
