"""The master's record of what each reader measured (issue 29): a pure board, time an argument.

Readers send a `ReaderStats` summary (what changed since their previous one: trainfeed.reader.
meter) with the Session messages they send anyway; the coordinator hands each one to
`ReaderBoard.record`. The board keeps, per job and reader:
- running totals (wall time, the trainer's wait, records, bytes read, decode figures), and per
  job the totals of every reader ever heard (monotonic: Prometheus counters);
- the summaries of the last RECENT_S seconds, whose ratio is the reader's *current* input-bound
  share and rate (a share over a reader's whole life would hide that it became slow now);
- records and waits per HISTORY_BUCKET_S bucket over the last HISTORY_BUCKETS buckets, for the
  status page's sparklines;
- refused reports (who, what, why, when), the last MAX_REFUSALS per job.

A summary a reader cannot have measured (a time that is NaN, infinite, negative or beyond
MAX_SECONDS, a count beyond MAX_COUNT) is dropped whole, never summed: one such number would
poison the job's totals, and so the page and the Prometheus counters, for the master's life.
`dropped` counts them; the first is logged, naming the field and the value.

A reader silent for FORGET_S is dropped (its figures stay in the job's totals). Not thread-safe:
the servicer's event loop is its only writer and reader (scrapes and the status page hop to it).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from trainfeed.master.core.messages import ReaderStats

logger = logging.getLogger(__name__)

# The window of a reader's current rate and input-bound share: a few of its summaries (a reader
# calls at least every lease_timeout/3, 10 s by default, and several times a second when busy).
RECENT_S = 30.0
# Sparklines: one point per 10 s over the last 5 minutes.
HISTORY_BUCKET_S = 10.0
HISTORY_BUCKETS = 30
# A reader not heard from for this long is forgotten (its share of the job's totals stays).
FORGET_S = 600.0
# A reader whose trainer waits more than this share of the time is flagged on the status page.
INPUT_BOUND_FLAG = 0.5
# A reader at less than this share of its job's median rate (with 3 readers or more) is slow.
SLOW_FLAG = 0.5
MAX_REFUSALS = 20
# The figures summed (the fields of ReaderStats, in the wire's order).
FIELDS = ReaderStats._fields
# The time fields (floats: their defaults are 0.0); the others are counts.
SECONDS = tuple(name for name, zero in ReaderStats._field_defaults.items()
                if isinstance(zero, float))
# A summary covers the time since the reader's previous call (a third of the lease timeout at
# most, a day at most: trainfeed.master.core.jobs.MAX_LEASE_TIMEOUT_S); read and decode times add up
# the threads that did the work. 30 days is beyond any honest summary.
MAX_SECONDS = 30 * 86_400.0
# Counts are summed as floats: past 2**53 they are no longer exact, and no reader reads that much
# between two calls.
MAX_COUNT = 1 << 53


def problem(stats: ReaderStats) -> str | None:
    """None if every figure of `stats` is one a reader can have measured, else which is not
    (the first: its field, its value and the rule)."""
    for name in FIELDS:
        value = getattr(stats, name)
        if name in SECONDS:
            if not 0 <= value <= MAX_SECONDS:  # NaN compares false: refused too
                return f"{name}={value!r} is not a time in 0..{MAX_SECONDS:g} s"
        elif value > MAX_COUNT:
            return f"{name}={value} is over {MAX_COUNT}"
    return None


def _add(total: dict[str, float], values: tuple[float, ...]) -> None:
    for name, value in zip(FIELDS, values):
        total[name] += value


def _zero() -> dict[str, float]:
    return dict.fromkeys(FIELDS, 0)


@dataclass
class ReaderTrack:
    """One reader's figures on the board."""

    worker: str
    first_seen: float
    last_seen: float
    totals: dict[str, float] = field(default_factory=_zero)
    # (when, wall, wait, records, bytes) of the summaries of the last RECENT_S, and their sums
    # (kept as they come and go: a scrape of 1,000 readers must not sum them all again).
    recent: deque[tuple[float, float, float, float, float]] = field(default_factory=deque)
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    # bucket number (int(time / HISTORY_BUCKET_S)) -> [records, wait seconds, wall seconds]
    history: dict[int, list[float]] = field(default_factory=dict)

    def add(self, now: float, stats: ReaderStats) -> None:
        entry = (now, stats.wall_s, stats.input_wait_s, float(stats.records),
                 float(stats.bytes_read))
        self.recent.append(entry)
        for i in range(4):
            self.sums[i] += entry[i + 1]

    def window(self, now: float) -> tuple[float, float, float, float]:
        """(wall, wait, records, bytes) summed over the summaries of the last RECENT_S."""
        recent, sums = self.recent, self.sums
        while recent and recent[0][0] < now - RECENT_S:
            gone = recent.popleft()
            for i in range(4):
                sums[i] -= gone[i + 1]
        if not recent:
            sums[:] = [0.0, 0.0, 0.0, 0.0]  # no drift from float sums
        return sums[0], sums[1], sums[2], sums[3]


@dataclass(frozen=True)
class ReaderView:
    """One reader as the status page and `trainfeed status --watch` show it."""

    worker: str
    last_contact_s: float  # seconds since its last summary
    records_per_s: float  # over the last RECENT_S
    input_bound: float  # share 0..1 over the last RECENT_S
    read_bytes_per_s: float
    records: int  # since it first called
    bytes_read: int
    decode_failures: int
    decoded_per_s: float  # records decoded per second of its wall time, since it first called
    sparkline: tuple[float, ...]  # records/s per HISTORY_BUCKET_S, oldest first
    flags: tuple[str, ...]  # "input-bound", "slow"


@dataclass(frozen=True)
class Refusal:
    """A refused report: who sent it, about what, and why."""

    at: float
    worker: str
    count: int
    why: str


