"""The shell's converter (trainfeed.master.serve.convert) between the wire and the core's types
(trainfeed.master.core.messages): every field of every message crosses, both ways.

Driven by the messages' descriptors, so that a field added to master.proto and not carried by the
converter fails here (the core would silently never see it, or the reader never be told it),
rather than in an integration test minutes later, or nowhere.
"""
from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from trainfeed.master.core.ledger import LeaseStatus, Outcome
from trainfeed.master.core.messages import (
    EpochComplete,
    FailedPartition,
    GetTasks,
    GiveBack,
    Grant,
    Granted,
    GroupBroken,
    Heard,
    Heartbeat,
    HeldTask,
    Holding,
    JobStatus,
    Opened,
    Report,
    Revoked,
    Superseded,
    Task,
)
from trainfeed.master.serve import convert
from trainfeed.v1 import master_pb2 as pb

# Fields the shell reads itself and the core never sees: a stream's `open` (its session), and
# WatchEvent's stream-level ones (the shell's greeting `grants`, a refused grant's
# `grant_refused`: neither is the core's answer); and the decode workers' (issue 37: their beats
# and the list the readers are told are the shell's, trainfeed.master.serve.decoder_streams).
SHELL_ONLY = {"SessionMessage.open", "WatchEvent.grants", "WatchEvent.grant_refused",
              "SessionMessage.decoder", "WatchEvent.decoders", "WatchEvent.decoders_listed"}
# Fields only a reader sends: whether it began a lease it lists (a lease the master names back
# to it, revoked or asked back, says no more than which one).
INBOUND_ONLY = {"HeldTask.started"}


def filled(message: Message, depth: int = 0) -> Message:
    """`message` with every field set to a value that is not its default (nested ones too)."""
    for f in message.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(message, f.name)[7] = 9
        elif f.message_type is not None:
            item = (getattr(message, f.name).add() if f.is_repeated
                    else getattr(message, f.name))
            filled(item, depth + 1)
        elif f.is_repeated:
            getattr(message, f.name).append(_value(f))
        else:
            setattr(message, f.name, _value(f))
    return message


def _value(f: FieldDescriptor) -> Any:
    """A value of `f` that is not its default, and differs from its siblings' (a converter that
    swaps two fields is caught)."""
    if f.enum_type is not None:
        return max(v.number for v in f.enum_type.values)  # (not 0: the default)
    if f.type == FieldDescriptor.TYPE_BOOL:
        return True
    if f.type == FieldDescriptor.TYPE_STRING:
        return f"a {f.name}"
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return f.number + 0.5
    return f.number + 100


def unset(message: Message, prefix: str = "") -> list[str]:
    """The fields of `message` (nested ones as Outer.inner) left at their default."""
    missing = []
    for f in message.DESCRIPTOR.fields:
        if f"{message.DESCRIPTOR.name}.{f.name}" in INBOUND_ONLY:
            continue
        name = f"{prefix}{message.DESCRIPTOR.name}.{f.name}"
        value = getattr(message, f.name)
        if f.is_repeated:
            if not len(value):
                missing.append(name)
            elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
                missing += unset(value[0], f"{name}:")
        elif f.message_type is not None:
            if not message.HasField(f.name):
                missing.append(name)
            else:
                missing += unset(value, f"{name}:")
        elif value == f.default_value and not (f.has_presence and message.HasField(f.name)):
            missing.append(name)
    return missing


