"""Who may read a job, and what a reader must be told: the servicer's side of issues 25 and 26.

- One delivery order per job (trainfeed.master.core.delivery_order): a reader whose seed or sampling
  options differ from the job's is refused at OpenJob while the job is read in the other order.
- One process per synchronous rank, and a group that fails loudly
  (trainfeed.master.core.sync_group): a claim on a live reader's rank is refused at OpenJob; a rank
  that dies, never arrives or left while others wait breaks the group, and every call of the others
  then carries `group_broken`.
- A reader whose leases went to a reader restored from its checkpoint is told so (`revoked_why`),
  not left to guess that it was frozen.
- A WAIT answer says who holds the epoch's remaining partitions and until when (`holdings`), so
  that a reader never waits without saying what for.

Functions over the servicer's `Job`, called on its event loop; they decide and describe, and
the servicer aborts or answers. FAILED_PRECONDITION refusals carry a REFUSAL_TRAILER naming their
kind, which the client turns into RankTakenError or DeliveryOrderError.
"""
from __future__ import annotations

import heapq
import logging
from typing import Protocol

from trainfeed.master.core import delivery_order
from trainfeed.master.core.ledger import Ledger
from trainfeed.master.core.messages import DeliveryOrder, Holding, SyncGroup
from trainfeed.master.core.sync_group import SyncMembers, alive_window


class Job(Protocol):
    """What admission reads and keeps of the servicer's job (trainfeed.master.core.jobs.Job)."""

    name: str
    ledger: Ledger
    workers: dict[str, float]  # worker id -> last heard from (time.time)
    members: SyncMembers | None
    order: DeliveryOrder | None
    order_by: str
    superseded: dict[str, str]
    # The holdings of a WAIT answer as last computed: (when, epoch, holders), see `holdings`.
    holdings_cache: tuple[float, int, list[Holding]]


logger = logging.getLogger(__name__)

# Trailing metadata of a refused OpenJob: which refusal ("rank-taken", "delivery-order"), and
# for a taken rank the seconds its holder has been quiet and the seconds it may stay quiet before
# it is presumed dead (the client of a restarted process waits that long; see lease/client.py).
REFUSAL_TRAILER = "trainfeed-refusal"
RANK_QUIET_TRAILER = "trainfeed-rank-quiet-s"
RANK_LAPSE_TRAILER = "trainfeed-rank-lapse-s"
RANK_TAKEN = "rank-taken"
DELIVERY_ORDER = "delivery-order"
# Readers whose leases went to a reader restored from their checkpoint, per job (a bound: ids
# come from callers).
MAX_SUPERSEDED = 1024
# How stale the holders named in a WAIT answer may be (seconds). They feed a log line a waiting
# reader writes after 5 s; recomputing them for every WAIT answer scanned every reader's leases
# per call: a third of the master's CPU with 1,000 readers (benchmarks/master_load.py).
HOLDINGS_REFRESH_S = 0.5
# Holders named in a WAIT answer.
MAX_HOLDERS = 20


class Refusal(Exception):
    """OpenJob must be refused with FAILED_PRECONDITION: `message`, and `trailer` metadata."""

    def __init__(self, message: str, trailer: tuple[tuple[str, str], ...]):
        super().__init__(message)
        self.message = message
        self.trailer = trailer


def check_order(job: Job, order: DeliveryOrder, name: str, now: float,
                lease_timeout_s: float) -> None:
    """Records the job's delivery order from its first reader; raises Refusal for a reader whose
    order differs while a reader of the job's order is alive or its epoch is half read (a job
    left idle at an epoch boundary takes the newcomer's order)."""
    if job.order is None:
        job.order, job.order_by = order, name
        return
    if delivery_order.same(job.order, order):
        return
    alive = any(now - seen <= lease_timeout_s for seen in job.workers.values())
    ledger = job.ledger
    if alive or not (ledger.untouched or ledger.complete):
        raise Refusal(delivery_order.conflict(job.name, job.order, order, job.order_by),
                      ((REFUSAL_TRAILER, DELIVERY_ORDER),))
    logger.info("job %r: no reader left at an epoch boundary; its delivery order is now %s "
                "(was %s)", job.name, delivery_order.describe(order),
                delivery_order.describe(job.order))
    job.order, job.order_by = order, name


