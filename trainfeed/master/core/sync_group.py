"""A synchronous job's members: which reader holds which rank, and when each was last heard.

Synchronous ranks (`dist.reader(..., sync=True)`) each take an exact quota of every epoch. A rank
that dies, leaves or never arrives leaves its share of the epoch untaken, and the epoch never
ends: without this record the other ranks finished their share and then waited at the next epoch
for ever, silently (issue 25). So the master keeps, per synchronous job, rank -> member, and:

- a second reader claiming a rank that a live reader holds is refused (`claim`), naming both; a
  holder not heard from for `alive_s` (a heartbeat and some slack) is presumed dead, and a claim
  takes its rank over (a restarted process), as does a reader restored from its checkpoint;
- the group breaks (`check`) when a rank was not heard from for a lease timeout, never arrived
  within a lease timeout of the group's first rank, or left (closed its reader) more than a lease
  timeout ago while another rank waits for records. Every remaining member is then told, on its
  next call, which rank(s) broke the group (`message_for`), and raises SyncGroupBrokenError.
- a group whose ranks all went quiet or left *between epochs* (the current epoch complete or not
  yet begun, no rank waiting for records) is **finished**, not broken (issue 38): that is how a
  training script that ran its epochs and exited looks to the master. Broken means a rank stopped
  inside an epoch, or a rank waits for records that a missing rank's share holds back.

Pure, like the ledger: time is an argument, no clock, socket or thread. Not saved with the job:
a restarted master learns the members again from the `sync` field every call carries, and gives
them a grace (`hold_off`) before anyone counts as missing.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

# A live reader calls the master at least every third of the lease timeout (its heartbeat); a
# holder quiet for that long plus this slack (a loaded host, a slow call) is presumed dead.
HEARTBEAT_SLACK_S = 2.0
# Members told why they are out (replaced, or their group broke) are remembered for their next
# call; a bound, since worker ids come from callers.
MAX_TOLD = 1024


def alive_window(lease_timeout_s: float) -> float:
    """How recently a rank's holder must have been heard from to count as alive."""
    return lease_timeout_s / 3 + HEARTBEAT_SLACK_S


@dataclass
class Member:
    """One rank's reader: its worker id, the name it gave (host:pid), when last heard."""

    worker: str
    name: str
    seen: float


class Verdict(enum.Enum):
    TAKE = "take"  # the rank is free, or its holder is presumed dead or resumed from
    REFUSE = "refuse"  # a live reader holds it


@dataclass(frozen=True)
class ClaimResult:
    verdict: Verdict
    # With REFUSE: the holder, and how long ago it was last heard.
    holder: Member | None = None
    quiet_s: float = 0.0


