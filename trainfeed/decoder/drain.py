"""A decoder's drain on SIGTERM (issue 37): the pure state, time as an argument.

Kubernetes stops a decoder pod (a scale-down, a rollout) with SIGTERM, then SIGKILL after the
pod's terminationGracePeriodSeconds (30 s by default). A decoder killed at once cuts every
trainer call in flight: the trainer asks another decoder for the rest, so nothing is lost, but
up to a chunk is decoded twice and the trainer waits. Draining instead: the decoder leaves the
master's list, refuses new calls (the trainer asks another decoder at once, not counting it a
failure) and lets the calls in flight finish, for at most `grace_s` (DRAIN_S by default, under
Kubernetes' 30 s); whatever is still in flight then is cut, and its trainer resumes it elsewhere
from the last record it received.

`Drain` only decides: whether calls are admitted, whether the drain is over, and when to say
what it still waits for (no silent waits: after LOG_AFTER_S, then every LOG_EVERY_S). The
signals, the wait and the server are trainfeed.decoder.stopping's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["DRAIN_S", "Drain"]

# Seconds calls in flight may take to finish after SIGTERM: a call of a 256-record partition
# takes a few seconds on a loaded decoder, and this leaves 10 s of Kubernetes' default 30 s
# terminationGracePeriodSeconds for the process to exit (the Deployment `trainfeed submit`
# makes sets that period to DRAIN_S + 10: trainfeed.cluster.manifests).
DRAIN_S = 20.0
# A drain that lasts this long says what it waits for and until when, then every LOG_EVERY_S
# (as every wait of trainfeed over 5 s does).
LOG_AFTER_S = 5.0
LOG_EVERY_S = 5.0


@dataclass
class Drain:
    """Accepting until `begin(now)`; then draining until no call is in flight or the grace is
    over. Times are monotonic seconds. Not thread-safe: its owner locks around it."""

    grace_s: float = DRAIN_S
    log_after_s: float = LOG_AFTER_S
    log_every_s: float = LOG_EVERY_S
    began: float | None = None
    _next_log: float = float("inf")

    def __post_init__(self) -> None:
        if not self.grace_s >= 0:
            raise ValueError(f"drain grace {self.grace_s!r}: expected seconds ≥ 0")

    @property
    def accepting(self) -> bool:
        """Whether a new call is admitted (not once draining began)."""
        return self.began is None

    @property
    def deadline(self) -> float:
        """When calls still in flight are cut (inf before the drain)."""
        return float("inf") if self.began is None else self.began + self.grace_s

    def begin(self, now: float) -> bool:
        """Starts draining at `now`; False if it already had (a second signal: see `cut`)."""
        if self.began is not None:
            return False
        self.began = now
        self._next_log = now + self.log_after_s
        return True

    def cut(self, now: float) -> None:
        """Ends the grace at `now` (a second signal: stop without waiting any longer)."""
        if self.began is None:
            self.begin(now)
        self.grace_s = min(self.grace_s, max(0.0, now - (self.began or now)))

    def over(self, now: float, in_flight: int) -> bool:
        """Whether the drain is done: nothing in flight, or the grace is over."""
        return self.began is not None and (in_flight == 0 or now >= self.deadline)

    def log_due(self, now: float) -> bool:
        """Whether to say now what the drain still waits for (True at most once per
        log_every_s, from log_after_s into the drain)."""
        if now < self._next_log:
            return False
        self._next_log = now + self.log_every_s
        return True

    def until(self, now: float, wall_now: float | None = None) -> str:
        """The deadline as a wall-clock time (HH:MM:SS, local), for a message."""
        wall = time.time() if wall_now is None else wall_now
        return time.strftime("%H:%M:%S", time.localtime(wall + max(0.0, self.deadline - now)))
