"""Decoders found through the master (issue 37): `trainfeed decoder --master` registers on a
Session stream of its own, and readers with TRAINFEED_DECODE=remote and no TRAINFEED_DECODERS
use the decoders the master lists, as they come and go. Real master and decoder processes.

Also the registration's doors: only the master's own token registers a decoder (trainers send
their job token to the decoders they are told), an address a trainer could not dial is refused,
a decoder stream carries only beats, and a decoder silent for the timeout is dropped.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from cluster.apiserver import FakeApiServer
from integration.decoding import DECODER_TOKEN

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.cli.main import main
from trainfeed.decoder.process import DecoderProcess
from trainfeed.lease.client import MasterClient
from trainfeed.master.core.decoders import TIMEOUT_S
from trainfeed.master.serve.process import MasterProcess
from trainfeed.reader.options import BatchOptions, DecodeOptions, PipelineOptions
from trainfeed.security import job_token
from trainfeed.v1 import master_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = DECODER_TOKEN
OPTIONS = PipelineOptions(
    decode=DecodeOptions(enabled=True, image_size=(24, 24),
                         random_resized_crop=((0.08, 1.0), (3 / 4, 4 / 3)), random_flip=True),
    batch=BatchOptions(size=10))
# A registration shows in the decoder's log; the CI machine may be slow to start one.
REGISTERED_WITHIN_S = 60


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """TRAINFEED_DECODE=remote without TRAINFEED_DECODERS, with `job`'s token."""
    def use(job: str) -> None:
        monkeypatch.setenv("TRAINFEED_DECODE", "remote")
        monkeypatch.delenv("TRAINFEED_DECODERS", raising=False)
        monkeypatch.delenv("TRAINFEED_TOKEN_FILE", raising=False)
        monkeypatch.setenv("TRAINFEED_TOKEN", job_token(TOKEN, job))
    return use


def wait_registered(decoder: DecoderProcess) -> None:
    deadline = time.monotonic() + REGISTERED_WITHIN_S
    while not any("registered with master" in line for line in decoder.log):
        assert decoder.proc.poll() is None, "".join(decoder.log[-20:])
        assert time.monotonic() < deadline, "not registered:\n" + "".join(decoder.log[-20:])
        time.sleep(0.1)


def epoch_pixels(reader: Any) -> dict[int, bytes]:
    """One pass: each record id's pixels; fails on a record delivered twice."""
    got: dict[int, bytes] = {}
    for batch in reader():
        for i, image in zip(batch["_id"], batch["image"]):
            assert int(i) not in got, f"record {i} delivered twice"
            got[int(i)] = np.ascontiguousarray(image).tobytes()
    return got


def local_epochs(storage: str, epochs: int) -> list[dict[int, bytes]]:
    reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                         pipeline=OPTIONS)
    try:
        return [epoch_pixels(reader) for _ in range(epochs)]
    finally:
        reader.close()


