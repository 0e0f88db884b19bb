"""How many decode workers a job's pool should run (issue 37): a pure policy, time an argument.

The master sees what each trainer waits for its data (its input-bound share: wait over wall over
the reader's last RECENT_S, trainfeed.master.core.reader_stats) and how busy each decoder is (the
share of its time spent decoding). From those, the pool's current size and its bounds
(`trainfeed submit --decoders MIN:MAX`) `DecoderScaler.decide` says what the size should be, and
why:

- **up** while the trainers of a job are input-bound (its share over UP_INPUT_BOUND) *and* the
  decoders are busy (their mean share over UP_BUSY): more decoders can help only when the ones
  there are the bottleneck, not when storage or the network is. The step is the estimate of what
  would feed the trainers: a trainer that waits a share `w` of its time gets `1 - w` of the data
  it could take, so `replicas / (1 - w)` decoders would feed it; at least one more, at most
  double (as Kubernetes' HPA scales up at most 100 % per period by default), within MAX.
- **down** when the decoders idle (mean share under DOWN_BUSY) and no trainer is input-bound: to
  the size that would run the same work at DOWN_TARGET_BUSY, at least one fewer, within MIN.
  A pool whose trainers stopped (busy 0) goes to MIN in one step.
- **hold** otherwise, and always within `cooldown_s` of the previous change: the trainers' shares
  are averaged over RECENT_S, so figures taken sooner still describe the old size.

A size outside MIN..MAX (someone ran `kubectl scale`) is brought back within them (a change like
any other, cooldown included). Each decision carries a short `reason` code (a Prometheus label:
few values) and a `detail` text for the status page (it names jobs: escape it in HTML).

Not thread-safe; one scaler per decoder pool. No I/O: trainfeed.cluster.decoders applies the
decisions to the Kubernetes Deployment.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainfeed.master.core.reader_stats import RECENT_S, ReaderView

# The thresholds. A trainer waiting over a tenth of its time loses a tenth of its GPU;
# under that, a few per cent of waiting is the normal jitter of a prefetch queue.
UP_INPUT_BOUND = 0.10
# Decoders busier than this are what limits the trainers (below it, something else does).
UP_BUSY = 0.80
# Decoders idle this much could be fewer.
DOWN_BUSY = 0.50
# The busy share a pool is shrunk to: between DOWN_BUSY and UP_BUSY, so that a shrunk pool is
# neither shrunk again nor grown at the next decision by the same load.
DOWN_TARGET_BUSY = 0.65
# Twice the trainers' stats window (reader_stats.RECENT_S, 30 s): the decision after a change
# reads figures measured with the new size only.
DEFAULT_COOLDOWN_S = 60.0
# A trainer waiting 100 % of the time gives no estimate (replicas / 0): it counts as this.
MAX_SHARE_ESTIMATE = 0.95
# An upper bound on MAX: a typo (`--decoders 1:10000`) must not ask a cluster for 10,000 pods.
MAX_DECODERS = 1000

UP, DOWN, HOLD = "up", "down", "hold"
# The reason codes (Prometheus label values): why a decision was taken.
# ("api-error": the shell, trainfeed.cluster.decoders, could not read or patch the pool.)
REASONS = ("input-bound", "idle", "below-min", "above-max", "cooldown", "at-max", "at-min",
           "not-busy", "steady", "no-figures", "api-error")


@dataclass(frozen=True)
class Bounds:
    """`--decoders MIN:MAX`: the pool's size stays within these (MIN == MAX: a fixed size)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high <= MAX_DECODERS:
            raise ValueError(f"--decoders {self.low}:{self.high}: expected 1 <= MIN <= MAX <= "
                             f"{MAX_DECODERS} (trainers that decode remotely need at least one "
                             f"decoder), e.g. 1:8")

    @classmethod
    def parse(cls, text: str) -> Bounds:
        """`"N"` (a fixed size) or `"MIN:MAX"`; a ValueError naming the text otherwise."""
        low, colon, high = text.partition(":")
        try:
            if len(text) > 16:  # "1000:1000" is 9; a longer text is no bounds (nor 5,000 digits)
                raise ValueError
            bounds = (int(low), int(high)) if colon else (int(low), int(low))
        except ValueError:
            # (Shortened: the text may come from a Deployment's annotation, anyone's who may
            # annotate Deployments in the namespace.)
            raise ValueError(f"--decoders {text[:40]!r}: expected N, MIN:MAX or auto, e.g. 4 "
                             f"or 1:8") from None
        return cls(*bounds)

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def __str__(self) -> str:
        return f"{self.low}:{self.high}"


@dataclass(frozen=True)
class Observation:
    """What the decision reads, all taken at one time.

    Attributes:
        trainers: job -> the input-bound share (0..1) of each of its trainers; a job with no
            trainer heard from is absent (or an empty sequence).
        decoders_busy: the busy share (0..1) of each decoder heard from; empty when none is.
        replicas: the pool's size now (the Deployment's spec.replicas).
    """

    trainers: Mapping[str, Sequence[float]]
    decoders_busy: Sequence[float]
    replicas: int


@dataclass(frozen=True)
class Decision:
    """What to set the pool's size to (`replicas`, equal to `before` for a hold), and why."""

    at: float
    action: str  # UP, DOWN or HOLD
    before: int
    replicas: int
    reason: str  # one of REASONS
    detail: str  # a sentence for people (names jobs: escape it in HTML)
    busy: float  # the decoders' mean busy share, 0 if none reported
    input_bound: float  # the most input-bound job's share, 0 if no trainer

    @property
    def changes(self) -> bool:
        return self.replicas != self.before

    def view(self) -> dict[str, object]:
        """JSON-ready, for the status page and /status.json (the `detail` unescaped)."""
        return {"at": self.at, "action": self.action, "before": self.before,
                "replicas": self.replicas, "reason": self.reason, "detail": self.detail,
                "decoders_busy": round(self.busy, 4), "input_bound": round(self.input_bound, 4)}