class ReaderBoard:
    """Every job's readers' figures; see the module docstring."""

    def __init__(self) -> None:
        self._readers: dict[str, dict[str, ReaderTrack]] = {}
        self._totals: dict[str, dict[str, float]] = {}
        self._refusals: dict[str, deque[Refusal]] = {}
        self.dropped = 0  # summaries with a figure no reader can have measured

    def record(self, job: str, worker: str, stats: ReaderStats, now: float) -> None:
        """Adds one summary of `worker` (an empty or timeless one, from a reader that sends
        none or whose trainer has not asked for data yet, is ignored; one with a figure no
        reader can have measured is dropped whole and counted in `dropped`)."""
        bad = problem(stats)
        if bad is not None:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("dropped a reader summary of job %s from %r: %s (further ones "
                               "are counted, not logged)", job, worker[:120], bad)
            return
        if stats.wall_s == 0:
            return
        readers = self._readers.setdefault(job, {})
        track = readers.get(worker)
        if track is None:
            track = readers[worker] = ReaderTrack(worker, now, now)
            self._forget(job, now)
        track.last_seen = now
        values = tuple(stats)  # (in FIELDS' order)
        _add(track.totals, values)
        _add(self._totals.setdefault(job, _zero()), values)
        track.add(now, stats)
        bucket = track.history.setdefault(int(now // HISTORY_BUCKET_S), [0.0, 0.0, 0.0])
        bucket[0] += stats.records
        bucket[1] += stats.input_wait_s
        bucket[2] += stats.wall_s
        if len(track.history) > HISTORY_BUCKETS:
            del track.history[min(track.history)]

    def refused(self, job: str, worker: str, count: int, why: str, now: float) -> None:
        """`count` reports of `worker` were refused (not its lease any more), for `why`."""
        self._refusals.setdefault(job, deque(maxlen=MAX_REFUSALS)).append(
            Refusal(now, worker, count, why))

    def refusals(self, job: str) -> list[Refusal]:
        """The job's last refused reports, newest first."""
        return list(reversed(self._refusals.get(job, ())))

    def totals(self, job: str) -> dict[str, float]:
        """The sums of every summary the job's readers sent (ReaderStats' field names)."""
        return dict(self._totals.get(job, _zero()))

    def _forget(self, job: str, now: float) -> None:
        readers = self._readers.get(job, {})
        for worker in [w for w, t in readers.items() if now - t.last_seen > FORGET_S]:
            del readers[worker]

    def views(self, job: str, now: float) -> list[ReaderView]:
        """The job's readers heard from within FORGET_S, by worker id, flagged."""
        self._forget(job, now)
        tracks = sorted(self._readers.get(job, {}).values(), key=lambda t: t.worker)
        rows = []
        for t in tracks:
            wall, wait, records, read = t.window(now)
            rows.append((t, wall, wait, records, read))
        rates = sorted(records / wall for _, wall, _, records, _ in rows if wall > 0)
        median = rates[len(rates) // 2] if rates else 0.0
        views = []
        for t, wall, wait, records, read in rows:
            share = min(1.0, wait / wall) if wall > 0 else 0.0
            rate = records / wall if wall > 0 else 0.0
            flags = []
            if wall > 0 and share > INPUT_BOUND_FLAG:
                flags.append("input-bound")
            if len(rates) >= 3 and wall > 0 and rate < SLOW_FLAG * median:
                flags.append("slow")
            life = t.totals["wall_s"]
            views.append(ReaderView(
                worker=t.worker, last_contact_s=max(0.0, now - t.last_seen),
                records_per_s=rate, input_bound=share,
                read_bytes_per_s=read / wall if wall > 0 else 0.0,
                records=int(t.totals["records"]), bytes_read=int(t.totals["bytes_read"]),
                decode_failures=int(t.totals["decode_failures"]),
                decoded_per_s=t.totals["records_decoded"] / life if life > 0 else 0.0,
                sparkline=self._sparkline(t, now), flags=tuple(flags)))
        return views

    @staticmethod
    def _sparkline(track: ReaderTrack, now: float) -> tuple[float, ...]:
        """records/s per bucket; the current bucket over the part of it that has passed (at
        least a second), so that the line does not drop at its end."""
        last = int(now // HISTORY_BUCKET_S)
        current = max(1.0, now - last * HISTORY_BUCKET_S)
        return tuple(track.history.get(b, (0.0,))[0]
                     / (current if b == last else HISTORY_BUCKET_S)
                     for b in range(last - HISTORY_BUCKETS + 1, last + 1))

    def input_bound_readers(self, job: str, now: float) -> int:
        """How many of the job's readers are flagged input-bound (what a scrape exports)."""
        count = 0
        for t in self._readers.get(job, {}).values():
            wall, wait, _, _ = t.window(now)
            count += wall > 0 and wait / wall > INPUT_BOUND_FLAG
        return count

    def job_window(self, job: str, now: float) -> tuple[float, float]:
        """(records/s summed over readers, the job's input-bound share: wait over wall of
        every reader's last RECENT_S)."""
        wall = wait = rate = 0.0
        for t in self._readers.get(job, {}).values():
            w, q, records, _ = t.window(now)
            wall += w
            wait += q
            rate += records / w if w > 0 else 0.0
        return rate, (min(1.0, wait / wall) if wall > 0 else 0.0)

    def job_sparkline(self, job: str, now: float) -> tuple[float, ...]:
        """The job's records/s per HISTORY_BUCKET_S (all its readers), oldest first."""
        lines = [self._sparkline(t, now) for t in self._readers.get(job, {}).values()]
        return tuple(sum(points) for points in zip(*lines)) if lines else (
            (0.0,) * HISTORY_BUCKETS)
