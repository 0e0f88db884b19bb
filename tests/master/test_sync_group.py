"""trainfeed.master.core.sync_group and delivery_order: pure rules, time as an argument."""
from __future__ import annotations

import hashlib

import pytest

from trainfeed.master.core import delivery_order
from trainfeed.master.core.messages import DeliveryOrder
from trainfeed.master.core.sync_group import SyncMembers, Verdict, alive_window
from trainfeed.v1 import master_pb2 as pb

TIMEOUT = 30.0
ALIVE = alive_window(TIMEOUT)  # 12 s


def group(now: float = 0.0) -> SyncMembers:
    members = SyncMembers(3, 8, formed=now)
    for rank in range(3):
        assert members.claim(rank, f"w{rank}", f"rank{rank}-h:{rank}", now, ALIVE).verdict \
            is Verdict.TAKE
    return members


def test_a_live_holder_keeps_its_rank_and_a_quiet_one_is_taken_over() -> None:
    members = group()
    refused = members.claim(0, "x", "rank0-h:99", 5.0, ALIVE)
    assert refused.verdict is Verdict.REFUSE and refused.holder is not None
    assert refused.holder.name == "rank0-h:0" and refused.quiet_s == 5.0
    assert members.claim(0, "x", "rank0-h:99", ALIVE + 1, ALIVE).verdict is Verdict.TAKE
    assert "went to rank0-h:99" in members.message_for("w0")  # the old holder is told
    assert members.message_for("x") == ""


def test_a_reader_restored_from_the_holders_checkpoint_takes_its_rank_at_once() -> None:
    members = group()
    assert members.claim(1, "y", "rank1-h:7", 1.0, ALIVE, resumes="w1").verdict is Verdict.TAKE
    assert "restored from its checkpoint" in members.message_for("w1")


def test_a_silent_rank_breaks_the_group_after_a_lease_timeout_naming_it() -> None:
    members = group()
    for t in (10.0, 20.0, 30.0):
        members.seen("w0", t)
        members.seen("w1", t)
    assert members.check(TIMEOUT, TIMEOUT) is None  # w2 heard at 0: exactly a timeout ago
    why = members.check(TIMEOUT + 0.5, TIMEOUT)
    assert why is not None and "rank 2 (rank2-h:2) was last heard from 30 s ago" in why
    assert members.message_for("w0") == why and members.message_for("w1") == why
    assert members.check(TIMEOUT + 1, TIMEOUT) is None  # once


def test_a_rank_that_never_arrives_breaks_the_group() -> None:
    members = SyncMembers(2, 8, formed=0.0)
    members.claim(0, "w0", "rank0", 0.0, ALIVE)
    members.seen("w0", TIMEOUT)
    assert members.check(TIMEOUT, TIMEOUT) is None
    why = members.check(TIMEOUT + 1, TIMEOUT)
    assert why is not None and "rank 1 never arrived" in why


def test_a_rank_that_left_counts_only_while_another_waits() -> None:
    members = group()
    members.leave("w2", 1.0)
    for t in (10.0, 20.0, 31.5):
        members.seen("w0", t)
        members.seen("w1", t)
    assert members.check(31.5, TIMEOUT) is None  # nobody waits: the group may be finishing
    why = members.check(31.5, TIMEOUT, waiting=True)
    assert why is not None and "rank 2 (rank2-h:2) closed its reader" in why
    # A process that rejoins in time mends it.
    mended = group()
    mended.leave("w2", 1.0)
    mended.claim(2, "z", "rank2-h:8", 2.0, ALIVE)
    for t in (10.0, 20.0, 31.5):
        for w in ("w0", "w1", "z"):
            mended.seen(w, t)
    assert mended.check(31.5, TIMEOUT, waiting=True) is None


def test_after_a_restart_nobody_is_missing_before_the_grace_ends() -> None:
    members = group()
    members.hold_off(100.0, 160.0)
    assert members.check(159.0, TIMEOUT) is None
    assert members.check(161.0, TIMEOUT) is not None


def test_a_fresh_group_tells_the_old_members_why() -> None:
    members = group()
    members.check(100.0, TIMEOUT)
    fresh = members.fresh(101.0, 2, 8)
    assert fresh.empty and "broken" in fresh.message_for("w0")


def test_delivery_orders_are_named_and_get_a_stable_job_of_their_own() -> None:
    plain = DeliveryOrder(seed=0)
    mixed = DeliveryOrder(seed=0, shuffle_buffer=256, resample='"uniform"')
    assert delivery_order.same(plain, DeliveryOrder())
    assert not delivery_order.same(plain, mixed)
    text = delivery_order.conflict("default", plain, mixed, "h:1")
    assert "read with seed=0, shuffle_buffer=0, resample=None (by h:1)" in text
    assert 'asks for seed=0, shuffle_buffer=256, resample="uniform"' in text
    suggested = delivery_order.other_job_name("default", mixed)
    assert f"TRAINFEED_JOB={suggested}" in text
    assert suggested == delivery_order.other_job_name("default", mixed) != \
        delivery_order.other_job_name("default", plain)


@pytest.mark.parametrize("order", [
    DeliveryOrder(), DeliveryOrder(seed=7), DeliveryOrder(seed=2 ** 64 - 1, shuffle_buffer=256),
    DeliveryOrder(resample='"uniform"', sync_batch_size=32),
    DeliveryOrder(seed=300, shuffle_buffer=1 << 31, resample="é" * 200, sync_batch_size=1)])
def test_the_suggested_job_name_is_the_one_the_wire_form_gave(order: DeliveryOrder) -> None:
    """The core hashes its own DeliveryOrder in the wire's encoding: the name it suggests is
    the one a master that hashed the wire message suggested (readers told to move meet)."""
    wire = pb.DeliveryOrder(seed=order.seed, shuffle_buffer=order.shuffle_buffer,
                            resample=order.resample, sync_batch_size=order.sync_batch_size)
    digest = hashlib.sha256(wire.SerializeToString(deterministic=True)).hexdigest()[:6]
    assert delivery_order.other_job_name("j", order) == f"j-{digest}"
