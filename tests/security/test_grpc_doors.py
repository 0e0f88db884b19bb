"""The master's gRPC doors that no token guards, and the numbers it takes from flags and readers
(issue 35):

- `grpc.health.v1.Health/Watch` needs no token: past MAX_HEALTH_WATCHES streams it answers
  RESOURCE_EXHAUSTED, so 2,000 of them leave the master small while an honest reader reads its
  epoch exactly once;
- connections past `--max-connections` are closed as they are accepted, and a freed slot is
  taken again;
- a lease timeout that is NaN, infinite or out of range is refused naming the flag;
- a reader summary with a NaN, infinite, negative or absurd figure is dropped whole, never
  summed into the page's and the metrics' totals.
"""
from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from integration.raw_calls import exchange, open_request, session_open
from integration.test_borrowed_identities import MIB, exactly_once, honest_pass, rss_bytes
from integration.test_master_metrics import scrape, value

from trainfeed.errors import ConfigurationError
from trainfeed.lease.client import CHANNEL_OPTIONS
from trainfeed.master.core.jobs import MAX_LEASE_TIMEOUT_S, MIN_LEASE_TIMEOUT_S, MasterConfig
from trainfeed.master.core.reader_stats import FIELDS, MAX_COUNT, MAX_SECONDS, SECONDS, ReaderBoard
from trainfeed.master.serve import convert
from trainfeed.master.serve.health import MAX_HEALTH_WATCHES
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.serve.server import ServerOptions
from trainfeed.storage import open_storage
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

WATCHES = 2_000
CHANNELS = 20  # 100 watches each: under the 128 streams a connection may carry
# Each channel its own connection (gRPC shares one between channels of the same arguments).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def watch_all(address: str, channels: int, per_channel: int
              ) -> tuple[list[grpc.Channel], list[Any], dict[str, int]]:
    """Opens `per_channel` Health/Watch streams on each of `channels` connections and waits for
    each one's first answer: the channels, the calls (to cancel) and how each ended so far
    ("held" for a stream that answered and stays open, else the status code's name)."""
    opened = [grpc.insecure_channel(address, options=OWN_CONNECTION) for _ in range(channels)]
    calls = [health_pb2_grpc.HealthStub(c).Watch(health_pb2.HealthCheckRequest(), timeout=120)
             for c in opened for _ in range(per_channel)]
    outcomes: dict[str, int] = {}
    for call in calls:
        try:
            next(call)
            what = "held"
        except grpc.RpcError as e:
            what = e.code().name
        outcomes[what] = outcomes.get(what, 0) + 1
    return opened, calls, outcomes


@pytest.mark.integration
@pytest.mark.slow
def test_health_watches_past_the_cap_are_refused_and_the_master_stays_small(
        storage: str) -> None:
    """On f44c545 all 2,000 streams were held (+41 MB); now MAX_HEALTH_WATCHES are."""
    with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master:
        with honest_pass(master) as (_, got):
            before = rss_bytes(master.proc.pid)
            opened, calls, outcomes = watch_all(master.address, CHANNELS, WATCHES // CHANNELS)
            grown = rss_bytes(master.proc.pid) - before
            print(f"{WATCHES} health watches: {outcomes}; master RSS +{grown / MIB:.1f} MiB")
            # A stream that neither answered nor was refused (gRPC, under load, sometimes
            # cancels a few) holds nothing either.
            assert outcomes.get("held", 0) <= MAX_HEALTH_WATCHES, outcomes
            assert outcomes.get("RESOURCE_EXHAUSTED", 0) >= WATCHES - MAX_HEALTH_WATCHES - \
                outcomes.get("CANCELLED", 0), outcomes
            assert grown < 50 * MIB
            with grpc.insecure_channel(master.address, options=OWN_CONNECTION) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=30)  # Check still answers
                assert check.status == health_pb2.HealthCheckResponse.SERVING
            for call in calls:
                call.cancel()
            for channel in opened:
                channel.close()
        exactly_once(got)


def check(channel: grpc.Channel, wait: bool) -> grpc.StatusCode:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30,
                                                  wait_for_ready=wait)
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_connections_past_the_cap_are_closed_and_a_freed_slot_is_taken_again(
        storage: str) -> None:
    cap = 4
    with MasterProcess(storage, extra_args=["--max-connections", str(cap)],
                       metrics_port=None) as master:
        held = [grpc.insecure_channel(master.address, options=OWN_CONNECTION)
                for _ in range(cap)]
        extra = [grpc.insecure_channel(master.address, options=OWN_CONNECTION)
                 for _ in range(3)]
        try:
            assert [check(c, wait=True) for c in held] == [grpc.StatusCode.OK] * cap
            assert [check(c, wait=False) for c in extra] == [grpc.StatusCode.UNAVAILABLE] * 3
            held.pop().close()  # a slot frees: a new client gets it
            extra.append(grpc.insecure_channel(master.address,
                                               options=[*OWN_CONNECTION, *CHANNEL_OPTIONS]))
            assert check(extra[-1], wait=True) == grpc.StatusCode.OK
        finally:
            for channel in held + extra:
                channel.close()