def test_a_reader_uses_the_decoders_the_master_lists_as_they_come_and_go(
        storage: str, listed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two registered decoders serve epoch 0 (both asked); both stop, a third registers: epoch
    1 comes from it. Every record exactly once per epoch, with its local pixels."""
    monkeypatch.delenv("TRAINFEED_TOKEN", raising=False)
    want = local_epochs(storage, 2)
    with MasterProcess(storage, token=TOKEN) as master:
        first = DecoderProcess(storage, TOKEN, master=master.address)
        second = DecoderProcess(storage, TOKEN, master=master.address)
        try:
            wait_registered(first)
            wait_registered(second)
            listed("found")
            reader = dist.reader("flowers", source=MasterSource(master.address, "found",
                                                                 seed=7), pipeline=OPTIONS)
            try:
                assert epoch_pixels(reader) == want[0]
                pool = reader._decoders
                assert pool.listed
                served = pool.served()
                assert served[first.address] >= 1 and served[second.address] >= 1, served
                first.stop()
                second.stop()
                with DecoderProcess(storage, TOKEN, master=master.address) as third:
                    wait_registered(third)
                    deadline = time.monotonic() + REGISTERED_WITHIN_S
                    while pool.addresses != [third.address]:  # the master tells the change
                        assert time.monotonic() < deadline, pool.addresses
                        time.sleep(0.1)
                    assert epoch_pixels(reader) == want[1]
                    assert pool.served()[third.address] >= 1
            finally:
                reader.close()
        finally:
            first.stop()
            second.stop()


def beats(*messages: pb.SessionMessage, then_wait: threading.Event | None = None
          ) -> Iterator[pb.SessionMessage]:
    yield from messages
    if then_wait is not None:
        then_wait.wait(TIMEOUT_S * 4)


def decoder_beat(address: str = "127.0.0.1:50999") -> pb.SessionMessage:
    return pb.SessionMessage(decoder=pb.DecoderBeat(address=address, busy=0.5, slots=2))


def ended_with(client: MasterClient, messages: Iterator[pb.SessionMessage]
               ) -> tuple[list[pb.WatchEvent], grpc.StatusCode | None, str]:
    stream = client.decoder_stream(messages)
    events: list[pb.WatchEvent] = []
    try:
        for event in stream:
            events.append(event)
    except grpc.RpcError as e:
        return events, e.code(), e.details() or ""
    return events, None, ""


@pytest.fixture
def token_master(storage: str) -> Iterator[MasterProcess]:
    """A master requiring TOKEN (test_close_at_tail's `master` is an insecure one)."""
    with MasterProcess(storage, token=TOKEN) as master:
        yield master


def test_a_job_token_cannot_register_a_decoder(token_master: MasterProcess) -> None:
    with MasterClient(token_master.address, token=job_token(TOKEN, "flowers-job")) as client:
        events, code, details = ended_with(client, beats(decoder_beat()))
    assert code == grpc.StatusCode.PERMISSION_DENIED, details
    assert "job token" in details and not events
    with MasterClient(token_master.address, token="not-the-token-at-all-0123456789") as client:
        events, code, _ = ended_with(client, beats(decoder_beat()))
    assert code == grpc.StatusCode.UNAUTHENTICATED and not events


@pytest.mark.parametrize("address", ["no-port", "h:99999", "a b:1", "x" * 300 + ":1"])
def test_an_address_a_trainer_could_not_dial_is_refused(token_master: MasterProcess,
                                                        address: str) -> None:
    with MasterClient(token_master.address, token=TOKEN) as client:
        events, code, details = ended_with(client, beats(decoder_beat(address)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert not events
    assert len(details) < 400  # the refusal quotes a bounded text, not the whole address


def test_a_registered_decoder_is_listed_and_a_second_stream_cannot_take_its_address(
        token_master: MasterProcess) -> None:
    held = threading.Event()
    with MasterClient(token_master.address, token=TOKEN) as client:
        first = client.decoder_stream(beats(decoder_beat(), then_wait=held))
        try:
            event = next(iter(first))
            assert event.decoders_listed
            assert [d.address for d in event.decoders] == ["127.0.0.1:50999"]
            _, code, details = ended_with(client, beats(decoder_beat()))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "another stream" in details
        finally:
            held.set()
            first.cancel()


def test_a_decoder_stream_carries_only_beats(token_master: MasterProcess) -> None:
    with MasterClient(token_master.address, token=TOKEN) as client:
        events, code, details = ended_with(client, beats(
            decoder_beat(), pb.SessionMessage(seq=1, report=pb.ReportRequest())))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "only" in details
    assert len(events) == 1 and events[0].decoders_listed


def test_a_silent_decoder_is_dropped_after_the_timeout(token_master: MasterProcess) -> None:
    """One beat, then silence: the master ends the stream (DEADLINE_EXCEEDED) after TIMEOUT_S
    and lists no decoder to a reader stream opened after."""
    held = threading.Event()
    started = time.monotonic()
    try:
        with MasterClient(token_master.address, token=TOKEN) as client:
            events, code, details = ended_with(client, beats(decoder_beat(), then_wait=held))
    finally:
        held.set()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, details
    assert time.monotonic() - started >= TIMEOUT_S
    assert [d.address for d in events[0].decoders] == ["127.0.0.1:50999"]
    with MasterClient(token_master.address, token=TOKEN) as client:
        events, code, _ = ended_with(client, beats(decoder_beat("127.0.0.1:50998")))
    # (ended by the client's iterator running out: the stream ends, the decoder leaves)
    assert [d.address for d in events[0].decoders] == ["127.0.0.1:50998"]


def test_many_readers_are_told_one_list_per_change(token_master: MasterProcess) -> None:
    """Counter of what reader streams are told: each registration reaches an open reader
    stream once (coalesced), as a listing with the new decoder."""
    with MasterClient(token_master.address, token=TOKEN) as client:
        opened = client.open_job("told", "flowers", 0)
        stream = client.session(opened.job, opened.worker_id)
        events = iter(stream)
        first = next(events)
        assert first.grants and first.decoders_listed and not first.decoders
        held = threading.Event()
        decoder = client.decoder_stream(beats(decoder_beat(), then_wait=held))
        try:
            next(iter(decoder))
            told = next(events)
            assert told.decoders_listed
            assert Counter(d.address for d in told.decoders) == {"127.0.0.1:50999": 1}
        finally:
            held.set()
            decoder.cancel()
            stream.cancel()


# -- the master scales the decoders (--scale-decoders) against the stand-in API server ----------
# tests/cluster/apiserver.py's FakeApiServer: a fake, because no real Kubernetes API server runs
# where these tests do. The master's real `kubernetes` client reads and patches through it.
NS = "team-a"
SUBMIT = ["submit", "--name", "resnet", "--image", "reg/trainfeed-torch:0.1.0", "--workers", "2",
          "--dataset", "flowers", "--storage-pvc", "datasets", "--decoders", "1:8", "--",
          "python", "train.py"]
# The master steps every STEP_S (15 s); its first step comes before any figure: up to three.
SCALED_WITHIN_S = 120


def keep_beating(client: MasterClient, stop: threading.Event, busy: float
                 ) -> Iterator[pb.SessionMessage]:
    """A decoder stream's beats, every 2 s until `stop`."""
    while True:
        yield pb.SessionMessage(decoder=pb.DecoderBeat(address="127.0.0.1:50997", busy=busy,
                                                       slots=4, in_flight=4))
        if stop.wait(2):
            return


def test_the_master_scales_the_decoders_up_while_trainers_wait_and_decoders_are_busy(
        storage: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer of job resnet waiting 60 % of its time, one registered decoder 95 % busy: the
    master patches `resnet-decoders` from 1 to 2 replicas, and /status.json and /metrics say
    why."""
    with FakeApiServer() as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path, namespace=NS)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        assert main(SUBMIT) == 0
        stop = threading.Event()
        with MasterProcess(storage, token=TOKEN, extra_args=["--scale-decoders", "resnet"]
                           ) as master, MasterClient(master.address, token=TOKEN) as client:
            decoder = client.decoder_stream(keep_beating(client, stop, busy=0.95))
            opened = client.open_job("resnet", "flowers", 0)
            deadline = time.monotonic() + SCALED_WITHIN_S
            try:
                while True:
                    client.report(opened.job, opened.worker_id, stats=pb.ReaderStats(
                        wall_s=2.0, input_wait_s=1.2, batches=10, records=100))
                    deployment = kube.objects("deployments", NS)["resnet-decoders"]
                    if int(deployment["spec"]["replicas"]) == 2:
                        break
                    assert time.monotonic() < deadline, "not scaled up"
                    time.sleep(2)
                url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore
                request = urllib.request.Request(url, headers={
                    "Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    data = json.load(response)
                as_job = urllib.request.Request(url, headers={
                    "Authorization": f"Bearer {job_token(TOKEN, 'resnet')}"})
                with urllib.request.urlopen(as_job, timeout=30) as response:
                    seen_by_job = json.load(response)
                metrics_url: str = master.metrics_url  # type: ignore[assignment]
                with urllib.request.urlopen(metrics_url, timeout=30) as response:
                    metrics = response.read().decode()
            finally:
                stop.set()
                decoder.cancel()
    job = next(j for j in data["jobs"] if j["job"] == "resnet")
    decision = job["decoder_scaling"]["decision"]
    assert (decision["action"], decision["before"], decision["replicas"]) == ("up", 1, 2)
    assert decision["reason"] == "input-bound"
    assert [d["address"] for d in data["decoders"]] == ["127.0.0.1:50997"]
    # The decoders' addresses are the cluster's: a job token sees its job's decision only.
    assert seen_by_job["decoders"] == []
    assert seen_by_job["jobs"][0]["decoder_scaling"]["decision"]["action"] == "up"
    scaling = [line for line in metrics.splitlines()
               if line.startswith("trainfeed_decoders_scaling{")]
    assert len(scaling) == 1, scaling
    assert all(label in scaling[0] for label in
               ('job="resnet"', 'action="up"', 'reason="input-bound"')), scaling
    assert scaling[0].endswith(" 1.0"), scaling
