"""Resume of the ledger (trainfeed.master.core.ledger): a restored reader's partitions back where
its checkpoint saw them, and only as far as the ledger can vouch for.

A trainer restarted from a checkpoint lost every record it consumed after it, and had every record
it consumed before. `Resume.vouched` cuts the checkpoint's claims to what fenced reports showed
(a resume may re-deliver records, never skip one nobody consumed); `Resume.rewind` then puts the
partitions back, through the ledger's journaled ops (so a replay rewinds the same way).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainfeed.master.core.ledger_state import LedgerState

__all__ = ["Resume"]


class Resume:
    """Rewinds one ledger's state for restored readers; changes it only through its ops."""

    def __init__(self, state: LedgerState):
        self.state = state

    def rewind(self, epoch: int, worker: str, keep_done: Iterable[int],
               positions: dict[int, int]) -> list[int]:
        """Puts a restored reader's partitions back where its checkpoint saw them.

        A trainer restarted from a checkpoint lost every record it consumed after it, and had
        every record it consumed before. So, in `epoch`: each partition in `keep_done` (done at
        checkpoint time) is done, even if its report never arrived; each other partition
        `worker` completed or still holds goes back to the front of todo, as does each partition
        in `positions` (in the trainer's hands at checkpoint time), which restarts after exactly
        that many records (the others at 0). Returns the partitions put back; nothing if `epoch`
        is over.
        """
        state = self.state
        if epoch != state.epoch:
            return []
        keep = {p for p in keep_done if 0 <= p < state.num_partitions}
        for p in sorted(keep):
            if p not in state.done and p not in state.failed:
                state._apply(["D", p, worker])
        back = self._rewound(worker, keep, positions)
        if not back:
            return []
        state._apply(["U", back])
        for p in back:
            state._apply(["P", p, max(0, positions.get(p, 0))])
        return back

    def _rewound(self, worker: str, keep: set[int], positions: dict[int, int]) -> list[int]:
        """What `rewind` puts back, in this order: what `worker` completed (but `keep`), what
        it holds, the partitions of `positions`, what its trainer made progress on."""
        state = self.state
        back: dict[int, None] = {}  # an ordered set
        for p, w in state.done.items():
            if w == worker and p not in keep:
                back[p] = None
        for p in state.by_worker.get(worker, ()):
            back[p] = None
        open_ = state._still_open
        for p in positions:
            if open_(p) and 0 <= p < state.num_partitions:
                back[p] = None
        for p, w in state.progress_by.items():
            if w == worker and p not in keep and open_(p):
                back[p] = None
        return list(back)

    def vouched(self, epoch: int, worker: str, keep_done: Iterable[int],
                positions: Mapping[int, int]) -> tuple[list[int], dict[int, int], list[int]]:
        """What of a restored reader's checkpoint this ledger can vouch for, as `rewind`'s
        arguments: a resume may re-deliver records, never mark as consumed a record that no
        fenced report showed consumed, and never touch a partition `worker` did not hold.

        Of `keep_done` and `positions`, only partitions `worker` held a lease of in `epoch`
        count. A partition kept done must be done here (else it resumes where its reports left
        it); a position is cut to the records reported consumed (a done partition's: any). Returns
        (keep_done, positions, the partitions whose claim was cut or dropped), all sorted; nothing
        when `epoch` is not the current one (then `rewind` does nothing either). Pure.
        """
        state = self.state
        if epoch != state.epoch:
            return [], {}, []
        ours = {p for p, workers in state.holders.items() if worker in workers}
        keep = sorted({p for p in keep_done if p in ours and p in state.done})
        cut = sorted({p for p in keep_done if p not in keep}
                     | {p for p in positions if p not in ours})
        vouched: dict[int, int] = {}
        for p in sorted(p for p in keep_done if p in ours and p not in state.done):
            vouched[p] = state.progress.get(p, 0)  # claimed whole: as far as reports showed
        cut += self._vouch_positions(positions, ours, vouched)
        return keep, vouched, sorted(set(cut))

    def _vouch_positions(self, positions: Mapping[int, int], ours: set[int],
                         vouched: dict[int, int]) -> list[int]:
        """Adds to `vouched` each position of a partition in `ours` (not vouched already), cut
        to the records reported consumed (a done partition's: any); returns those cut."""
        state = self.state
        cut = []
        for p, n in sorted(positions.items()):
            if p not in ours or p in vouched:
                continue
            known = n if p in state.done else state.progress.get(p, 0)
            vouched[p] = min(n, known)
            if n > known:
                cut.append(p)
        return cut
