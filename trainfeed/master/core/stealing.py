"""Work stealing (issue 13): which of the other readers' unstarted leases a reader that found
todo empty should get, so that readers of unequal speed end an epoch together.

Asking for too much is as bad as asking for too little. A partition handed to a reader slower
than its holder finishes later than it would have where it was, and at an epoch's tail that is
the epoch's end; a reader that still holds seconds of work gains nothing from more. So the
master asks for a partition only when the asking reader (the thief) would finish it before its
holder (the victim) would:

    (thief's records still to deliver + 1.5 × the partition's) / thief's rate
        <  (victim's records up to and including the partition) / victim's rate

taking the latest-finishing candidate of all victims first, and adding each one asked for to the
thief's records. The extra half partition (STEAL_MARGIN) covers what the estimates miss, which
grows with a reader's slowness: the records reported lag up to a second behind its trainer, and
its last step trains after its last record was handed over. Without it, a slow reader took back
at the tail a partition a fast one would have finished 0.5 s sooner.

A victim's records are its leases in lease order (the order it reads them). Rates are the
records per second each reader's trainers consumed, from the DONE and PROGRESS reports of the
last RATE_WINDOW_S (`RateMeter`); a reader without one counts at the mean of those known, or all
alike when none is.

Only leases the holder has not begun can go: its calls list which ones its trainer began
(HeldTask.started), and reported progress marks them too (readers older than that field). An
ask (`Ask`) stays outstanding until the holder answers it:
- a RELEASED report puts the partition in todo, reserved for the thief for RESERVE_S, so that no
  other reader (a slower one long-polling at the same tail) takes it first;
- a call listing the lease as started voids it: the holder keeps it;
- after ASK_AGAIN_S without an answer it lapses, and the partition may be asked for again.

None of this is state: a restarted master starts with no asks and measures rates afresh.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainfeed.master.core.ledger import Ledger

# Rates are measured over the reports of this many seconds (enough for a few partitions of a
# slow reader, short enough to follow a reader that slows down).
RATE_WINDOW_S = 5.0
# A rate needs reports spanning at least this long.
MIN_RATE_SPAN_S = 0.5
MAX_RATE_SAMPLES = 256
# A reader not heard of for this long is forgotten (one that died holds memory otherwise).
RATE_FORGET_S = 60.0
# An ask its holder has not answered (released, or listed as started) lapses after this long.
ASK_AGAIN_S = 2.0
# A partition given back is kept for its thief this long (it long-polls, so it comes at once).
RESERVE_S = 1.0
# A thief must finish the partition sooner by at least this share of its own time for it.
STEAL_MARGIN = 0.5
# The holders' candidates are gathered at most this often (O(leases)); thieves asking in between
# share them (at an epoch's tail, every change wakes every idle reader's long-poll).
PLAN_S = 0.1


class RateMeter:
    """Records each worker's trainers consumed, over time: their rate."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[tuple[float, int]]] = {}  # (when, records so far)
        self._sweep_at = 0.0  # mutmut: any start is equivalent (when the first sweep runs)

    def add(self, worker: str, records: int, now: float) -> None:
        if records <= 0:
            return
        samples = self._samples.setdefault(worker, deque(maxlen=MAX_RATE_SAMPLES))
        # mutmut: any base is equivalent (rates are differences); `>= 2` too (with two
        # samples, samples[1] is the one just added).
        samples.append((now, (samples[-1][1] if samples else 0) + records))
        while len(samples) > 2 and now - samples[1][0] > RATE_WINDOW_S:
            samples.popleft()
        # At most once per window: O(workers). mutmut: `>` and `now - ...` are equivalent (when
        # sweeps run, not what they forget).
        if now >= self._sweep_at:
            self._sweep_at = now + RATE_WINDOW_S
            for gone in [w for w, s in self._samples.items() if now - s[-1][0] > RATE_FORGET_S]:
                self.forget(gone)

    def rate(self, worker: str) -> float | None:
        """Records per second between the first and last report of the window; None before
        reports span MIN_RATE_SPAN_S."""
        samples = self._samples.get(worker)
        if not samples or samples[-1][0] - samples[0][0] < MIN_RATE_SPAN_S:
            return None
        return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])

    def forget(self, worker: str) -> None:
        self._samples.pop(worker, None)

    def known(self) -> dict[str, float]:
        """Every rate known, by worker."""
        rates = ((w, self.rate(w)) for w in self._samples)
        return {w: r for w, r in rates if r}


