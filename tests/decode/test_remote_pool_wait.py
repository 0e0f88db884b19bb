"""A trainer waiting on its decoders says so (no silent waits): a fetch that gets no record for
WAIT_LOG_S logs what it waits for and until when, before it gives up at the pool's give-up
time (trainfeed.decode.remote.client)."""
from __future__ import annotations

import logging
import re
import socket
import threading

import pytest

from trainfeed.decode.remote import client
from trainfeed.decode.remote.client import DecoderPool, RequestTemplate
from trainfeed.errors import DecodersUnavailableError
from trainfeed.io.prefetch import TaskRef


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def a_request() -> client.DecodeRequest:
    template = RequestTemplate(
        dataset="flowers", version=None, shuffle_seed=None, seed=0, mode="validation",
        fields=("image",), image_fields=("image",),
        decode={"enabled": True, "image_size": (24, 24), "resize_shorter": 28},
        max_pixels=1 << 24, chunk=10)
    return template.request(TaskRef(0, 3, "data/s.parquet", 0, 1, 10), 0, 10)


def test_a_wait_on_a_pool_with_no_live_decoder_is_logged_before_giving_up(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shorter than the 5 s and 60 s a trainer uses, in the same order: the line comes first.
    monkeypatch.setattr(client, "WAIT_LOG_S", 1.0)
    addresses = [f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"]
    pool = DecoderPool(addresses, "a-token-no-decoder-sees-0123456789", give_up_s=2.0)
    try:
        with caplog.at_level(logging.WARNING, logger=client.__name__), \
                pytest.raises(DecodersUnavailableError, match="answered for 2 s") as gave_up:
            pool.fetch(a_request())
    finally:
        pool.close()
    waits = [r.getMessage() for r in caplog.records if r.name == client.__name__]
    assert len(waits) == 1, waits  # once, not on every retry (again after WAIT_LOG_EVERY_S)
    wait = waits[0]
    assert "no record of partition 3 of epoch 0" in wait
    assert all(a in wait for a in addresses), wait
    assert re.search(r"asking until \d\d:\d\d:\d\d, then the task fails \(give-up time 2 s\)",
                     wait), wait
    assert re.search(r"last: 127\.0\.0\.1:\d+: ", wait), wait  # why: the last call's failure
    assert "last: 127.0.0.1:" in str(gave_up.value)


def test_decoders_that_hang_in_turn_are_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two decoders that accept calls and never answer (stopped, as with SIGSTOP: the kernel
    takes the connection, nothing replies), each call given up after a deadline longer than
    DOWN_S: one is always back by the time the other failed, so the pool was never all down,
    and the fetch, checking its give-up time only then, asked them for ever. It gives up."""
    monkeypatch.setattr(client, "CALL_TIMEOUT_S", client.DOWN_S * 1.5)
    with socket.socket() as one, socket.socket() as two:
        for s in (one, two):
            s.bind(("127.0.0.1", 0))
            s.listen(16)  # never accepted, never answered
        pool = DecoderPool([f"127.0.0.1:{s.getsockname()[1]}" for s in (one, two)],
                           "a-token-no-decoder-sees-0123456789", give_up_s=4 * client.DOWN_S)
        outcome: list[BaseException] = []

        def fetch() -> None:
            try:
                pool.fetch(a_request())
            except BaseException as e:  # noqa: B036 (handed to the test's thread)
                outcome.append(e)
        thread = threading.Thread(target=fetch, daemon=True)
        thread.start()
        thread.join(120)  # (a liveness bound: the fetch gives up after ~4 calls)
        pool.close()
    assert not thread.is_alive(), "the fetch never gave up"
    assert len(outcome) == 1 and isinstance(outcome[0], DecodersUnavailableError), outcome
    assert "answered for 4 s" in str(outcome[0])


def test_a_wait_for_the_masters_first_decoder_says_none_is_registered(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: a pool kept to the master's list, which is empty (no decoder registered):
    the wait line and the error say so and what to start, not an empty list."""
    monkeypatch.setattr(client, "WAIT_LOG_S", 1.0)
    pool = DecoderPool([], "a-token-no-decoder-sees-0123456789", give_up_s=2.0, listed=True)
    try:
        with caplog.at_level(logging.WARNING, logger=client.__name__), \
                pytest.raises(DecodersUnavailableError, match="the master lists no decoder"):
            pool.fetch(a_request())
    finally:
        pool.close()
    waits = [r.getMessage() for r in caplog.records if r.name == client.__name__]
    assert len(waits) == 1 and "trainfeed decoder --master" in waits[0], waits
