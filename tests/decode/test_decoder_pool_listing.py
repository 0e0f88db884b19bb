"""A trainer's decoder pool kept to the master's list (issue 37): members replaced, the least
busy asked first among equals, a user's TRAINFEED_DECODERS list never overridden."""
from __future__ import annotations

import pytest

from trainfeed.decode.remote.client import DecoderPool


def test_a_listed_pool_starts_empty_and_becomes_the_masters_list() -> None:
    pool = DecoderPool([], "token", listed=True)
    assert pool.addresses == []
    pool.listed_by_master([("127.0.0.1:1", 0.5), ("127.0.0.1:2", 0.1)])
    assert sorted(pool.addresses) == ["127.0.0.1:1", "127.0.0.1:2"]
    pool.listed_by_master([("127.0.0.1:2", 0.3)])
    assert pool.addresses == ["127.0.0.1:2"]
    pool.close()


def test_a_static_pool_ignores_the_masters_list() -> None:
    pool = DecoderPool(["127.0.0.1:9"], None)
    pool.listed_by_master([("127.0.0.1:1", 0.0)])
    assert pool.addresses == ["127.0.0.1:9"]
    pool.close()


def test_a_pool_without_decoders_and_without_a_master_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one decoder"):
        DecoderPool([], None)


def test_among_decoders_with_nothing_outstanding_the_least_busy_is_asked_first() -> None:
    pool = DecoderPool([], None, listed=True)
    pool.listed_by_master([("127.0.0.1:1", 0.9), ("127.0.0.1:2", 0.2)])
    first = pool._take()
    assert first is not None and first.address == "127.0.0.1:2"
    second = pool._take()  # the least busy has one outstanding now: the other is asked
    assert second is not None and second.address == "127.0.0.1:1"
    pool._give(first, failed=False)
    pool._give(second, failed=False)
    pool.close()