def check_rank(job: Job, sync: SyncGroup, name: str, resumes: str, now: float,
               lease_timeout_s: float) -> None:
    """Raises Refusal if reader `name` (resuming reader `resumes`' checkpoint, or "") may not
    be rank `sync.rank` of the job's group: a live reader holds the rank, or the live ranks
    declared another group. Changes nothing (`join_rank` does, once the reader has an id)."""
    alive_s = alive_window(lease_timeout_s)
    members = job.members
    if members is None or members.broken is not None:
        return
    if (members.world_size, members.batch_size) != (sync.world_size, sync.batch_size):
        live = members.live(now, alive_s)
        if live and resumes not in {m.worker for m in live.values()}:
            held = ", ".join(f"rank {r} ({m.name})" for r, m in sorted(live.items()))
            raise Refusal(
                f"job {job.name!r} is read by a synchronous group of world size "
                f"{members.world_size}, batch size {members.batch_size} ({held}); {name} "
                f"declares world size {sync.world_size}, batch size {sync.batch_size}: every "
                f"rank must declare the same group (check WORLD_SIZE, or world_size= and "
                f"batch_size=), or use another job name", ((REFUSAL_TRAILER, "group"),))
        return
    holder = members.ranks.get(sync.rank)
    if holder is None or holder.worker == resumes:
        return
    quiet = now - holder.seen
    if quiet > alive_s:
        return  # presumed dead: `join_rank` takes the rank over
    lapse = alive_s - quiet
    raise Refusal(
        f"job {job.name!r}: rank {sync.rank} of its synchronous group is held by {holder.name} "
        f"(worker {holder.worker}, last heard from {quiet:.1f} s ago); {name} claims it too. "
        f"Two processes have the same rank (RANK, rank=, TF_CONFIG or torch.distributed): give "
        f"each its own. (If the holder is dead, its claim lapses in {lapse:.0f} s.)",
        ((REFUSAL_TRAILER, RANK_TAKEN), (RANK_QUIET_TRAILER, f"{quiet:.3f}"),
         (RANK_LAPSE_TRAILER, f"{lapse:.3f}")))


def join_rank(job: Job, sync: SyncGroup, worker: str, name: str, resumes: str, now: float,
              lease_timeout_s: float) -> None:
    """Makes `worker` (named `name`) rank `sync.rank` of the job's group (admitted by
    `check_rank`), forming the group if it has none, or its old one is empty, broken or of
    another shape (whose ranks are then all presumed dead)."""
    members = job.members
    shape = (sync.world_size, sync.batch_size)
    if (members is None or members.empty or members.broken is not None
            or (members.world_size, members.batch_size) != shape):
        members = job.members = (SyncMembers(*shape, formed=now) if members is None
                                 else members.fresh(now, *shape))
    members.claim(sync.rank, worker, name, now, alive_window(lease_timeout_s), resumes)
    logger.info("job %r: rank %d of %d is %s (worker %s)", job.name, sync.rank,
                sync.world_size, name, worker)


def superseded(job: Job, old: str, name: str, worker: str) -> None:
    """`worker` (named `name`) resumed the checkpoint of reader `old`, taking its partitions."""
    if len(job.superseded) >= MAX_SUPERSEDED:
        job.superseded.pop(next(iter(job.superseded)))
    job.superseded[old] = (f"a reader restored from this reader's checkpoint ({name}, worker "
                           f"{worker}) took over its partitions")


def revoked_why(job: Job, worker: str) -> str:
    return job.superseded.get(worker, "")


def on_call(job: Job, worker: str, sync: SyncGroup | None, now: float) -> str:
    """A call of `worker` (a synchronous rank declaring `sync`, or None) reached the master:
    notes it, re-learns a rank a restarted master forgot, and returns why the caller must stop
    ("" if it may go on)."""
    members = job.members
    if sync is not None and members is None:
        members = job.members = SyncMembers(sync.world_size, sync.batch_size, formed=now)
    if members is None:
        return ""
    if (sync is not None and members.rank_of(worker) is None and worker not in members.told
            and (members.world_size, members.batch_size) == (sync.world_size, sync.batch_size)
            and members.broken is None and 0 <= sync.rank < members.world_size):
        if sync.rank in members.ranks:  # (a restarted master met the other holder first)
            members.tell(worker, f"rank {sync.rank} is held by "
                                 f"{members.ranks[sync.rank].name}")
        else:
            members.claim(sync.rank, worker, worker, now, 0.0)
    members.seen(worker, now)
    return members.message_for(worker)


