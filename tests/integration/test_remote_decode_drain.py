"""A decoder stopped by SIGTERM (a Kubernetes scale-down or rollout) drains (issue 37): it
leaves the master's list at once, refuses new calls (the trainer asks another decoder, not
counting a failure), lets the calls in flight finish within its --drain-s grace, and exits 0; a
call outlasting the grace is cut, and its trainer resumes it elsewhere. Real decoder and master
processes; the trainer's side is DecoderPool, held mid-call as test_remote_decode holds one.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow.flight as flight
import pytest
from integration.decoding import DECODER_TOKEN
from integration.test_decoder_discovery import wait_registered
from integration.test_remote_decode import a_request, admitted, ended, train_request

from trainfeed.decode.remote.client import DecoderPool
from trainfeed.decode.remote.wire import DecodeRequest
from trainfeed.decoder.drain import LOG_AFTER_S
from trainfeed.decoder.process import DecoderProcess
from trainfeed.lease.client import MasterClient
from trainfeed.master.core.decoders import TIMEOUT_S
from trainfeed.master.serve.process import MasterProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = DECODER_TOKEN
# A grace no call of these tests outlasts on the loaded CI machine (seven 24x24 crops), unless
# held on purpose: the decoder must still be draining whenever the test looks.
LONG_GRACE_S = 120.0
# A grace the held call outlasts: over the 5 s after which a drain says what it waits for.
SHORT_GRACE_S = 3 * LOG_AFTER_S
# What the process may take, beyond its grace, to exit (interpreter teardown on a loaded
# machine): a bound, not a figure.
EXIT_MARGIN_S = 60.0
STOPPING = "SIGTERM: stopping"


def rows(batches: list[Any]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


def wait_for_line(decoder: DecoderProcess, text: str, within_s: float) -> str:
    """The decoder's first output line holding `text`; fails if it exits or `within_s`
    passes first."""
    deadline = time.monotonic() + within_s
    while True:
        found = [line for line in decoder.log if text in line]
        if found:
            return found[0]
        assert decoder.proc.poll() is None, (f"the decoder exited ({decoder.proc.returncode}) "
                                             f"before saying {text!r}:\n"
                                             + "".join(decoder.log[-20:]))
        assert time.monotonic() < deadline, f"no {text!r} line:\n" + "".join(decoder.log[-20:])
        time.sleep(0.05)


def undisturbed(storage: str, request: DecodeRequest) -> list[dict[str, Any]]:
    with DecoderProcess(storage, TOKEN) as decoder:
        pool = DecoderPool([decoder.address], TOKEN)
        try:
            return rows(pool.fetch(request))
        finally:
            pool.close()


def hold_after_two(monkeypatch: pytest.MonkeyPatch, decoder: DecoderProcess,
                   held: Any) -> None:
    """DecoderPool's calls to `decoder` run `held()` after their second record (once): the
    call is in flight on the decoder meanwhile (credit granted for more, unread)."""
    call = DecoderPool._call
    done: list[bool] = []

    def holding(self: DecoderPool, target: Any, rest: DecodeRequest) -> Iterator[Any]:
        for n, batch in enumerate(call(self, target, rest)):
            yield batch
            if target.address == decoder.address and n == 1 and not done:
                done.append(True)
                held()
    monkeypatch.setattr(DecoderPool, "_call", holding)


def test_a_call_in_flight_finishes_from_a_stopping_decoder_and_new_calls_go_elsewhere(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM mid-call: the call goes on from that decoder to its end (every record once,
    the undisturbed bytes); a call made meanwhile is refused by it and served by the other,
    not counted as its failure; the decoder then exits 0 within its grace."""
    request = DecodeRequest(**{**train_request(storage).__dict__, "chunk": 1})  # 7 chunks
    want = undisturbed(storage, request)
    with DecoderProcess(storage, TOKEN, drain_s=LONG_GRACE_S) as stopping, \
            DecoderProcess(storage, TOKEN) as other:
        # (Ties: the first is asked. Over the network: through shared memory, a call's
        # records come as one chunk.)
        pool = DecoderPool([stopping.address, other.address], TOKEN, shared_memory=False)
        later = DecoderPool([stopping.address, other.address], TOKEN)
        meanwhile: list[list[dict[str, Any]]] = []

        def signal_and_call_again() -> None:
            stopping.terminate()
            wait_for_line(stopping, STOPPING, LONG_GRACE_S)
            meanwhile.append(rows(later.fetch(request)))

        hold_after_two(monkeypatch, stopping, signal_and_call_again)
        signalled = time.monotonic()
        try:
            got = rows(pool.fetch(request))
            assert meanwhile == [want]
            assert later.served() == {stopping.address: 0, other.address: 1}
            assert later.failed() == {stopping.address: 0, other.address: 0}
            assert later.drained() == {stopping.address: 1, other.address: 0}
            assert pool.served() == {stopping.address: 1, other.address: 0}
            assert pool.failed() == {stopping.address: 0, other.address: 0}
        finally:
            pool.close()
            later.close()
        assert got == want and len(got) == 7
        status = stopping.proc.wait(LONG_GRACE_S + EXIT_MARGIN_S)
        assert status == 0, "".join(stopping.log[-20:])
        assert time.monotonic() - signalled < LONG_GRACE_S + EXIT_MARGIN_S
        assert other.proc.poll() is None