def same(wire: Message, domain: Any, prefix: str = "") -> list[str]:
    """The fields of `wire` whose value `domain` (an object with attributes of the same names)
    does not carry."""
    differ = []
    for f in wire.DESCRIPTOR.fields:
        name = f"{prefix}{wire.DESCRIPTOR.name}.{f.name}"
        if name in SHELL_ONLY:
            continue
        if not hasattr(domain, f.name):
            differ.append(name)
            continue
        ours, theirs = getattr(domain, f.name), getattr(wire, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            ok = dict(ours) == dict(theirs)
        elif f.message_type is not None and f.is_repeated:
            differ += [d for a, b in zip(theirs, ours) for d in same(a, b, f"{name}:")]
            ok = len(ours) == len(theirs)
        elif f.message_type is not None:
            differ += same(theirs, ours, f"{name}:")
            ok = True
        elif f.name == "outcome":
            ok = ours is convert.OUTCOMES[theirs]
        elif f.is_repeated:
            ok = list(ours) == list(theirs)
        else:
            ok = ours == theirs
        if not ok:
            differ.append(name)
    return differ


@pytest.mark.parametrize("kind", ["get_tasks", "report"])
def test_every_field_of_a_session_message_reaches_the_core(kind: str) -> None:
    wire = filled(pb.SessionMessage())
    wire.ClearField("get_tasks" if kind == "report" else "report")
    for r in (wire.get_tasks if kind == "get_tasks" else wire.report).reports:
        r.outcome = pb.TaskReport.FAILED
    message = convert.message(wire)
    assert isinstance(message, GetTasks if kind == "get_tasks" else Heartbeat)
    assert message.seq == wire.seq
    body = wire.get_tasks if kind == "get_tasks" else wire.report
    assert same(body, message) == []


def test_every_field_of_an_open_job_reaches_the_core() -> None:
    wire = filled(pb.OpenJobRequest())
    assert same(wire, convert.open_job(wire)) == []


def test_an_outcome_this_master_does_not_know_reaches_the_core_as_its_number() -> None:
    wire = pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=[
        pb.TaskReport(outcome=0), pb.TaskReport(outcome=77), pb.TaskReport(outcome=3)]))
    message = convert.message(wire)
    assert [r.outcome for r in message.reports] == [0, 77, Outcome.PROGRESS]


def test_a_message_without_stats_or_group_shares_the_empty_ones() -> None:
    message = convert.message(pb.SessionMessage(report=pb.ReportRequest()))
    assert message.stats is convert.NO_STATS and message.sync is None


LEASE = HeldTask(1, 2, 3)
TASK = Task(1, 2, "s", 3, 4, 5, 6, 7, 8, 9)
GRANT = Grant(status=LeaseStatus.EPOCH_DONE, epoch=2, todo_left=3, tasks=[TASK], revoked=[LEASE],
              failed=[FailedPartition(1, "why", 4)], failed_known=True, give_back=[LEASE],
              group_broken="broken", holders=[Holding("w", 2, 3.5, 4.5)], revoked_why="why",
              superseded="superseded")


def test_every_field_of_a_grant_reaches_the_wire() -> None:
    wire = convert.answer(Granted(seq=4, epoch=2, grant=GRANT, refused=[LEASE], refused_count=1))
    assert unset(wire.grant) == []
    assert same(wire.grant, GRANT) == [
        "GetTasksResponse.status", "GetTasksResponse.current_epoch"]  # (named otherwise)
    assert (wire.grant.status, wire.grant.current_epoch) == (pb.GetTasksResponse.EPOCH_DONE, 2)
    assert (wire.answers, wire.current_epoch, wire.refused_count) == (4, 2, 1)


def test_every_field_of_a_watch_event_is_some_answers_or_events() -> None:
    """Together, the core's answers and events set every field of WatchEvent but the shell's."""
    told = [convert.answer(Granted(4, 2, GRANT, [LEASE], 1)),
            convert.answer(Heard(5, 2, [LEASE], [LEASE], "broken", "why", [LEASE], 1)),
            *(convert.event(e) for e in (GiveBack(2, [LEASE]), Revoked(2, [LEASE], "why"),
                                         Superseded(2, "why"), EpochComplete(2),
                                         GroupBroken(2, "broken")))]
    everywhere = set.intersection(*(set(unset(w)) for w in told))
    assert everywhere == SHELL_ONLY - {"SessionMessage.open", "SessionMessage.decoder"}
    heard = told[1]
    assert (heard.revoked_why, heard.superseded, heard.group_broken) == ("why", "why", "broken")


def test_every_field_of_the_unary_answers_reaches_the_wire() -> None:
    opened = Opened(worker_id="w", job="j", dataset="d", dataset_url="u",
                    storage_options_json="{}", fields=[("a", "int")], num_records=1,
                    num_partitions=2, current_epoch=3, lease_timeout_s=4.5, num_bytes=5,
                    resumed_partitions=6, session_secret="s", resume_credential="c",
                    resume_cut=7, protocol_version=8, dataset_version=9)
    assert unset(convert.opened(opened)) == []
    status = JobStatus("j", "d", 1, 2, 3, 4, 5, 6, 7, ["p"], 8, 9, 10, 0)
    wire = convert.job_status(status)
    assert unset(wire) == [] and wire.metrics_port == 0  # (set, though 0: the proto says so)
    assert same(wire, status) == []


def test_reports_keep_what_the_core_reads() -> None:
    [report] = convert.reports([pb.TaskReport(epoch=1, partition=2, outcome=pb.TaskReport.DONE,
                                              lease=3, consumed=4, reason="r")])
    assert report == Report(1, 2, Outcome.DONE, 3, 4, "r")