def check_group(job: Job, now: float, lease_timeout_s: float, waiting: bool = False) -> bool:
    """Breaks the job's group if a rank is missing (`waiting`: a rank waits for records, so a
    rank that left counts too); returns whether it broke now (wake the long-polls). Ranks
    quiet between epochs (the ledger's epoch complete or untouched) with nobody waiting finish
    the group instead of breaking it (SyncMembers.check)."""
    members = job.members
    if members is None:
        return False
    ledger = job.ledger
    between = ledger.untouched or ledger.complete
    was_finished = members.finished
    why = members.check(now, lease_timeout_s, waiting, between_epochs=between)
    if why is not None:
        logger.error("job %r: %s", job.name, why)
        return True
    if members.finished is not None and was_finished is None:
        logger.info("job %r (epoch %d %s): %s", job.name, ledger.epoch,
                    "complete" if ledger.complete else "not begun", members.finished)
    return False


def left(job: Job, worker: str, now: float) -> None:
    job.superseded.pop(worker, None)
    if job.members is not None:
        job.members.leave(worker, now)


def hold_off(job: Job, now: float, until: float) -> None:
    """After a restart or stall: nobody of the group counts as missing before `until`."""
    if job.members is not None:
        job.members.hold_off(now, until)


def holdings(job: Job, now: float, caller: str) -> list[Holding]:
    """Who but `caller` holds the current epoch's partitions still out, until when (for a WAIT
    answer to `caller`, whose own leases wait for its trainer, not for others): the first
    MAX_HOLDERS by worker id, as of at most HOLDINGS_REFRESH_S ago in this epoch."""
    ledger = job.ledger
    at, epoch, holders = job.holdings_cache
    if epoch != ledger.epoch or not 0 <= now - at < HOLDINGS_REFRESH_S:
        # One more than named, for when the caller is among them.
        first = heapq.nsmallest(MAX_HOLDERS + 1,
                                (w for w, held in ledger.by_worker.items() if held))
        holders = [Holding(worker=worker, partitions=len(ledger.by_worker[worker]),
                           lease_until=ledger.deadlines.get(worker, 0.0),
                           quiet_s=max(0.0, now - job.workers.get(worker, now)))
                   for worker in first]
        job.holdings_cache = (now, ledger.epoch, holders)
    return [h for h in holders if h.worker != caller][:MAX_HOLDERS]


def note_ahead(ahead: dict[str, tuple[int, set[int], bool]], job: Job, worker: str) -> str:
    """A synchronous rank asks for the next epoch while the current one is open: it had its
    whole quota of this one. Once every rank of the group has, with no lease out, what is left
    in todo is work no rank's quota asks for, and the epoch can never end: a fault of the quota
    accounting (the ranks' own logs say only that they wait). Returns, once per epoch, an error
    naming the records left ("" otherwise), so that such a hang names its cause. `ahead`: job ->
    (its epoch, the ranks that asked ahead in it, whether it was told)."""
    members, ledger = job.members, job.ledger
    rank = members.rank_of(worker) if members is not None else None
    if members is None or rank is None:
        return ""
    epoch, ranks, logged = ahead.get(job.name, (ledger.epoch, set(), False))
    if epoch != ledger.epoch:
        epoch, ranks, logged = ledger.epoch, set(), False
    ranks.add(rank)
    stuck = (not logged and len(ranks) >= members.world_size and not ledger.pending
             and bool(ledger.todo))
    ahead[job.name] = (epoch, ranks, logged or stuck)
    if not stuck:
        return ""
    left = sorted(ledger.todo)
    return (f"every rank of the synchronous group (world size {members.world_size}) had its "
            f"quota of epoch {epoch} and asks for the next, but the epoch keeps "
            f"{sum(ledger.remaining(p) for p in left)} record(s) in todo that no rank's quota "
            f"asks for (partitions {left[:10]}{' …' if len(left) > 10 else ''}): it cannot "
            f"end, and the ranks wait. This is a fault of the master's quota accounting; "
            f"restart the group from a checkpoint (reader.state_dict()) and report it")