@dataclass
class SyncMembers:
    """The ranks of one synchronous group (world_size ranks of batch_size records a step)."""

    world_size: int
    batch_size: int
    formed: float  # when the first rank joined (or the master restarted)
    ranks: dict[int, Member] = field(default_factory=dict)
    # rank -> (name of the reader that left it, when): a rank free again.
    left: dict[int, tuple[str, float]] = field(default_factory=dict)
    # Why the group broke (None while whole); every member is told.
    broken: str | None = None
    # Worker id -> why it is out of the group (its rank was taken over, or the group broke).
    told: dict[str, str] = field(default_factory=dict)
    # Nobody counts as missing before this (after a master restart or stall).
    not_before: float = 0.0
    # Why the group counts as finished (every rank quiet or gone between epochs; None while
    # some rank is alive). Cleared when a rank is claimed again.
    finished: str | None = None

    def rank_of(self, worker: str) -> int | None:
        return next((r for r, m in self.ranks.items() if m.worker == worker), None)

    def live(self, now: float, alive_s: float) -> dict[int, Member]:
        """The ranks whose holder was heard from within `alive_s`."""
        return {r: m for r, m in self.ranks.items() if now - m.seen <= alive_s}

    def claim(self, rank: int, worker: str, name: str, now: float, alive_s: float,
              resumes: str = "") -> ClaimResult:
        """`worker` (named `name`) claims `rank`. Refused if a reader heard from within
        `alive_s` holds it, unless `worker` resumes that reader's checkpoint (`resumes`, its
        worker id): then, or if the holder is quiet longer, the rank is taken over and the old
        holder is told so on its next call."""
        holder = self.ranks.get(rank)
        if holder is not None and holder.worker != worker:
            quiet = now - holder.seen
            if quiet <= alive_s and holder.worker != resumes:
                return ClaimResult(Verdict.REFUSE, holder, quiet)
            why = (f"a reader restored from its checkpoint ({name}, worker {worker}) took over "
                   f"rank {rank}" if holder.worker == resumes else
                   f"rank {rank} went to {name} (worker {worker}): this reader was not heard "
                   f"from for {quiet:.0f} s")
            self.tell(holder.worker, why)
        self.ranks[rank] = Member(worker, name, now)
        self.finished = None
        self.left.pop(rank, None)
        self.told.pop(worker, None)
        return ClaimResult(Verdict.TAKE)

    def seen(self, worker: str, now: float) -> None:
        """A call of `worker` reached the master."""
        rank = self.rank_of(worker)
        if rank is not None:
            self.ranks[rank].seen = now

    def leave(self, worker: str, now: float) -> None:
        """`worker` closed its reader (LeaveJob): its rank is free."""
        self.told.pop(worker, None)
        rank = self.rank_of(worker)
        if rank is not None:
            self.left[rank] = (self.ranks.pop(rank).name, now)

    @property
    def empty(self) -> bool:
        """No rank is held: the next claim may form another group."""
        return not self.ranks

    def hold_off(self, now: float, until: float) -> None:
        """The master could not hear anyone until `now` (a restart, a stall): every rank counts
        as heard from now, and nobody as missing before `until`."""
        self.not_before = max(self.not_before, until)
        self.formed = max(self.formed, now)
        for member in self.ranks.values():
            member.seen = max(member.seen, now)

    def missing(self, now: float, lease_timeout_s: float, waiting: bool) -> list[str]:
        """Each rank missing from the group, described: not heard from for a lease timeout,
        never arrived within one of the group forming, or (when a rank `waiting` for records
        asks) left more than one ago."""
        if now < self.not_before:
            return []
        out: list[str] = []
        for rank in range(self.world_size):
            member = self.ranks.get(rank)
            if member is not None:
                if now - member.seen > lease_timeout_s:
                    out.append(f"rank {rank} ({member.name}) was last heard from "
                               f"{now - member.seen:.0f} s ago (killed or stopped?)")
            elif rank in self.left:
                name, at = self.left[rank]
                if waiting and now - at > lease_timeout_s:
                    out.append(f"rank {rank} ({name}) closed its reader {now - at:.0f} s ago "
                               f"and no process took its place")
            elif now - self.formed > lease_timeout_s:
                out.append(f"rank {rank} never arrived ({now - self.formed:.0f} s after the "
                           f"group's first rank)")
        return out

    def check(self, now: float, lease_timeout_s: float, waiting: bool = False,
              between_epochs: bool = False) -> str | None:
        """Breaks the group if a rank is missing (see `missing`); returns why, once.

        With `between_epochs` (the job's current epoch is complete or untouched) and no rank
        `waiting`, ranks that went quiet or left did not stop inside an epoch: while every rank
        is quiet or gone the group is `finished` instead (see `finish_if_all_quiet`), and a
        missing rank breaks it only once another rank waits for records."""
        if self.broken is not None:
            return None
        if between_epochs and not waiting:
            self.finish_if_all_quiet(now, lease_timeout_s)
            return None
        gone = self.missing(now, lease_timeout_s, waiting)
        if not gone:
            return None
        self.broken = (f"the synchronous group of world size {self.world_size} is broken: "
                       + "; ".join(gone)
                       + ". Its share of each epoch has no reader, so the other ranks stop "
                       "here rather than wait; restart the whole group (from a checkpoint: "
                       "reader.state_dict())")
        return self.broken

    def finish_if_all_quiet(self, now: float, lease_timeout_s: float) -> None:
        """Marks the group finished when no rank was heard from for a lease timeout (or every
        rank left): the ranks ran their epochs and exited, which is no fault."""
        if self.finished is not None or now < self.not_before:
            return
        if any(now - m.seen <= lease_timeout_s for m in self.ranks.values()):
            return
        if not self.ranks and not self.left:
            return
        self.finished = (f"the synchronous group of world size {self.world_size} finished: "
                         f"every rank went quiet or closed its reader between epochs")

    def message_for(self, worker: str) -> str:
        """Why `worker` must stop ("" if it may go on): its group broke, or its rank was taken."""
        told = self.told.get(worker)
        if told is not None:
            return told
        if self.broken is not None and self.rank_of(worker) is not None:
            return self.broken
        return ""

    def tell(self, worker: str, why: str) -> None:
        if len(self.told) >= MAX_TOLD:
            self.told.pop(next(iter(self.told)))
        self.told[worker] = why

    def fresh(self, now: float, world_size: int, batch_size: int) -> SyncMembers:
        """A new group replacing this one: its members are out of it, told why (the group
        broke, or another group took the job)."""
        group = SyncMembers(world_size, batch_size, now)
        group.told = dict(self.told)
        why = self.broken or (f"the job's synchronous group was replaced by one of world size "
                              f"{world_size}, batch size {batch_size}")
        for member in self.ranks.values():
            group.tell(member.worker, why)
        return group
