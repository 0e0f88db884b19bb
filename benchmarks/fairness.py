"""Whether a ratio between two sides of a benchmark is a fair figure (issue 39, item 1).

A ratio against a peer means something only when both sides got the cores they asked for and
nobody else was using the machine meanwhile: on a shared 2-core machine FFCV once kept 0.85 of
its 2 cores busy, and the 1.66x it "lost" by was the load, not the code. So each side's timed
pass records

- its busy cores: the CPU seconds of its own processes over the wall seconds of the pass;
- the foreign load: the machine's busy CPU seconds (/proc/stat, every core, idle and iowait
  left out) over the same window, less the side's own, per wall second;

and `verdict` gives a ratio only when every side had at least `MIN_SHARE` of the cores it asked
for and no more than `MAX_FOREIGN` cores of foreign load; otherwise "not comparable (why)".

"Had" means the machine gave them. A side that used under `MIN_SHARE` of its cores while the
machine held the rest idle for it (its `machine_cores` less the foreign load still covers
`MIN_SHARE` of what it asked) was not starved: it could not use them (a serial part, the GIL).
Its figure is then its own, and the ratio is printed with that said beside it
(`self_limited`), rather than refused: refusing it would hide exactly what a reader of the
table needs to see, a side that leaves cores idle. A side with no `machine_cores` (0) is held
to the strict rule. (A CPU quota the machine's counters do not show, such as a cgroup's, would
pass for idle cores: these benchmarks run without one.)

`verdict` is a pure function of measured numbers (tests/test_fairness.py); `PassMeter` measures
them around a pass that runs in child processes (the benchmarks' usual shape); a benchmark that
samples a process tree itself (benchmarks/imagenet_like.py's Sampler) builds `SideLoad` from its
own figures.

    with PassMeter(cores_asked=2) as meter:
        subprocess.run(cmd, check=True)
    side = meter.load("upload")
    print(ratio_text(cp_s / upload_s, [side, cp_side]))
"""
from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from trainfeed.cores import usable_cores

# The rule (39, item 1): a side with under 90 % of the cores it asked for was starved,
# and more than 0.2 cores of someone else's work in the window moves a 2-core figure by 10 %.
MIN_SHARE = 0.9
MAX_FOREIGN = 0.2


@dataclasses.dataclass(frozen=True)
class SideLoad:
    """What one side of a comparison got during its timed pass.

    Attributes:
        side: its name in the table ("ffcv", "cp").
        cores_asked: the cores it was set up to use (its worker count, capped at the machine's
            cores: a side cannot be asked for more than there are).
        cores_busy: its own CPU seconds / wall seconds of the pass.
        foreign_cores: the machine's other busy CPU seconds / wall seconds of the pass.
        machine_cores: the cores of the machine it ran on (0: unknown; see the module
            docstring on sides that leave cores idle).
    """

    side: str
    cores_asked: float
    cores_busy: float
    foreign_cores: float
    machine_cores: float = 0.0

    def __post_init__(self) -> None:
        if not self.cores_asked > 0:
            raise ValueError(f"{self.side}: cores_asked {self.cores_asked!r} must be > 0 "
                             "(a side runs on at least part of one core)")

    def as_dict(self) -> dict[str, Any]:
        return {"side": self.side, "cores_asked": round(self.cores_asked, 3),
                "cores_busy": round(self.cores_busy, 3),
                "foreign_cores": round(self.foreign_cores, 3),
                "machine_cores": self.machine_cores}

    def short_of_share(self, min_share: float = MIN_SHARE) -> bool:
        return self.cores_busy < min_share * self.cores_asked

    def left_cores_idle(self, min_share: float = MIN_SHARE) -> bool:
        """Whether the cores it did not use were there for it: the machine less the foreign
        load covers its share."""
        return (self.machine_cores > 0
                and self.machine_cores - self.foreign_cores >= min_share * self.cores_asked)


def cores_asked(workers: float, cores: int | None = None) -> float:
    """The cores a side asking for `workers` busy threads or processes can get: no more than
    `cores`, by default the cores this process may run on (`every_core`)."""
    return float(min(workers, cores or every_core()))


def every_core() -> int:
    """What a side that works on every core asks for: the cores in this process's CPU
    affinity, which `taskset` or a container's cpuset narrow, as trainfeed's own decode pool
    counts them (trainfeed.cores), not os.cpu_count()'s machine. A side run under `taskset -c
    0` on 2 cores asked for 1: counted against 2, it would read as starved."""
    return usable_cores()


def verdict(sides: Sequence[SideLoad], min_share: float = MIN_SHARE,
            max_foreign: float = MAX_FOREIGN) -> str | None:
    """None when the sides' figures are comparable, else why not (every reason, one phrase each).

    Pure: a function of the measured numbers only, so the rule is tested without a machine.
    """
    if not sides:
        return "no side measured"
    why = []
    for s in sides:
        if s.short_of_share(min_share) and not s.left_cores_idle(min_share):
            why.append(f"{s.side} had {s.cores_busy:.2f} of the {s.cores_asked:g} cores it "
                       f"asked for ({s.cores_busy / s.cores_asked:.0%} < {min_share:.0%})")
        if s.foreign_cores > max_foreign:
            why.append(f"foreign load {s.foreign_cores:.2f} cores during {s.side} "
                       f"(> {max_foreign:g})")
    return "; ".join(why) or None