def listings(client: MasterClient, job: str) -> tuple[list[list[str]], Any]:
    """A reader stream of `job` on the master: every decoder list it is told, as they come
    (a thread appends them), and the stream (cancel it)."""
    opened = client.open_job(job, "flowers", 0)
    stream = client.session(opened.job, opened.worker_id)
    told: list[list[str]] = []

    def read() -> None:
        try:
            for event in stream:
                if event.decoders_listed:
                    told.append([d.address for d in event.decoders])
        except Exception:  # cancelled at the end
            pass
    threading.Thread(target=read, daemon=True).start()
    return told, stream


def test_a_stopping_decoder_leaves_the_masters_list_while_its_call_goes_on(
        storage: str) -> None:
    """SIGTERM with a call held in flight: the master stops listing the decoder well before
    its silence timeout (the registration stream ended), while the decoder still serves the
    call; once the call ends, it exits 0."""
    with MasterProcess(storage, token=TOKEN) as master, \
            DecoderProcess(storage, TOKEN, master=master.address,
                           drain_s=LONG_GRACE_S) as decoder, \
            MasterClient(master.address, token=TOKEN) as client:
        wait_registered(decoder)
        told, stream = listings(client, "drained")
        flights = flight.connect(f"grpc://{decoder.address}")
        options = flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=300)
        # Ten records, one a chunk: the held call has nine left to send.
        command = flight.FlightDescriptor.for_command(a_request(storage, chunk=1).encode())
        try:
            deadline = time.monotonic() + LONG_GRACE_S
            while not told or told[-1] != [decoder.address]:
                assert time.monotonic() < deadline, told
                time.sleep(0.05)
            held = admitted(flights, command, options)
            decoder.terminate()
            signalled = time.monotonic()
            while told[-1]:  # (the master tells each change of its list)
                assert time.monotonic() - signalled < TIMEOUT_S, told
                time.sleep(0.05)
            assert decoder.proc.poll() is None, "".join(decoder.log[-20:])
            assert any(STOPPING in line for line in decoder.log)
            ended(*held)
            status = decoder.proc.wait(LONG_GRACE_S + EXIT_MARGIN_S)
            assert status == 0, "".join(decoder.log[-20:])
        finally:
            stream.cancel()
            flights.close()


def test_a_call_outlasting_the_grace_is_cut_and_resumed_elsewhere(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call held past the grace: after LOG_AFTER_S the decoder says it still drains one
    call and until when; at the grace's end the call is cut and the decoder exits 143
    (128 + SIGTERM); the trainer asks the other decoder for the rest, and every record comes
    once, with the undisturbed bytes."""
    request = DecodeRequest(**{**train_request(storage).__dict__, "chunk": 1})
    want = undisturbed(storage, request)
    with DecoderProcess(storage, TOKEN, drain_s=SHORT_GRACE_S) as stopping, \
            DecoderProcess(storage, TOKEN) as other:
        pool = DecoderPool([stopping.address, other.address], TOKEN, shared_memory=False)
        statuses: list[int] = []

        def outlast_the_grace() -> None:
            stopping.terminate()
            statuses.append(stopping.proc.wait(SHORT_GRACE_S + EXIT_MARGIN_S))

        hold_after_two(monkeypatch, stopping, outlast_the_grace)
        try:
            got = rows(pool.fetch(request))
            assert pool.failed() == {stopping.address: 1, other.address: 0}
            assert pool.served() == {stopping.address: 0, other.address: 1}
        finally:
            pool.close()
        assert got == want and len(got) == 7
        assert statuses == [143], "".join(stopping.log[-20:])
        stopping.stop()  # (its output read to the end)
        log = "".join(stopping.log)
        assert re.search(r"still draining: 1 call\(s\) in flight; waiting for them until "
                         r"\d\d:\d\d:\d\d", log), log
        assert f"the {SHORT_GRACE_S:g} s grace is over with 1 call(s) in flight: cut" in log, log