def trainer_shares(views: Iterable[ReaderView]) -> list[float]:
    """The input-bound shares of a job's trainers from the master's reader board
    (`ReaderBoard.views(job, now)`): those heard from within RECENT_S only. A reader quiet for
    longer has no current figures (its window is empty, its share reads 0): counting it would
    pull its job's mean down, and a job whose trainers stopped must count as having none."""
    return [v.input_bound for v in views if v.last_contact_s <= RECENT_S]


def _job_share(shares: Sequence[float]) -> float:
    """A job's input-bound share: the mean of its trainers' (one slow trainer holds a
    synchronous job back, but asynchronous trainers each lose their own share)."""
    clean = [min(1.0, max(0.0, s)) for s in shares if not math.isnan(s)]
    return sum(clean) / len(clean) if clean else 0.0


def _worst_job(trainers: Mapping[str, Sequence[float]]) -> tuple[str, float]:
    """The most input-bound job and its share ("", 0.0 without trainers)."""
    worst, share = "", 0.0
    for job in sorted(trainers):
        value = _job_share(trainers[job])
        if value > share:
            worst, share = job, value
    return worst, share


def _max_trainer(trainers: Mapping[str, Sequence[float]]) -> float:
    """The largest share of any one trainer (0 without trainers)."""
    return max((s for shares in trainers.values() for s in shares if not math.isnan(s)),
               default=0.0)


def _mean_busy(busy: Sequence[float]) -> float | None:
    clean = [min(1.0, max(0.0, b)) for b in busy if not math.isnan(b)]
    return sum(clean) / len(clean) if clean else None


class DecoderScaler:
    """The scaling decisions of one decoder pool; remembers when it last changed the size.

    Args:
        bounds: MIN:MAX of the pool.
        cooldown_s: no two changes closer than this (seconds of the `now` given to `decide`).
    """

    def __init__(self, bounds: Bounds, cooldown_s: float = DEFAULT_COOLDOWN_S):
        if not cooldown_s >= 0:  # NaN too
            raise ValueError(f"cooldown {cooldown_s!r}: expected seconds >= 0")
        self.bounds = bounds
        self.cooldown_s = cooldown_s
        self.last_change: float | None = None
        self.last: Decision | None = None

    def decide(self, now: float, seen: Observation) -> Decision:
        """The decision at `now`; a change is remembered as made (the shell applies it, and
        calls `failed` if it could not)."""
        job, share = _worst_job(seen.trainers)
        mean = _mean_busy(seen.decoders_busy)
        busy = 0.0 if mean is None else mean
        replicas, reason, detail = self._choose(now, seen.replicas, job, share, mean,
                                                _max_trainer(seen.trainers))
        n = seen.replicas
        action = UP if replicas > n else DOWN if replicas < n else HOLD
        decision = Decision(now, action, n, replicas, reason, detail, busy, share)
        if decision.changes:
            self.last_change = now
        self.last = decision
        return decision

    def failed(self) -> None:
        """The last change could not be applied: the next decision need not wait a cooldown."""
        self.last_change = None

    def _choose(self, now: float, n: int, job: str, share: float, busy: float | None,
                trainer_max: float) -> tuple[int, str, str]:
        """(replicas, reason, detail) for a pool of `n` whose most input-bound job is `job`
        (at `share`; its most input-bound trainer at `trainer_max`)."""
        low, high = self.bounds.low, self.bounds.high
        if self.last_change is not None and now - self.last_change < self.cooldown_s:
            return n, "cooldown", (f"last change {now - self.last_change:.0f} s ago, cooldown "
                                   f"{self.cooldown_s:g} s")
        if n < low:
            return low, "below-min", f"{n} decoders, under the minimum {low}"
        if n > high:
            return high, "above-max", f"{n} decoders, over the maximum {high}"
        if busy is None:
            return n, "no-figures", "no decoder has reported how busy it is"
        figures = (f"job {job!r} input-bound {share:.0%}" if job else "no trainer input-bound")
        figures += f", decoders busy {busy:.0%}"
        if share > UP_INPUT_BOUND:
            return self._up(n, busy, share, figures)
        if busy >= DOWN_BUSY:
            return n, "steady", figures
        if trainer_max > UP_INPUT_BOUND:  # one trainer is, though its job's mean is not
            return n, "steady", f"{figures}; a trainer is input-bound {trainer_max:.0%}"
        if n <= low:
            return n, "at-min", f"{figures}; at the minimum {low}"
        target = max(low, min(n - 1, math.ceil(n * busy / DOWN_TARGET_BUSY)))
        return target, "idle", (f"{figures} (< {DOWN_BUSY:.0%}, no trainer over "
                                f"{UP_INPUT_BOUND:.0%})")

    def _up(self, n: int, busy: float, share: float, figures: str) -> tuple[int, str, str]:
        if busy <= UP_BUSY:
            return n, "not-busy", (f"{figures}: the decoders are not what the trainers wait for "
                                   f"(busy <= {UP_BUSY:.0%}); look at storage and the network")
        high = self.bounds.high
        if n >= high:
            return n, "at-max", (f"{figures}; at the maximum {high} (raise it with --decoders "
                                 f"MIN:MAX)")
        wanted = math.ceil(n / (1 - min(share, MAX_SHARE_ESTIMATE)))
        target = min(high, max(n + 1, min(2 * n, wanted)))
        return target, "input-bound", (f"{figures} (> {UP_INPUT_BOUND:.0%} and > "
                                       f"{UP_BUSY:.0%})")
