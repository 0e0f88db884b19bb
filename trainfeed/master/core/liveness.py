"""Which of a job's reader sessions are alive: the one definition behind the status page's
"readers alive", `/status.json`'s `workers_alive`, `trainfeed status --watch` and the
`trainfeed_workers_alive` / `trainfeed_readers_silent` metrics (issue 38).

Before, the page counted sessions heard from within three lease timeouts and flagged the same
readers `silent` after one: processes that had exited 72 s earlier showed as "readers alive 2"
beside their `silent` flags, while a dashboard read another figure. Now each session is exactly
one of:

- **alive**: it has not left (LeaveJob forgets it: `Job.workers` no longer has it) and was heard
  from within one lease timeout. A reader calls at least every third of it (its heartbeat), so
  a live reader never drops out; past it, its leases expire and its records go to others.
- **silent**: not heard from for a lease timeout, but within the live window (three lease
  timeouts) the master keeps a session for its session cap and fair shares
  (Coordinator.live_window_s): a process killed, stopped or cut off.
- gone: quieter still (forgotten), or it left.

Pure: time is an argument. Every figure shown reads these functions, so two views taken at the
same `now` agree, and views taken one scrape interval apart differ only by what happened in it.
"""
from __future__ import annotations

from collections.abc import Mapping

# Sessions stay known (for the session cap and fair shares) this many lease timeouts after
# their last call (Coordinator.live_window_s): the window of `silent`.
SESSION_LEASES = 3


def is_alive(seen: float, now: float, lease_timeout_s: float) -> bool:
    """A session last heard from at `seen` (and not left) is alive at `now`."""
    return now - seen <= lease_timeout_s


def is_silent(seen: float, now: float, lease_timeout_s: float) -> bool:
    """Quiet for more than a lease timeout, but still within the sessions' window."""
    return lease_timeout_s < now - seen <= SESSION_LEASES * lease_timeout_s


def readers_alive(workers: Mapping[str, float], now: float, lease_timeout_s: float) -> int:
    """How many of `workers` (worker id -> when last heard; those that left are not in it) are
    alive at `now`. O(sessions)."""
    return sum(1 for seen in workers.values() if is_alive(seen, now, lease_timeout_s))


def readers_silent(workers: Mapping[str, float], now: float, lease_timeout_s: float) -> int:
    """How many of `workers` are silent at `now` (see the module's docstring)."""
    return sum(1 for seen in workers.values() if is_silent(seen, now, lease_timeout_s))
