"""trainfeed.decode.memory_budget: reservations fit the budget, a task larger than it runs alone,
and they are granted in arrival order."""
from __future__ import annotations

import threading
import time

import pytest

from trainfeed.decode.memory_budget import MemoryBudget


def run_tasks(budget: MemoryBudget, sizes: list[int], hold_s: float = 0.05) -> list[int]:
    """Runs one thread per size, each holding its reservation `hold_s`; returns the bytes in
    use seen by each task while it held its reservation."""
    seen: list[int] = []
    lock = threading.Lock()

    def task(nbytes: int) -> None:
        with budget.reserve(nbytes, f"task of {nbytes}"):
            with lock:
                seen.append(budget.in_use)
            time.sleep(hold_s)

    threads = [threading.Thread(target=task, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
        time.sleep(0.005)  # arrival order
    for t in threads:
        t.join(timeout=30)
    return seen


def test_reservations_never_pass_the_budget() -> None:
    budget = MemoryBudget(100, "test")
    seen = run_tasks(budget, [40] * 10)
    assert len(seen) == 10 and max(seen) <= 100 and budget.peak == 80
    assert budget.in_use == 0


def test_a_task_larger_than_the_budget_runs_alone() -> None:
    budget = MemoryBudget(100, "test")
    seen = run_tasks(budget, [30, 30, 250, 30, 30])
    assert 250 in seen  # alone: nothing else was reserved while it ran
    assert budget.peak == 250 and max(s for s in seen if s != 250) <= 100


def test_a_large_task_is_not_overtaken_by_small_ones() -> None:
    budget = MemoryBudget(100, "test")
    order: list[int] = []
    lock = threading.Lock()

    def task(nbytes: int) -> None:
        with budget.reserve(nbytes, "t"):
            with lock:
                order.append(nbytes)
            time.sleep(0.05)

    threads = [threading.Thread(target=task, args=(n,)) for n in (60, 90, 10, 10)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join(timeout=30)
    assert order == [60, 90, 10, 10]


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="≥ 1 byte"):
        MemoryBudget(0, "test")
