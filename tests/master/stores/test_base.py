"""The leadership loop every state store shares: it waits out holders and transient errors,
gives up after `wait_s` with the store's own message, and warns once per holder it sees."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from trainfeed.errors import LeadershipError
from trainfeed.master.stores.base import wait_for_leadership


class Unreachable(ConnectionError):
    pass


def attempts(*outcomes: str | None | Exception) -> Callable[[], str | None]:
    """A try_acquire that returns (or raises) `outcomes` in turn, then keeps the last."""
    it: Iterator[str | None | Exception] = iter(outcomes)
    last: list[str | None | Exception] = [None]

    def attempt() -> str | None:
        last[0] = next(it, last[0])
        if isinstance(last[0], Exception):
            raise last[0]
        return last[0]
    return attempt


def test_holders_are_waited_out_and_each_one_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    wait_for_leadership(attempts("a:1", "a:1", "b:2", None), None,
                        refusal=lambda h: f"held by {h}", waiting=lambda h: f"waiting for {h}")
    assert [r.getMessage() for r in caplog.records] == ["waiting for a:1", "waiting for b:2"]


def test_it_gives_up_after_wait_s_with_the_stores_message() -> None:
    with pytest.raises(LeadershipError, match=r"^state x is held by m:7$"):
        wait_for_leadership(attempts("m:7"), 0, refusal=lambda h: f"state x is held by {h}",
                            waiting=lambda h: "")


def test_transient_errors_are_retried_then_raised_after_wait_s() -> None:
    wait_for_leadership(attempts(Unreachable("etcd down"), None), None, transient=(Unreachable,),
                        refusal=lambda h: "", waiting=lambda h: "")
    with pytest.raises(Unreachable, match="etcd down"):
        wait_for_leadership(attempts(Unreachable("etcd down")), 0, transient=(Unreachable,),
                            refusal=lambda h: "", waiting=lambda h: "")
    with pytest.raises(ValueError):  # not transient: at once
        wait_for_leadership(attempts(ValueError("bug")), None, transient=(Unreachable,),
                            refusal=lambda h: "", waiting=lambda h: "")
