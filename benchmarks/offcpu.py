"""Why a process's threads are not on a core: per thread, the share of a window each spent on
CPU, runnable (waiting for a core), and asleep, by what it slept on (the GIL, a Python lock or
queue, I/O, anything else), from the kernel's scheduler switches.

py-spy's `--gil` says which thread holds the GIL, but not who waits: a stage that is rarely on
a core may be starved of the GIL, waiting for work, or waiting for its consumer, and only the
stack it went to sleep with tells which. `perf record -e sched:sched_switch --call-graph dwarf`
records that stack at every switch; CPython's own C functions name the wait:

- `take_gil`: waiting to take the GIL after a call that released it (or to start);
- `drop_gil`: a thread told to drop the GIL (after the switch interval) waits until another has
  taken it;
- `PyThread_acquire_lock_timed`: a Python `Lock`, `Condition`, `queue.Queue` or future: waiting
  for another stage;
- `read`, `preadv`, `filemap_read`, `folio_wait_bit_common`: I/O.

Needs Linux `perf` (Debian: `apt install linux-perf`) and the right to trace the process (root,
or `kernel.perf_event_paranoid` ≤ 1). benchmarks/reader_threads.py uses it with `--offcpu`:

    python benchmarks/reader_threads.py --storage DIR --dataset NAME --offcpu 6

A window's figures are per thread and summed over the threads of one role (a pool's threads,
or the threads of successive passes): a role of two threads can show up to 200 %.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

SWITCH = re.compile(r"^\S.*?\s([\d.]+): sched:sched_switch: .*?prev_pid=(\d+) .*?"
                    r"prev_state=(\S+) ==> .*?next_pid=(\d+)")
IO_FRAMES = ("preadv", "pread64", "read", "filemap_read", "folio_wait_bit_common")
# The user stack copied per switch: enough for the C frames from the futex up to CPython's
# wait (take_gil, PyThread_acquire_lock_timed) and a few above, small enough not to slow the
# traced process much (16 KB per switch doubled perf's own CPU, and lost samples).
STACK_BYTES = 4096
# The longest waits for perf: writing its buffers out after the window, and `perf script`.
STOP_S = 120
SCRIPT_S = 900


class Recording:
    """`perf record` of this process's scheduler switches, from `start()` to `stop()`."""

    def __init__(self, path: str, pid: int | None = None):
        self.path = path
        self.pid = pid if pid is not None else os.getpid()
        self._perf: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # On every core, not `-p`: a switch is recorded in the context of the thread leaving
        # the core, so `-p` would miss the switches that bring this process's threads back
        # from another process's. Filtered to switches from or to threads of this process's
        # name (its threads keep it); `shares` keeps this process's own.
        with open(f"/proc/{self.pid}/comm", encoding="utf-8") as f:
            comm = f.read().strip()
        self._perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-m", "64M", "-e", "sched:sched_switch",
             "--filter", f'prev_comm == "{comm}" || next_comm == "{comm}"',
             "--call-graph", f"dwarf,{STACK_BYTES}", "-o", self.path],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not (os.path.exists(self.path) and os.path.getsize(self.path) > 0):
            if self._perf.poll() is not None or time.monotonic() > deadline:
                said = self._perf.stderr.read().decode()[-500:] if self._perf.stderr else ""
                raise RuntimeError(f"perf record did not start: {said}")
            time.sleep(0.05)
        time.sleep(0.5)  # attached to every thread before the window starts

    def stop(self) -> None:
        """Ends the recording: perf writes its buffers out first (seconds for a busy window),
        at most STOP_S."""
        assert self._perf is not None
        self._perf.send_signal(signal.SIGINT)
        _say(f"perf record: writing {self.path}, until "
             f"{time.strftime('%H:%M:%S', time.localtime(time.time() + STOP_S))} at the latest")
        self._perf.wait(timeout=STOP_S)

    def script(self) -> Iterable[str]:
        """The recording as `perf script` prints it (unwinding every switch's stack: tens of
        seconds for a few seconds' window, at most SCRIPT_S)."""
        _say(f"perf script: unwinding {os.path.getsize(self.path) >> 20} MB of switches, until "
             f"{time.strftime('%H:%M:%S', time.localtime(time.time() + SCRIPT_S))} at the "
             f"latest")
        run = subprocess.run(["perf", "script", "-i", self.path], capture_output=True,
                             text=True, check=True, timeout=SCRIPT_S)
        return run.stdout.splitlines()


def _say(line: str) -> None:
    """A wait of more than a few seconds, said on stderr (the results go to stdout)."""
    print(line, file=sys.stderr, flush=True)


def reason(state: str, frames: Iterable[str]) -> str:
    """What a thread that was switched out in `state` with these stack frames waits for."""
    if state.startswith("R"):
        return "runnable"
    names = set(frames)
    if "take_gil" in names:
        return "GIL wait"
    if "drop_gil" in names:
        return "GIL hand-off"
    if "PyThread_acquire_lock_timed" in names or "acquire_timed" in names:
        return "lock/queue"
    if names.intersection(IO_FRAMES):
        return "I/O"
    return "other"


def switches(lines: Iterable[str]) -> list[tuple[float, int, str, list[str], int]]:
    """(time, thread out, its state, its stack's function names, thread in) per switch."""
    out: list[tuple[float, int, str, list[str], int]] = []
    for line in lines:
        match = SWITCH.match(line)
        if match:
            out.append((float(match.group(1)), int(match.group(2)), match.group(3), [],
                        int(match.group(4))))
        elif out and line.startswith(("\t", " ")) and line.strip():
            parts = line.split()
            if len(parts) >= 2:
                out[-1][3].append(parts[1].split("+")[0])
    return out


def shares(lines: Iterable[str], names: Mapping[int, str],
           role: Callable[[str], str] = lambda name: name) -> dict[str, dict[str, float]]:
    """Per role (of the threads in `names`), the share of the recorded window spent on CPU
    and in each wait; the shares of a role's threads are summed."""
    events = switches(lines)
    if len(events) < 2:
        return {}
    first, last = events[0][0], events[-1][0]
    spent: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    came_in: dict[int, float] = {}
    went_out: dict[int, tuple[float, str]] = {}
    for at, out, state, frames, into in events:
        if out in came_in:
            spent[out]["on CPU"] += at - came_in.pop(out)
        went_out[out] = (at, reason(state, frames))
        if into in went_out:
            since, why = went_out.pop(into)
            spent[into][why] += at - since
        came_in[into] = at
    window = last - first
    by_role: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for thread, times in spent.items():
        if thread in names:
            for what, seconds in times.items():
                by_role[role(names[thread])][what] += seconds / window
    return {r: {k: round(v, 3) for k, v in sorted(t.items(), key=lambda kv: -kv[1])}
            for r, t in by_role.items()}
