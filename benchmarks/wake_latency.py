"""What waking a sleeping thread costs: two Python threads hand a token back and forth, on two
cores and on one (issue 39).

A reader thread that finds the GIL held, or its queue empty, sleeps; the thread that lets it go
on must wake it, and until the woken thread runs, the core it sleeps on idles. This measures
that hand-off as the reader's threads pay it: two threads alternate through two semaphores
(each hand-off is a futex wake-up and a GIL transfer), pinned to two different cores (a wake-up
across cores, as between a decode thread and a load thread) and then both to one core. The
figure is per hand-off (half a round trip), the median of `--rounds` runs of `--trips` round
trips each. On a VM a wake-up across cores may cost an inter-processor interrupt to a halted
virtual CPU: compare the two rows.

    python benchmarks/wake_latency.py
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence


def hand_offs_us(trips: int, cores: tuple[int, int]) -> float:
    """µs per hand-off of `trips` round trips between this thread, on cores[0], and another,
    on cores[1] (Linux: sched_setaffinity(0) pins the calling thread)."""
    mine, theirs = threading.Semaphore(0), threading.Semaphore(0)

    def other() -> None:
        os.sched_setaffinity(0, {cores[1]})
        for _ in range(trips):
            mine.acquire()
            theirs.release()

    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cores[0]})
    try:
        thread = threading.Thread(target=other)
        thread.start()
        started = time.perf_counter()
        for _ in range(trips):
            mine.release()
            theirs.acquire()
        seconds = time.perf_counter() - started
        thread.join()
    finally:
        os.sched_setaffinity(0, allowed)
    return seconds / trips / 2 * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trips", type=int, default=20_000, help="round trips per run")
    p.add_argument("--rounds", type=int, default=5, help="runs per row (the median is shown)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    if not hasattr(os, "sched_setaffinity"):
        p.error("needs Linux's sched_setaffinity to pin the two threads")
    usable = sorted(os.sched_getaffinity(0))
    rows = {"one core": (usable[0], usable[0])}
    if len(usable) > 1:
        rows["two cores"] = (usable[0], usable[1])
    figures = {name: round(statistics.median(hand_offs_us(args.trips, cores)
                                             for _ in range(args.rounds)), 2)
               for name, cores in rows.items()}
    if args.json:
        print(json.dumps(figures))
        return 0
    print("| threads on | µs per hand-off (median) |\n|---|---:|")
    for name, us in figures.items():
        print(f"| {name} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
