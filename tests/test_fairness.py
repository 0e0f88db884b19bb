"""benchmarks/fairness.py: a ratio against a peer is printed only from a fair window (issue 39).

The verdict is a pure function of measured numbers (tested on numbers); the meter is tested on
a real busy-loop child, with bounds that hold on a loaded machine (it may get little CPU, never
more than the cores there are).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
from fairness import (  # noqa: E402  (after the sys.path set-up)
    PassMeter,
    SideLoad,
    cores_asked,
    loads_text,
    machine_busy_s,
    pass_ratios_text,
    ratio_text,
    verdict,
)


def test_both_sides_with_their_cores_and_no_foreign_load_are_comparable() -> None:
    sides = [SideLoad("ffcv", 2, 1.93, 0.05), SideLoad("trainfeed", 2, 1.8, 0.2)]
    assert verdict(sides) is None
    assert ratio_text(0.97, sides) == "0.97x"


def test_a_starved_side_makes_the_ratio_not_comparable_and_says_which() -> None:
    # The case: FFCV kept 0.85 of its 2 cores busy, and the ratio read 1.66x.
    sides = [SideLoad("ffcv", 2, 0.85, 0.1), SideLoad("trainfeed", 2, 1.9, 0.1)]
    why = verdict(sides)
    assert why is not None and "ffcv had 0.85 of the 2 cores" in why and "trainfeed" not in why
    text = ratio_text(1.66, sides)
    assert text.startswith("not comparable (") and "1.66" not in text


def test_foreign_load_over_the_bound_makes_the_ratio_not_comparable() -> None:
    sides = [SideLoad("cp", 1, 1.0, 0.21), SideLoad("upload", 2, 1.95, 0.0)]
    why = verdict(sides)
    assert why == "foreign load 0.21 cores during cp (> 0.2)"
    assert ratio_text(2.0, sides) == f"not comparable ({why})"


def test_the_bounds_are_inclusive_and_every_reason_is_listed() -> None:
    assert verdict([SideLoad("a", 2, 1.8, 0.2)]) is None  # exactly 90 %, exactly 0.2 cores
    why = verdict([SideLoad("a", 2, 1.79, 0.3), SideLoad("b", 1, 0.5, 0.0)])
    assert why is not None and why.count(";") == 2, why
    assert verdict([]) == "no side measured"
    assert ratio_text(None, [SideLoad("a", 1, 1, 0)]) == "-"


def test_cores_asked_is_capped_at_the_machine_and_must_be_positive() -> None:
    assert cores_asked(16, cores=2) == 2.0
    assert cores_asked(1, cores=2) == 1.0
    with pytest.raises(ValueError, match="cores_asked 0"):
        SideLoad("x", 0, 1.0, 0.0)
    assert loads_text([SideLoad("x", 2, 1.5, 0.25)]) == "x 1.50/2 cores, foreign 0.25"


def test_a_side_on_every_core_asks_for_the_cores_its_affinity_allows() -> None:
    # Under `taskset -c 0` on a 2-core machine, a side "on every core" can get 1: counted
    # against os.cpu_count()'s 2, it read as starved and its ratio was refused.
    script = ("import os, sys\n"
              f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
              "from fairness import cores_asked, every_core\n"
              "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
              "print(every_core(), cores_asked(16), cores_asked(16, cores=3))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["1", "1.0", "3.0"]


BUSY_LOOP = ("import time\nend = time.process_time() + {cpu}\n"
             "while time.process_time() < end: pass\n")


def test_a_busy_loop_child_is_measured_as_its_cores_and_the_rest_as_foreign() -> None:
    """A child spinning for 0.5 CPU-seconds: its CPU is seen (at least what it spun), its busy
    cores are > 0 and at most one core (one thread) plus rounding, the foreign load is within
    the machine. On a loaded machine it may get a small share of a core: no lower speed bound."""
    cores = os.cpu_count() or 1
    busy0 = machine_busy_s()
    with PassMeter(cores_asked=1) as meter:
        subprocess.run([sys.executable, "-c", BUSY_LOOP.format(cpu=0.5)], check=True,
                       timeout=120)
    side = meter.load("loop")
    assert meter.own_s >= 0.45  # spun 0.5 s of CPU (the clock tick is 10 ms)
    assert 0 < side.cores_busy <= 1.1
    assert 0 <= side.foreign_cores <= cores + 0.1
    assert machine_busy_s() - busy0 >= meter.own_s - 0.05  # the machine saw the child's CPU
    assert side.cores_asked == 1 and side.side == "loop"


def test_a_side_that_leaves_idle_cores_unused_is_said_not_refused() -> None:
    """A side under its share while the machine held the rest idle was not starved (its own
    serial part): the ratio stands, with that said. The same figures with the idle cores taken
    by foreign load, or on a machine of unknown size, are refused."""
    raw = SideLoad("trainfeed-raw", 2, 1.57, 0.03, machine_cores=2)
    ffcv = SideLoad("ffcv", 2, 1.87, 0.03, machine_cores=2)
    assert verdict([ffcv, raw]) is None
    text = ratio_text(1.9, [ffcv, raw])
    assert text.startswith("1.90x (self-limited: trainfeed-raw used 1.57 of its 2 cores"), text
    assert "ffcv" not in text
    # The cores it did not use were someone else's: starved, refused.
    taken = SideLoad("trainfeed-raw", 2, 1.57, 0.25, machine_cores=2)
    assert "trainfeed-raw had 1.57 of the 2 cores" in (verdict([ffcv, taken]) or "")
    # A machine of unknown size: the strict rule.
    assert verdict([ffcv, SideLoad("trainfeed-raw", 2, 1.57, 0.03)]) is not None
    passes = [(1.9, [ffcv, raw]), (1.8, [ffcv, raw]), (2.5, [ffcv, taken])]
    assert pass_ratios_text(passes) == (
        "1.85x (1.90, 1.80, n/c) (self-limited: trainfeed-raw used 1.57 of its 2 cores in 2 of "
        "2 fair passes, the rest idle)")
