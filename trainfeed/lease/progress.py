"""How far a reader's trainer got inside each partition it holds, and what of that the master
was sent: the progress part of the reader's lease book (trainfeed.lease.book), pure like it.

Progress lets the master re-lease a crashed reader's partition past the records its trainer
already had. It has its own state (counts, what was sent, what changed, since when) and its own
rules (only news goes, it is due once enough records wait, a broken stream sends it again), so it
is kept apart from the book's leases and reports; the book owns one `Progress` and reads it when
it drains reports or decides when the reporter must send (`LeaseBook.send_in`).

Not thread-safe: the shell calls it under the book's lock.
"""
from __future__ import annotations

from collections.abc import Mapping

# (epoch, partition) and (epoch, partition, lease token), as in trainfeed.lease.book (which
# imports this module, so they are spelled here again rather than imported).
Key = tuple[int, int]
Lease = tuple[int, int, int]

# Progress within partitions reaches the master at least this often (riding on GetTasks when it
# can): after a crash a re-leased partition repeats at most the records consumed in this long,
# plus the batch that was in the trainer's hands.
PROGRESS_INTERVAL_S = 1.0
# ... once at least this many records of a partition went unreported (else they wait for its
# DONE, a call, or a checkpoint's flush): a crash repeats at most the records of the last
# PROGRESS_INTERVAL_S or PROGRESS_MIN_RECORDS - 1, whichever is more, plus the batch in the
# trainer's hands. For a reader slower than PROGRESS_MIN_RECORDS records/s that bound is
# records, not a second: its lone progress messages were most of the master's CPU per record
# (issue 28: 200 readers at 2.5 records/s sent ~170 a second for 10-record partitions).
PROGRESS_MIN_RECORDS = 16


class Progress:
    """Records the trainer had per held partition, and which of those counts the master has not
    been sent yet.

    Args:
        held: the book's held leases ((epoch, partition) -> token), read live: progress is kept
            only for a lease still held, under the token it was noted for.
    """

    def __init__(self, held: Mapping[Key, int]):
        self.held = held
        # Records handed to the trainer per held partition, and which changed since sent.
        self.counts: dict[Key, int] = {}
        # Per held partition: the progress the master was last sent (its skip at first).
        self.reported: dict[Key, int] = {}
        self.dirty: set[Key] = set()
        self.oldest = 0.0  # when the oldest unsent change was noted

    def start(self, key: Key, skip: int) -> None:
        """A task of `key` arrived starting at record `skip`: the master knows that much."""
        self.reported[key] = skip

    def note(self, lease: Lease, consumed: int, now: float) -> bool:
        """The trainer had the first `consumed` records of `lease`'s partition. Returns True if
        this started the PROGRESS_INTERVAL_S clock (nothing was waiting to go before)."""
        key = lease[:2]
        if consumed <= self.counts.get(key, 0) or self.held.get(key) != lease[2]:
            return False  # not news, or the lease is not ours any more
        self.counts[key] = consumed
        first = not self.dirty
        if first:
            self.oldest = now
        self.dirty.add(key)
        return first

    def note_positions(self, epoch: int, positions: Mapping[int, int]) -> None:
        """Records per partition of `epoch` the trainer had (a checkpoint's positions, possibly
        ahead of the progress noted so far), for the leases still held."""
        for partition, consumed in positions.items():
            key = (epoch, partition)
            if key in self.held and consumed > self.counts.get(key, 0):
                self.counts[key] = consumed
                self.dirty.add(key)

    def due(self) -> bool:
        """Whether progress must go on its own once PROGRESS_INTERVAL_S old: some partition
        has PROGRESS_MIN_RECORDS records or more the master was not sent."""
        return any(self.counts[key] - self.reported.get(key, 0) >= PROGRESS_MIN_RECORDS
                   for key in self.dirty)

    def take(self) -> list[tuple[Key, int]]:
        """Takes the counts that changed since they were last sent, in key order: they count
        as sent from now on."""
        taken = [(key, self.counts[key]) for key in sorted(self.dirty)]
        self.reported.update(taken)
        self.dirty.clear()
        return taken

    def resend(self) -> None:
        """A stream carrying progress nobody acknowledged broke: what it carried may be lost,
        so every held partition's progress goes again (the master keeps the largest count)."""
        self.dirty.update(key for key in self.counts if key in self.held)
        for key in self.dirty:  # (what the master has of it is not known: due from the start)
            self.reported.pop(key, None)

    def drop(self, key: Key) -> None:
        """`key`'s lease was taken away or handed back: its progress is nobody's news."""
        self.counts.pop(key, None)
        self.dirty.discard(key)

    def finish(self, key: Key) -> None:
        """Every record of `key`'s lease went to the trainer: its DONE says the rest."""
        self.drop(key)
        self.reported.pop(key, None)

    def clear(self) -> None:
        """The session left the job: no partition is held any more."""
        self.counts.clear()
        self.reported.clear()
        self.dirty.clear()