@dataclass(frozen=True)
class Holding:
    """One reader's leases as the master sees them, in the order it reads them: (partition,
    records still to deliver, whether it may be asked back)."""

    rate: float | None
    queue: Sequence[tuple[int, int, bool]]


class Plan:
    """Every holder's candidates at one moment, with when it would finish each: shared by the
    thieves that ask before it is rebuilt (PLAN_S), each taking what it should have from the
    latest-finishing end (a heap of holders by their last candidate), so that an ask costs
    O(asks log holders) and only the plan O(leases).

    `rates`: the known ones (records/s); others count at their mean. `queues`: per holder, its
    leases in order as (partition, records still to deliver). Which of them may be asked for is
    `take`'s `valid`."""

    def __init__(self, rates: Mapping[str, float],
                 queues: Iterable[tuple[str, Iterable[tuple[int, int]]]],
                 built_at: float = 0.0):  # mutmut: any default (`choose` never rebuilds)
        self.built_at = built_at
        # mutmut: any rate without known ones is equivalent (all alike: only ratios count).
        self.default_rate = sum(rates.values()) / len(rates) if rates else 1.0
        self.rates = rates
        # Per holder, its leases in order: (partition, records, when it would finish it).
        self._candidates: dict[str, list[tuple[int, int, float]]] = {}
        for worker, queue in queues:
            ahead, rate, mine = 0, self.rate(worker), []
            for partition, remaining in queue:
                ahead += remaining
                mine.append((partition, remaining, ahead / rate))
            if mine:
                self._candidates[worker] = mine
        self._heap = [(-c[-1][2], w) for w, c in self._candidates.items()]
        heapq.heapify(self._heap)

    def rate(self, worker: str) -> float:
        return self.rates.get(worker) or self.default_rate

    def take(self, thief: str, backlog: int,
             valid: Callable[[str, int], bool] = lambda victim, partition: True,
             ) -> list[tuple[str, int]]:
        """The (victim, partition) pairs to ask back for `thief`, latest-finishing first (see
        the module doc), taken out of the plan. `backlog`: the thief's records still to deliver
        (its leases', and those on their way to it). `valid`: whether a candidate may still be
        asked for (the plan may be up to PLAN_S old)."""
        thief_rate = self.rate(thief)
        chosen: list[tuple[str, int]] = []
        own = None  # the thief's own entry, set aside while it takes from the others
        while self._heap:
            if self._heap[0][1] == thief:
                own = heapq.heappop(self._heap)
                continue
            victim = self._heap[0][1]
            candidates = self._candidates[victim]
            partition, remaining, victim_done = candidates[-1]
            usable = valid(victim, partition)
            if usable and (backlog + (1 + STEAL_MARGIN) * remaining) / thief_rate >= victim_done:
                break
            heapq.heappop(self._heap)
            candidates.pop()
            if usable:
                chosen.append((victim, partition))
                backlog += remaining
            if candidates:
                heapq.heappush(self._heap, (-candidates[-1][2], victim))
        if own is not None:
            heapq.heappush(self._heap, own)
        return chosen


def choose(thief: str, holdings: Mapping[str, Holding], incoming: int = 0) -> list[tuple[str, int]]:
    """The (victim, partition) pairs to ask back for `thief` (see the module doc and `Plan`).
    `incoming`: records already on their way to the thief (outstanding asks)."""
    mine = holdings.get(thief)
    backlog = incoming + (sum(r for _, r, _ in mine.queue) if mine is not None else 0)
    rates = {w: h.rate for w, h in holdings.items() if h.rate}
    askable = {(w, p) for w, h in holdings.items() for p, _, a in h.queue if a}
    plan = Plan(rates, ((w, [(p, r) for p, r, _ in h.queue]) for w, h in holdings.items()))
    return plan.take(thief, backlog, lambda victim, partition: (victim, partition) in askable)


@dataclass
class Ask:
    """An outstanding ask: `victim` is to give back its lease `lease` of the partition for
    `thief`. `delivered`: the victim was told; `released`: it gave it back (the partition waits
    in todo, reserved for the thief); `at`: when it was asked, or released."""

    thief: str
    victim: str
    lease: int
    at: float
    delivered: bool = False
    released: bool = False


