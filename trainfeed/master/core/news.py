"""What the master tells reader sessions between their own messages: the core's outbox.

Every reader session speaks on one Session stream (issue 36). What the master must tell a session
that did not ask (a give-back asked of it, leases taken from it, the end of an epoch, a broken
synchronous group, being superseded) is a `Told`: the core appends it here as it decides it, and
the shell (trainfeed.master.serve.service) takes every `Told` after each call into the core and
sends it on the session's stream. Only sessions with a stream open (`watching`) are told: one
without learns what still matters from the answer to its next message (revoked and give_back
are computed from the leases it lists), so nothing queues here for a reader that went away.

Pure: no clock, socket or thread; the shell owns the streams and their bounds.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainfeed.master.core import admission
from trainfeed.master.core.jobs import Job
from trainfeed.master.core.messages import (
    EpochComplete,
    Event,
    GiveBack,
    GroupBroken,
    HeldTask,
    Revoked,
    Superseded,
)


@dataclass(frozen=True)
class Told:
    """One event for session `worker` of job `job`."""

    job: str
    worker: str
    event: Event


@dataclass
class Newsroom:
    """The sessions that have a stream open, and what they are to be told (not yet taken)."""

    watching: set[tuple[str, str]] = field(default_factory=set)
    pending: list[Told] = field(default_factory=list)

    def watches(self, job: str, worker: str) -> bool:
        return (job, worker) in self.watching

    def take(self) -> list[Told]:
        """Everything told since the last take, oldest first."""
        told, self.pending = self.pending, []
        return told

    def tell(self, job: Job, worker: str, event: Event) -> None:
        if (job.name, worker) in self.watching:
            self.pending.append(Told(job.name, worker, event))

    def revoked(self, job: Job, taken: Iterable[tuple[int, tuple[str, int] | None]],
                why: str) -> None:
        """Tells each watching former holder the leases just taken from it (partition, its
        last lease as (holder, token))."""
        epoch = job.ledger.epoch
        by_worker: dict[str, list[HeldTask]] = {}
        for p, lease in taken:
            if lease is not None and self.watches(job.name, lease[0]):
                by_worker.setdefault(lease[0], []).append(HeldTask(epoch, p, lease[1]))
        for worker, revoked in by_worker.items():
            self.tell(job, worker, Revoked(epoch, revoked, why))

    def superseded(self, job: Job, old: str) -> None:
        """Tells session `old` that a reader restored from its checkpoint took over."""
        why = admission.revoked_why(job, old)
        if why:
            self.tell(job, old, Superseded(job.ledger.epoch, why))

    def complete(self, job: Job) -> None:
        """Every watching session of `job`: its epoch is complete (once per epoch)."""
        epoch = job.ledger.epoch
        if job.announced_complete >= epoch:
            return
        job.announced_complete = epoch
        for worker in self._workers(job):
            self.tell(job, worker, EpochComplete(epoch))

    def group(self, job: Job) -> None:
        """Every watching rank of a group that just broke: why it must stop."""
        if job.members is None:
            return
        for worker in self._workers(job):
            why = job.members.message_for(worker)
            if why:
                self.tell(job, worker, GroupBroken(job.ledger.epoch, why))

    def give_back(self, job: Job, worker: str, partition: int, lease: int) -> None:
        epoch = job.ledger.epoch
        self.tell(job, worker, GiveBack(epoch, [HeldTask(epoch, partition, lease)]))

    def _workers(self, job: Job) -> list[str]:
        return [w for j, w in self.watching if j == job.name]
