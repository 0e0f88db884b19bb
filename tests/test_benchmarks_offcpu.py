"""benchmarks/offcpu.py: each thread's time off its core, charged to what it slept on (issue 39).

The attribution is a pure function of `perf script`'s text, tested on text laid out as perf
prints it (the recording itself needs perf and root, which the suite cannot count on).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
from offcpu import reason, shares, switches  # noqa: E402  (after the sys.path set-up)


def switch(at: float, out: int, state: str, into: int, frames: tuple[str, ...] = ()) -> str:
    """One sched_switch as `perf script --call-graph dwarf` prints it, with its stack."""
    head = (f"python  {out} [000] {at:.6f}: sched:sched_switch: prev_comm=python "
            f"prev_pid={out} prev_prio=120 prev_state={state} ==> next_comm=python "
            f"next_pid={into} next_prio=120\n")
    return head + "".join(f"\t    {i:x} {name}+0x10 (/lib/libpython3.11.so)\n"
                          for i, name in enumerate(frames)) + "\n"


GIL = ("__futex_abstimed_wait_common", "take_gil", "PyEval_RestoreThread")
QUEUE = ("__new_sem_wait_slow64", "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock")


def test_a_thread_waiting_for_the_gil_and_one_waiting_for_work_are_told_apart() -> None:
    # Thread 1 runs 0-1 s, sleeps on the GIL until 3 s, runs to 4 s, then waits on a queue
    # until 6 s; thread 2 runs 1-3 s, is preempted (runnable) until 4 s, runs 6-8 s.
    text = "".join([
        switch(0.0, 99, "S", 1),
        switch(1.0, 1, "S", 2, GIL),
        switch(3.0, 2, "R", 1),
        switch(4.0, 1, "S", 2, QUEUE),
        switch(4.0, 2, "S", 99),  # thread 2 ran 4-4 s and sleeps until 6 s
        switch(6.0, 99, "S", 1),
        switch(6.0, 1, "S", 2),
        switch(8.0, 2, "S", 99),
    ])
    got = shares(text.splitlines(), {1: "decode_0", 2: "prefetch"})
    assert got["decode_0"] == {"on CPU": pytest.approx(2 / 8), "GIL wait": pytest.approx(2 / 8),
                               "lock/queue": pytest.approx(2 / 8)}
    assert got["prefetch"]["on CPU"] == pytest.approx(2 / 8 + 2 / 8)  # 1-3 s and 6-8 s
    assert got["prefetch"]["runnable"] == pytest.approx(1 / 8)


def test_threads_of_one_role_are_summed_and_other_processes_left_out() -> None:
    text = "".join([switch(0.0, 99, "S", 1), switch(1.0, 1, "S", 2, GIL),
                    switch(2.0, 2, "S", 1, GIL), switch(4.0, 1, "S", 99)])
    got = shares(text.splitlines(), {1: "trainfeed-decode_0", 2: "trainfeed-decode_1"},
                 role=lambda name: name.rstrip("_0123456789"))
    assert set(got) == {"trainfeed-decode"}  # thread 99 (another process) is not named
    decode = got["trainfeed-decode"]
    assert decode["on CPU"] == pytest.approx((1 + 2 + 1) / 4)  # thread 1: 0-1, 2-4; 2: 1-2
    assert decode["GIL wait"] == pytest.approx(1 / 4)  # thread 1, 1-2 s (2 never comes back)


def test_each_wait_is_named_by_the_stack_it_went_to_sleep_with() -> None:
    assert reason("R+", GIL) == "runnable"  # preempted: ready, no core
    assert reason("S", GIL) == "GIL wait"
    assert reason("S", ("pthread_cond_wait", "drop_gil")) == "GIL hand-off"
    assert reason("S", QUEUE) == "lock/queue"
    assert reason("D", ("folio_wait_bit_common", "filemap_read")) == "I/O"
    assert reason("S", ("epoll_wait",)) == "other"


def test_switches_keep_each_stack_with_its_switch_and_skip_other_lines() -> None:
    text = "noise that is not a switch\n" + switch(1.5, 7, "S", 8, GIL) + switch(2.5, 8, "R", 7)
    got = switches(text.splitlines())
    assert [(at, out, state, into) for at, out, state, _, into in got] == [
        (1.5, 7, "S", 8), (2.5, 8, "R", 7)]
    assert got[0][3] == list(GIL) and got[1][3] == []
    assert shares(["nothing"], {1: "x"}) == {}