def test_server_options_refuse_a_connection_cap_below_one() -> None:
    with pytest.raises(ConfigurationError, match="--max-connections must be in 1..2147483647"):
        ServerOptions(max_connections=0)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 0.0, -1.0,
                                     MIN_LEASE_TIMEOUT_S / 2, MAX_LEASE_TIMEOUT_S * 2, True])
def test_a_lease_timeout_that_is_not_a_sane_number_is_refused_naming_the_flag(
        seconds: float, tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError) as refused:
        MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=seconds)
    assert "--lease-timeout" in str(refused.value) and repr(seconds) in str(refused.value)
    for good in (MIN_LEASE_TIMEOUT_S, 30.0, MAX_LEASE_TIMEOUT_S):
        assert MasterConfig(open_storage(str(tmp_path)), lease_timeout_s=good)


@pytest.mark.parametrize("field", ["max_sessions", "max_failures", "target_partitions"])
def test_whole_number_settings_refuse_fractions_and_zero(field: str, tmp_path: Any) -> None:
    for bad in (0, 1.5, math.nan):
        with pytest.raises(ConfigurationError, match=field):
            MasterConfig(open_storage(str(tmp_path)), **{field: bad})


@pytest.mark.parametrize("given", ["nan", "inf"])
def test_the_master_command_refuses_a_lease_timeout_of_nan_or_inf(given: str,
                                                                  tmp_path: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainfeed.cli.main", "master", "--insecure", "--port", "0",
         "--storage", str(tmp_path), "--state", "memory://", "--metrics-port", "none",
         "--lease-timeout", given], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--lease-timeout (lease_timeout_s) must be a number of seconds" in done.stderr
    assert given in done.stderr and "Traceback" not in done.stderr


def good_summary() -> pb.ReaderStats:
    return pb.ReaderStats(wall_s=2, input_wait_s=1, batches=1, records=4, bytes_read=100,
                          read_s=0.5, records_decoded=4, decode_s=0.25, decode_failures=0)


BAD = [(name, bad) for name in SECONDS
       for bad in (math.nan, math.inf, -math.inf, -1.0, MAX_SECONDS * 2)] + \
      [(name, (1 << 64) - 1) for name in FIELDS if name not in SECONDS] + \
      [(name, MAX_COUNT + 1) for name in FIELDS if name not in SECONDS]


@pytest.mark.parametrize(("field", "bad"), BAD, ids=[f"{f}={b!r}" for f, b in BAD])
def test_a_summary_with_a_figure_no_reader_measures_is_dropped_whole(
        field: str, bad: float, caplog: pytest.LogCaptureFixture) -> None:
    board = ReaderBoard()
    board.record("j", "r", convert.reader_stats(good_summary()), 100.0)
    before = board.totals("j")
    hostile = good_summary()
    setattr(hostile, field, bad)
    with caplog.at_level(logging.WARNING, "trainfeed.master.core.reader_stats"):
        for t in range(3):
            board.record("j", "r", convert.reader_stats(hostile), 101.0 + t)
    assert board.totals("j") == before
    assert all(math.isfinite(v) for v in board.totals("j").values())
    [view] = board.views("j", 104.0)
    assert view.records == 4 and math.isfinite(view.input_bound)
    assert board.dropped == 3
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and field in logged[0], logged  # the first one, naming the field
    board.record("j", "r", convert.reader_stats(good_summary()), 105.0)  # honest: still summed
    assert board.totals("j")["records"] == 8


def test_figures_at_their_bounds_are_kept() -> None:
    board = ReaderBoard()
    edge = pb.ReaderStats(wall_s=MAX_SECONDS, input_wait_s=0, read_s=MAX_SECONDS,
                          decode_s=0, records=MAX_COUNT, bytes_read=MAX_COUNT)
    board.record("j", "r", convert.reader_stats(edge), 100.0)
    assert board.dropped == 0 and board.totals("j")["records"] == MAX_COUNT


@pytest.mark.integration
def test_a_nan_summary_sent_to_a_real_master_never_reaches_its_metrics(storage: str) -> None:
    """On f44c545 the master summed it: its input-wait counter read NaN for good."""
    with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master, \
            grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        opened = stub.OpenJob(open_request(job="j", dataset="flowers", worker_name="r"),
                              timeout=30)
        hostile = good_summary()
        hostile.input_wait_s = math.nan
        hostile.decode_s = -5.0
        for stats in (hostile, good_summary()):
            exchange(stub, session_open("j", opened.worker_id, opened.session_secret),
                     pb.SessionMessage(seq=1, get_tasks=pb.GetTasksRequest(
                         epoch=0, max_tasks=0, wait_ms=0, stats=stats)))
        deadline = time.monotonic() + 30  # the figures are read on the master's loop
        samples = scrape(master)
        while ("trainfeed_reader_records_total", frozenset({("job", "j")})) not in samples \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            samples = scrape(master)
        assert value(samples, "trainfeed_reader_input_wait_seconds_total", job="j") == 1.0
        assert value(samples, "trainfeed_reader_decode_seconds_total", job="j") == 0.25
        assert value(samples, "trainfeed_reader_records_total", job="j") == 4