def self_limited(sides: Sequence[SideLoad], min_share: float = MIN_SHARE) -> str | None:
    """The sides that used under `min_share` of their cores with the rest idle for them (not a
    refusal: see the module docstring), said in one phrase; None when there is none."""
    said = [f"{s.side} used {s.cores_busy:.2f} of its {s.cores_asked:g} cores, the machine's "
            f"other cores idle (foreign {s.foreign_cores:.2f})"
            for s in sides if s.short_of_share(min_share) and s.left_cores_idle(min_share)]
    return "self-limited: " + "; ".join(said) if said else None


def ratio_text(ratio: float | None, sides: Sequence[SideLoad], fmt: str = "{:.2f}x") -> str:
    """The ratio formatted when the sides are comparable (with any side that left cores idle
    said beside it), else "not comparable (why)"; "-" when there is no ratio (a side did not
    run)."""
    if ratio is None:
        return "-"
    why = verdict(sides)
    if why is not None:
        return f"not comparable ({why})"
    limited = self_limited(sides)
    return fmt.format(ratio) + (f" ({limited})" if limited else "")


def loads_text(sides: Sequence[SideLoad]) -> str:
    """Each side's busy cores of those asked and the foreign load: the figures a reader needs
    to judge a ratio, printed beside it."""
    return ", ".join(f"{s.side} {s.cores_busy:.2f}/{s.cores_asked:g} cores, foreign "
                     f"{s.foreign_cores:.2f}" for s in sides)


def side_of(row: Mapping[str, Any], cores: float) -> SideLoad:
    """A benchmark row's SideLoad: its `method`, `cores_busy`, `foreign_cores`, and
    `cores_asked` (`cores` for rows written before it was recorded); the machine's cores are
    `cores` (the machine the rows were measured on)."""
    return SideLoad(str(row["method"]), float(row.get("cores_asked") or cores),
                    float(row["cores_busy"]), float(row["foreign_cores"]), float(cores))


def pass_ratios_text(passes: Sequence[tuple[float, Sequence[SideLoad]]]) -> str:
    """Ratios measured pass by pass, each with the sides of its pass: the median of the fair
    passes' ratios with each pass's ("n/c" for a pass that was not fair: its number is not
    printed), or "not comparable (why)" when no pass was fair."""
    if not passes:
        return "-"
    fair = [r for r, sides in passes if verdict(sides) is None]
    if not fair:
        return f"not comparable ({verdict(passes[0][1])})"
    each = ", ".join(f"{r:.2f}" if verdict(sides) is None else "n/c" for r, sides in passes)
    busy: dict[str, list[SideLoad]] = {}
    for _, sides in passes:
        if verdict(sides) is None:
            for s in sides:
                if s.short_of_share() and s.left_cores_idle():
                    busy.setdefault(s.side, []).append(s)
    limited = "; ".join(
        f"{side} used {statistics.median(s.cores_busy for s in ss):.2f} of its "
        f"{ss[0].cores_asked:g} cores in {len(ss)} of {len(fair)} fair passes, the rest idle"
        for side, ss in busy.items())
    return (f"{statistics.median(fair):.2f}x ({each})"
            + (f" (self-limited: {limited})" if limited else ""))


def fair_median(passes: Sequence[tuple[float, Sequence[SideLoad]]]) -> float | None:
    """The median ratio of the fair passes, or None when no pass was fair (for JSON: the
    number a table prints with `pass_ratios_text`)."""
    fair = [r for r, sides in passes if verdict(sides) is None]
    return statistics.median(fair) if fair else None


def pass_records(passes: Sequence[tuple[float, Sequence[SideLoad]]]) -> list[dict[str, Any]]:
    """Every pass's ratio with its verdict and loads, for a results file (the table prints
    only the fair ones)."""
    return [{"ratio": round(r, 4), "fair": verdict(sides) is None, "why": verdict(sides),
             "sides": [s.as_dict() for s in sides]} for r, sides in passes]


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot, from /proc/stat's first line: every
    field but idle and iowait (guest time is already inside user and nice, so it is left out)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class PassMeter:
    """Measures one side's timed pass: its busy cores and the foreign load in the window.

    The side's CPU is `own_cpu_s()`'s difference across the pass; by default the children's
    rusage, which counts a child once it has been waited for (subprocess.run does): run the
    side in child processes and wait for them inside the `with` block. The harness's own CPU
    in the window (this process) is subtracted from the foreign load too.
    Not thread-safe: one pass at a time per meter.
    """

    def __init__(self, cores_asked: float,
                 own_cpu_s: Callable[[], float] = children_cpu_s) -> None:
        self.cores_asked = cores_asked
        self._own = own_cpu_s
        self.seconds = self.own_s = self.machine_s = self.harness_s = 0.0

    @staticmethod
    def _self_cpu_s() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self) -> PassMeter:
        self._t0, self._own0 = time.perf_counter(), self._own()
        self._machine0, self._self0 = machine_busy_s(), self._self_cpu_s()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.own_s = self._own() - self._own0
        self.machine_s = machine_busy_s() - self._machine0
        self.harness_s = self._self_cpu_s() - self._self0

    def load(self, side: str) -> SideLoad:
        """The pass's figures as a SideLoad (after the `with` block)."""
        wall = max(self.seconds, 1e-9)
        foreign = max(0.0, self.machine_s - self.own_s - self.harness_s) / wall
        return SideLoad(side, self.cores_asked, self.own_s / wall, foreign,
                        float(os.cpu_count() or 1))