@dataclass
class Stealing:
    """One job's work stealing: rates, what each reader's trainer began, outstanding asks."""

    rates: RateMeter = field(default_factory=RateMeter)
    started: dict[str, set[int]] = field(default_factory=dict)  # worker -> partitions begun
    asks: dict[int, Ask] = field(default_factory=dict)  # partition -> its ask
    epoch: int = -1  # the epoch `asks` and `started` are of
    plan: Plan | None = None

    def listed(self, ledger: Ledger, worker: str, held: Iterable[tuple[int, bool]]) -> bool:
        """A call of `worker` listed its leases as (partition, started). Returns whether it
        voided an ask (its trainer began that partition): the thief may then ask elsewhere."""
        self._sync(ledger)
        begun = {p for p, started in held if started}
        self.started[worker] = begun
        void = [p for p, a in self.asks.items()
                if a.victim == worker and not a.released and p in begun]
        for p in void:
            del self.asks[p]
        return bool(void)

    def released(self, worker: str, partition: int, now: float) -> None:
        """`worker` gave `partition` back: if asked to, it is now reserved for the thief."""
        ask = self.asks.get(partition)
        if ask is not None and ask.victim == worker and not ask.released:
            ask.released, ask.at = True, now

    def leased(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.asks.pop(p, None)

    def forget(self, worker: str) -> None:
        """`worker` left the job."""
        self.rates.forget(worker)
        self.started.pop(worker, None)
        for p in [p for p, a in self.asks.items() if worker in (a.thief, a.victim)]:
            del self.asks[p]

    def reserved(self, ledger: Ledger, now: float) -> dict[int, str]:
        """Todo partitions given back for a reader, which only it may lease for now: partition
        -> that reader (see Ledger.lease)."""
        self._prune(ledger, now)
        return {p: a.thief for p, a in self.asks.items() if a.released}

    def ask(self, ledger: Ledger, thief: str, now: float) -> list[tuple[str, int]]:
        """`thief` found nothing to lease: asks the others for what it would finish sooner
        (see the module doc). Returns the new (victim, partition) asks."""
        self._prune(ledger, now)
        if ledger.sizes is None:
            return []  # (a ledger alone, in tests: nothing to weigh)
        if self.plan is None or now - self.plan.built_at >= PLAN_S:
            self.plan = self._plan(ledger, now)

        def valid(victim: str, p: int) -> bool:  # (still so since the plan was made)
            return (p in ledger.unstarted(victim) and p not in self.started.get(victim, ())
                    and p not in self.asks)

        backlog = sum(ledger.remaining(p) for p, a in self.asks.items() if a.thief == thief)
        backlog += sum(ledger.remaining(p) for p in ledger.by_worker.get(thief, ()))
        chosen = self.plan.take(thief, backlog, valid)
        for victim, p in chosen:
            self.asks[p] = Ask(thief, victim, ledger.token_of(p), now)
        return chosen

    def _plan(self, ledger: Ledger, now: float) -> Plan:
        """Every holder's leases, less those asked for: O(leases), the hot loop of an epoch's
        tail with many readers (hence Ledger.remaining inlined). Which of them may be asked for
        is checked when one is taken (`ask`'s `valid`: the plan may be PLAN_S old)."""
        sizes, limits, progress, asks = ledger.sizes, ledger.limits, ledger.progress, self.asks
        assert sizes is not None
        queues = ((worker, ((p, max(0, limits.get(p, sizes[p]) - progress.get(p, 0)))
                            for p in leases if p not in asks))
                  for worker, leases in ledger.by_worker.items())
        return Plan(self.rates.known(), queues, now)

    def due(self, ledger: Ledger, worker: str,
            held: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """The asks to deliver to `worker` now: those of the leases its call lists (`held`). A
        lease it does not list yet (granted in an answer it has not read: its producer and its
        reporter call the master on two threads) is asked on its next call: sent now, the ask
        would be ignored."""
        listed = set(held)
        out = []
        for p, a in self.asks.items():
            key = (ledger.epoch, p, a.lease)
            if a.victim == worker and not a.delivered and not a.released and key in listed:
                a.delivered = True
                out.append(key)
        return out

    def _sync(self, ledger: Ledger) -> None:
        if self.epoch != ledger.epoch:
            self.epoch = ledger.epoch
            self.asks.clear()
            self.started.clear()
            self.plan = None

    def _prune(self, ledger: Ledger, now: float) -> None:
        """Drops asks answered elsewhere, lapsed, or whose reservation ran out."""
        self._sync(ledger)
        # mutmut: building the set always is equivalent (a cost, not a result).
        todo = set(ledger.todo) if any(a.released for a in self.asks.values()) else set()
        for p, a in list(self.asks.items()):
            if a.released:
                gone = p not in todo or now - a.at >= RESERVE_S
            else:
                gone = (ledger.leases.get(p) != (a.victim, a.lease)
                        or now - a.at >= ASK_AGAIN_S)
            if gone:
                del self.asks[p]
