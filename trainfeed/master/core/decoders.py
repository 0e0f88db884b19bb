"""The decode workers a master knows (issue 37): who registered, how busy each is, who went quiet.

Decoders register and heartbeat on their own Session stream (trainfeed.master.serve.decoder_streams
is the shell); trainers are told the list, the least busy first, and spread their requests over
it. Pure: time is an argument, nothing here reads a clock or a socket.

Bounds, against a token holder who registers without end: at most MAX_DECODERS at once (the next
one is refused), an address of at most MAX_ADDRESS_CHARS in "host:port" form, and an address held
by one stream at a time (a second registration of it is refused while the first lives, so that a
stream cannot take over another's entry). A decoder is dropped when its stream ends (`leave`) or
when it is silent for `timeout_s` (`expire`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Decoders registered at once: far above any pool (the autoscaler's MAX_DECODERS is 64), small
# enough that the list each trainer is told stays a few tens of KiB.
MAX_DECODERS = 1024
MAX_ADDRESS_CHARS = 255
# A decoder beats every 2 s (trainfeed.decoder.registrar.BEAT_S); one silent for TIMEOUT_S is
# gone.
TIMEOUT_S = 15.0
# "host:port": a DNS name, an IPv4 address or a bracketed IPv6 one, then a port.
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


class DecoderRefused(ValueError):
    """A registration or beat the master does not take (the stream ends with this text)."""


class DecodersFull(DecoderRefused):
    """MAX_DECODERS are registered: the next registration waits for one to go."""


@dataclass(frozen=True)
class Beat:
    """What a decoder said: its address, busy share (0..1), slots and calls in flight."""

    address: str
    busy: float
    slots: int
    in_flight: int


@dataclass(frozen=True)
class Listed:
    """A decoder as trainers are told it."""

    address: str
    busy: float
    slots: int


def check_address(address: str) -> str:
    """`address` if it is a "host:port" a trainer can dial, else DecoderRefused naming it."""
    if len(address) > MAX_ADDRESS_CHARS:
        raise DecoderRefused(f"a decoder address of {len(address)} characters (at most "
                             f"{MAX_ADDRESS_CHARS})")
    found = _ADDRESS.fullmatch(address)
    if found is None or not 0 < int(found.group(2)) < 65536:
        raise DecoderRefused(f"decoder address {address!r}: expected host:port (e.g. "
                             f"10.0.0.7:50052)")
    return address


def _share(busy: float) -> float:
    """A busy share clamped to 0..1 (NaN: 0), so that one decoder's figure cannot skew the
    order or the autoscaler's mean."""
    return 0.0 if math.isnan(busy) else min(max(busy, 0.0), 1.0)


@dataclass
class _Entry:
    stream: object
    beat: Beat
    heard_at: float


class DecoderRegistry:
    """The registered decoders, by address. Not thread-safe: the master's event loop owns it."""

    def __init__(self, timeout_s: float = TIMEOUT_S, limit: int = MAX_DECODERS):
        self.timeout_s = timeout_s
        self.limit = limit
        self._entries: dict[str, _Entry] = {}
        self.changes = 0  # membership changes so far (a decoder came or went)

    def beat(self, stream: object, beat: Beat, now: float) -> bool:
        """Registers or renews the decoder of `stream`. Returns whether the membership changed.
        Raises DecoderRefused for a bad address, an address another live stream holds, a
        stream that changed its address, or one decoder too many."""
        address = check_address(beat.address)
        beat = Beat(address, _share(beat.busy), max(0, beat.slots), max(0, beat.in_flight))
        entry = self._entries.get(address)
        if entry is not None and entry.stream is not stream:
            raise DecoderRefused(f"decoder address {address!r} is registered by another "
                                 f"stream (a decoder stopped less than {self.timeout_s:g} s "
                                 f"ago, or two decoders advertise one address)")
        if entry is None:
            if any(e.stream is stream for e in self._entries.values()):
                raise DecoderRefused(f"a decoder's stream cannot change its address (now "
                                     f"{address!r}): open a new stream")
            if len(self._entries) >= self.limit:
                raise DecodersFull(f"{len(self._entries)} decoders are registered (at most "
                                     f"{self.limit})")
            self._entries[address] = _Entry(stream, beat, now)
            self.changes += 1
            return True
        entry.beat, entry.heard_at = beat, now
        return False

    def leave(self, stream: object) -> bool:
        """Drops the decoder of `stream` (its stream ended). Returns whether it was listed."""
        gone = [a for a, e in self._entries.items() if e.stream is stream]
        for address in gone:
            del self._entries[address]
        self.changes += bool(gone)
        return bool(gone)

    def expire(self, now: float) -> list[str]:
        """Drops the decoders silent for `timeout_s`; returns their addresses."""
        gone = [a for a, e in self._entries.items() if now - e.heard_at > self.timeout_s]
        for address in gone:
            del self._entries[address]
        self.changes += bool(gone)
        return gone

    def listing(self) -> list[Listed]:
        """The decoders, the least busy first (then by address, so every trainer is told the
        same order)."""
        return sorted((Listed(a, e.beat.busy, e.beat.slots) for a, e in self._entries.items()),
                      key=lambda d: (d.busy, d.address))

    def busy(self) -> float | None:
        """The decoders' mean busy share (the autoscaler's figure), or None without decoders."""
        if not self._entries:
            return None
        return sum(e.beat.busy for e in self._entries.values()) / len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
