"""The master's list of decode workers (issue 37): registration, renewal, bounds, leaving and
silence, and the order trainers are told."""
from __future__ import annotations

import math

import pytest

from trainfeed.master.core.decoders import (
    MAX_ADDRESS_CHARS,
    Beat,
    DecoderRefused,
    DecoderRegistry,
    DecodersFull,
    Listed,
    check_address,
)


def beat(address: str = "10.0.0.1:50052", busy: float = 0.5, slots: int = 4,
         in_flight: int = 1) -> Beat:
    return Beat(address, busy, slots, in_flight)


def test_a_first_beat_registers_and_later_ones_renew_without_a_change() -> None:
    registry, stream = DecoderRegistry(), object()
    assert registry.beat(stream, beat(busy=0.5), 0.0) is True
    assert registry.beat(stream, beat(busy=0.9), 1.0) is False
    assert registry.listing() == [Listed("10.0.0.1:50052", 0.9, 4)]
    assert registry.changes == 1


def test_the_least_busy_decoder_is_listed_first_then_by_address() -> None:
    registry = DecoderRegistry()
    registry.beat(object(), beat("b:1", busy=0.2), 0.0)
    registry.beat(object(), beat("a:1", busy=0.2), 0.0)
    registry.beat(object(), beat("c:1", busy=0.1), 0.0)
    assert [d.address for d in registry.listing()] == ["c:1", "a:1", "b:1"]
    assert registry.busy() == pytest.approx(0.5 / 3)


@pytest.mark.parametrize("busy, want", [(math.nan, 0.0), (-3.0, 0.0), (7.0, 1.0), (0.25, 0.25)])
def test_a_busy_share_is_clamped_so_one_decoder_cannot_skew_the_mean(busy: float,
                                                                      want: float) -> None:
    registry = DecoderRegistry()
    registry.beat(object(), beat(busy=busy), 0.0)
    assert registry.listing()[0].busy == want
    assert registry.busy() == want


@pytest.mark.parametrize("address", ["", "host", "host:", ":50052", "host:0", "host:65536",
                                     "host:port", "a b:1", "h\n:1", "h:1\n",
                                     "x" * 250 + ":50052",
                                     "http://h:1"])
def test_an_address_a_trainer_could_not_dial_is_refused_naming_it(address: str) -> None:
    with pytest.raises(DecoderRefused):
        check_address(address)
    registry = DecoderRegistry()
    with pytest.raises(DecoderRefused):
        registry.beat(object(), beat(address), 0.0)
    assert len(registry) == 0


@pytest.mark.parametrize("address", ["10.0.0.7:50052", "decoders-0.ns.svc:1", "[::1]:65535",
                                     "x" * (MAX_ADDRESS_CHARS - 6) + ":50052"])
def test_dialable_addresses_are_taken(address: str) -> None:
    assert check_address(address) == address


def test_another_stream_cannot_take_over_a_registered_address() -> None:
    registry, first, second = DecoderRegistry(), object(), object()
    registry.beat(first, beat(busy=0.1), 0.0)
    with pytest.raises(DecoderRefused, match="another stream"):
        registry.beat(second, beat(busy=0.0), 1.0)
    assert registry.listing()[0].busy == 0.1
    assert registry.leave(second) is False  # the refused stream's end drops nothing
    assert len(registry) == 1


def test_a_stream_cannot_change_its_address() -> None:
    registry, stream = DecoderRegistry(), object()
    registry.beat(stream, beat("a:1"), 0.0)
    with pytest.raises(DecoderRefused, match="cannot change its address"):
        registry.beat(stream, beat("b:1"), 1.0)
    assert [d.address for d in registry.listing()] == ["a:1"]


def test_one_decoder_over_the_limit_is_refused_until_one_leaves() -> None:
    registry = DecoderRegistry(limit=2)
    one, two, three = object(), object(), object()
    registry.beat(one, beat("a:1"), 0.0)
    registry.beat(two, beat("b:1"), 0.0)
    with pytest.raises(DecodersFull, match="at most 2"):
        registry.beat(three, beat("c:1"), 0.0)
    assert registry.leave(one) is True
    assert registry.beat(three, beat("c:1"), 0.0) is True
    assert [d.address for d in registry.listing()] == ["b:1", "c:1"]


def test_a_decoder_silent_past_the_timeout_expires_and_one_heard_stays() -> None:
    registry = DecoderRegistry(timeout_s=10)
    quiet, talking = object(), object()
    registry.beat(quiet, beat("a:1"), 0.0)
    registry.beat(talking, beat("b:1"), 0.0)
    registry.beat(talking, beat("b:1"), 9.0)
    assert registry.expire(10.0) == []  # exactly the timeout: not yet
    assert registry.expire(10.5) == ["a:1"]
    assert [d.address for d in registry.listing()] == ["b:1"]
    assert registry.changes == 3
    assert registry.busy() == 0.5


def test_no_decoders_have_no_busy_share() -> None:
    assert DecoderRegistry().busy() is None
    assert DecoderRegistry().listing() == []
