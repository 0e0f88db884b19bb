"""The wire and the core: each message into the core's types, each answer and event back.

The core (trainfeed.master.core) speaks its own types (trainfeed.master.core.messages); this is
the one place that knows both them and the generated protobuf classes. Each message is converted
once, as it arrives (`message`; `open_job`, `leave`), and each answer or event once, as it
leaves (`answer`, `event`; `opened`, `job_status`): nothing of the wire travels further in,
nothing of the core further out.

Cost: a heartbeat (every reader's, every second) is its few reports and held leases, each read
once into a small slotted object; a message without a summary or a group shares one empty one.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainfeed.master.core.ledger import LeaseStatus, Outcome
from trainfeed.master.core.messages import (
    NO_STATS,
    Answer,
    DeliveryOrder,
    EpochComplete,
    Event,
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
    Leave,
    Opened,
    OpenJob,
    ReaderStats,
    Report,
    Resources,
    ResumePosition,
    Revoked,
    SessionMessage,
    Superseded,
    SyncGroup,
    Task,
)
from trainfeed.v1 import master_pb2 as pb

__all__ = ["answer", "event", "grant", "held", "job_status", "leave", "message", "open_job",
           "opened", "reader_stats", "reports", "sync", "watch_event"]

# The wire's outcomes; any other number stays an int (refused by the core, naming it).
OUTCOMES = {pb.TaskReport.DONE: Outcome.DONE, pb.TaskReport.FAILED: Outcome.FAILED,
            pb.TaskReport.PROGRESS: Outcome.PROGRESS, pb.TaskReport.RELEASED: Outcome.RELEASED}
# Builds a named tuple from its values without its Python-level __new__ (which handles keywords
# and defaults: a third of a heartbeat's conversion, measured). Every field is given, in order.
_new = tuple.__new__
STATUS = {LeaseStatus.TASKS: pb.GetTasksResponse.TASKS,
          LeaseStatus.WAIT: pb.GetTasksResponse.WAIT,
          LeaseStatus.EPOCH_DONE: pb.GetTasksResponse.EPOCH_DONE}


# -- in ---------------------------------------------------------------------------------------
def message(m: pb.SessionMessage) -> SessionMessage:
    """A Session message after its `open`: a `get_tasks`, else a heartbeat (its `report`, which
    may be empty)."""
    if m.HasField("get_tasks"):
        g = m.get_tasks
        return GetTasks(seq=m.seq, epoch=g.epoch, max_tasks=g.max_tasks, wait_ms=g.wait_ms,
                        max_records=g.max_records, reconcile=g.reconcile,
                        reports=reports(g.reports), held=held(g.held),
                        sync=sync(g.sync) if g.HasField("sync") else None,
                        stats=reader_stats(g.stats) if g.HasField("stats") else NO_STATS)
    r = m.report
    return Heartbeat(seq=m.seq, reports=reports(r.reports), held=held(r.held),
                     sync=sync(r.sync) if r.HasField("sync") else None,
                     stats=reader_stats(r.stats) if r.HasField("stats") else NO_STATS)


def reports(items: Iterable[pb.TaskReport]) -> list[Report]:
    get = OUTCOMES.get
    return [_new(Report, (r.epoch, r.partition, get(r.outcome, r.outcome), r.lease, r.consumed,
                          r.reason)) for r in items]


def held(items: Iterable[pb.HeldTask]) -> list[HeldTask]:
    return [_new(HeldTask, (t.epoch, t.partition, t.lease, t.started)) for t in items]


def sync(s: pb.SyncGroup) -> SyncGroup:
    return SyncGroup(world_size=s.world_size, rank=s.rank, batch_size=s.batch_size)


def reader_stats(s: pb.ReaderStats) -> ReaderStats:
    return _new(ReaderStats, (s.wall_s, s.input_wait_s, s.batches, s.records, s.bytes_read,
                              s.read_s, s.records_decoded, s.decode_s, s.decode_failures))


# -- out --------------------------------------------------------------------------------------
def _leases(items: Sequence[HeldTask]) -> list[pb.HeldTask]:
    return [pb.HeldTask(epoch=t.epoch, partition=t.partition, lease=t.lease) for t in items]


def _task(t: Task) -> pb.Task:
    return pb.Task(epoch=t.epoch, partition=t.partition, shard=t.shard,
                   row_group_start=t.row_group_start, row_group_stop=t.row_group_stop,
                   num_records=t.num_records, skip_records=t.skip_records, lease=t.lease,
                   stop_records=t.stop_records, row_start=t.row_start)


def _failed(f: FailedPartition) -> pb.FailedPartition:
    return pb.FailedPartition(partition=f.partition, reason=f.reason, num_records=f.num_records)


def _holding(h: Holding) -> pb.Holding:
    return pb.Holding(worker=h.worker, partitions=h.partitions, lease_until=h.lease_until,
                      quiet_s=h.quiet_s)


def grant(g: Grant) -> pb.GetTasksResponse:
    return pb.GetTasksResponse(
        status=STATUS[g.status], current_epoch=g.epoch, todo_left=g.todo_left,
        tasks=[_task(t) for t in g.tasks], revoked=_leases(g.revoked),
        failed=[_failed(f) for f in g.failed], failed_known=g.failed_known,
        give_back=_leases(g.give_back), group_broken=g.group_broken,
        holders=[_holding(h) for h in g.holders], revoked_why=g.revoked_why,
        superseded=g.superseded)


def answer(a: Answer) -> pb.WatchEvent:
    """The answer to a message (its `answers` is the message's seq)."""
    if isinstance(a, Granted):
        return pb.WatchEvent(current_epoch=a.epoch, answers=a.seq, grant=grant(a.grant),
                             refused=_leases(a.refused), refused_count=a.refused_count)
    return _heard(a)


def _heard(a: Heard) -> pb.WatchEvent:
    return pb.WatchEvent(current_epoch=a.epoch, answers=a.seq, revoked=_leases(a.revoked),
                         give_back=_leases(a.give_back), group_broken=a.group_broken,
                         revoked_why=a.why, superseded=a.why, refused=_leases(a.refused),
                         refused_count=a.refused_count)


def event(e: Event) -> pb.WatchEvent:
    """An event the master tells a session unasked."""
    if isinstance(e, GiveBack):
        return pb.WatchEvent(current_epoch=e.epoch, give_back=_leases(e.leases))
    if isinstance(e, Revoked):
        return pb.WatchEvent(current_epoch=e.epoch, revoked=_leases(e.leases),
                             revoked_why=e.why)
    if isinstance(e, Superseded):
        return pb.WatchEvent(current_epoch=e.epoch, superseded=e.why, revoked_why=e.why)
    if isinstance(e, EpochComplete):
        return pb.WatchEvent(current_epoch=e.epoch, epoch_complete=e.epoch)
    if isinstance(e, GroupBroken):
        return pb.WatchEvent(current_epoch=e.epoch, group_broken=e.why)
    raise TypeError(f"no wire form for event {e!r}")  # (Event names every kind above)


def watch_event(x: Answer | Event) -> pb.WatchEvent:
    """An answer or an event, whichever `x` is (tests hand both to one assertion)."""
    if isinstance(x, Granted | Heard):
        return answer(x)
    return event(x)


# -- OpenJob, LeaveJob, GetJobStatus ----------------------------------------------------------
def open_job(r: pb.OpenJobRequest) -> OpenJob:
    res = r.resources
    return OpenJob(
        job=r.job, dataset=r.dataset, worker_name=r.worker_name, seed=r.seed,
        distribution_rules=r.distribution_rules,
        resources=Resources(hostname=res.hostname, name=res.name, gpus=res.gpus),
        resume=resume(r.resume) if r.HasField("resume") else None,
        sync=sync(r.sync) if r.HasField("sync") else None,
        order=order(r.order) if r.HasField("order") else None,
        protocol_version=r.protocol_version, dataset_version=r.dataset_version)


def resume(r: pb.ResumePosition) -> ResumePosition:
    return ResumePosition(epoch=r.epoch, worker_id=r.worker_id, done=list(r.done),
                          positions=dict(r.positions), credential=r.credential,
                          dataset_version=r.dataset_version)


def order(o: pb.DeliveryOrder) -> DeliveryOrder:
    return DeliveryOrder(seed=o.seed, shuffle_buffer=o.shuffle_buffer, resample=o.resample,
                         sync_batch_size=o.sync_batch_size)


def opened(o: Opened) -> pb.OpenJobResponse:
    return pb.OpenJobResponse(
        worker_id=o.worker_id, job=o.job, dataset=o.dataset, dataset_url=o.dataset_url,
        storage_options_json=o.storage_options_json,
        fields=[pb.Field(name=name, type=kind) for name, kind in o.fields],
        num_records=o.num_records, num_partitions=o.num_partitions,
        current_epoch=o.current_epoch, lease_timeout_s=o.lease_timeout_s,
        num_bytes=o.num_bytes, resumed_partitions=o.resumed_partitions,
        session_secret=o.session_secret, resume_credential=o.resume_credential,
        resume_cut=o.resume_cut, protocol_version=o.protocol_version,
        dataset_version=o.dataset_version)


def leave(r: pb.LeaveJobRequest) -> Leave:
    return Leave(job=r.job, worker_id=r.worker_id, session_secret=r.session_secret)


def job_status(s: JobStatus) -> pb.JobStatus:
    return pb.JobStatus(
        job=s.job, dataset=s.dataset, epoch=s.epoch, num_partitions=s.num_partitions,
        todo=s.todo, pending=s.pending, done=s.done, failed=s.failed, workers=s.workers,
        failed_reasons=s.failed_reasons, records_served=s.records_served,
        bytes_served=s.bytes_served, reports_refused=s.reports_refused,
        metrics_port=s.metrics_port)
