"""Fencing of the ledger (trainfeed.master.core.ledger): which reports and held leases still count.

Every lease gets a token (`LedgerState.leases`, from a counter that is part of the state, so a
replayed journal gives the same tokens). With a `token_key` (the master gives every job a random
one, saved with the state) a token is a keyed hash of the counter, 63 bits that nobody without the
key can guess; without one (tests, old states) the token is the counter itself. A report counts
only from the partition's latest holder with that lease's token (`Fencing.check_report`); anything
else is refused and changes nothing, so a reader whose lease expired and went to another reader
can neither finish, fail nor advance the partition.

Pure queries over one ledger's state: nothing here changes it (the tokens are given by the
ledger's lease op, `LedgerState._fence`).
"""
from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable
from typing import Protocol

__all__ = ["TOKEN_BITS", "FencedState", "Fencing", "Outcome", "Verdict", "lease_token"]

# Fencing tokens travel as uint64 and JSON integers: 63 bits keep them positive everywhere.
TOKEN_BITS = 63


class Verdict(enum.Enum):
    """What a report deserves (see `Fencing.check_report`)."""

    APPLY = "apply"  # from the holder with its token: apply it
    REPEAT = "repeat"  # from the holder, but already in effect (a retried call): nothing to do
    REFUSE = "refuse"  # not from the partition's latest holder with its token, or a past epoch
    INVALID = "invalid"  # names a partition or epoch that cannot exist


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    PROGRESS = "progress"
    RELEASED = "released"


def lease_token(key: bytes | None, counter: int) -> int:
    """The fencing token of the `counter`-th lease: HMAC-SHA256(key, counter) cut to TOKEN_BITS
    bits (never 0, which means "no lease"), or `counter` itself without a key. Deterministic, so
    a replayed journal gives every lease the token it had; unguessable without the key."""
    if key is None:
        return counter
    # mutmut: dropping either "big" is equivalent (the default byte order since Python 3.11).
    digest = hmac.new(key, counter.to_bytes(8, "big"), hashlib.sha256).digest()
    # mutmut: `or 2` is equivalent in practice (63 zero bits of an HMAC: odds of 2**-63).
    return (int.from_bytes(digest[:8], "big") >> (64 - TOKEN_BITS)) or 1


class FencedState(Protocol):
    """What the fence reads of a ledger (trainfeed.master.core.ledger_state.LedgerState, which
    gives the tokens with `lease_token` and so is not imported back here)."""

    num_partitions: int
    epoch: int
    leases: dict[int, tuple[str, int]]  # partition -> (worker, token) of its latest lease
    pending: dict[int, str]
    done: dict[int, str]
    failed: dict[int, str]
    progress: dict[int, int]


class Fencing:
    """The fence of one ledger: reads its leases, pending and finished partitions; changes
    nothing."""

    def __init__(self, state: FencedState):
        self.state = state

    def token_of(self, partition: int) -> int:
        """The fencing token of the latest lease of `partition` this epoch (0: never leased)."""
        lease = self.state.leases.get(partition)
        return lease[1] if lease is not None else 0

    def check_report(self, worker: str, epoch: int, partition: int, token: int,
                     outcome: Outcome, consumed: int) -> Verdict:
        """Whether a report of `worker` on (`epoch`, `partition`) with lease `token` may count.

        INVALID for a partition out of [0, num_partitions) or an epoch out of [0, current].
        REFUSE unless the partition's latest lease this epoch is `worker`'s with `token`: a past
        epoch, a partition never leased, leased to another, or leased again since (a stale
        token). From the latest holder: APPLY while it is pending; after an expiry or a
        hand-back that nobody followed with a new lease, DONE and PROGRESS still APPLY (nobody
        else reads it, and it saves re-reading what the trainer had), and so does a RELEASED
        whose `consumed` goes past the partition's progress (a synchronous rank's cut, whose
        kept records its trainer gets: see `Ledger.report_released`); FAILED and any other
        RELEASED are a REPEAT (it is in todo already); on a done or failed partition any report
        is a REPEAT (a retried call). Pure: changes nothing.
        """
        state = self.state
        if not 0 <= partition < state.num_partitions or not 0 <= epoch <= state.epoch:
            return Verdict.INVALID
        # mutmut: `token < 0` is equivalent: no lease has token 0 (tokens start at 1).
        if epoch != state.epoch or token <= 0 or state.leases.get(partition) != (worker, token):
            return Verdict.REFUSE
        if state.pending.get(partition) == worker:
            return Verdict.APPLY
        if partition in state.done or partition in state.failed or outcome is Outcome.FAILED:
            return Verdict.REPEAT
        if outcome is Outcome.RELEASED and consumed <= state.progress.get(partition, 0):
            return Verdict.REPEAT
        return Verdict.APPLY

    def revoked(self, worker: str, held: Iterable[tuple[int, int, int]]) -> list[
            tuple[int, int, int]]:
        """Of the (epoch, partition, token) leases `worker` says it holds, those that are not
        its own any more: a past epoch, leased to another since, or back in todo (expired or
        handed back). Not those it finished itself (a DONE sent by a concurrent call). Pure."""
        state = self.state
        return [(e, p, t) for e, p, t in held
                if e != state.epoch or state.leases.get(p) != (worker, t)
                or (state.pending.get(p) != worker and p not in state.done
                    and p not in state.failed)]
