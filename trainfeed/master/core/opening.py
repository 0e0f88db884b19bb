"""What OpenJob checks and decides, apart from the coordinator's bookkeeping: the names and the
protocol version of a request, a new job's plan, whether a reader may join a job (its dataset and
version, its distribution rules, its synchronous group), a resume's credential and range, and the
answer.

Pure: functions of the request, the job and the time passed in; they raise the refusals
(trainfeed.master.core.jobs.CallError) before anything changed, or return what changed.
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from trainfeed.errors import CorruptDatasetError, DatasetNotFoundError
from trainfeed.formats.manifest import PACKED_KIND, Manifest, dataset_storage
from trainfeed.master.core.jobs import (
    FailedPrecondition,
    InvalidArgument,
    Job,
    MasterConfig,
    max_delivered,
)
from trainfeed.master.core.ledger import Ledger
from trainfeed.master.core.messages import Opened, OpenJob, ResumePosition, SyncGroup
from trainfeed.master.core.reports import out_of_range
from trainfeed.master.core.saved_job import SavedJob
from trainfeed.master.core.sessions import SessionKeys, check_worker_name, clip
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.planning.distribution import DistributionRules
from trainfeed.planning.partitions import plan_partitions, restored_plan
from trainfeed.protocol import PROTOCOL_VERSION

logger = logging.getLogger(__name__)

# Random bytes of each job's lease-token key (trainfeed.master.core.ledger.lease_token).
TOKEN_KEY_BYTES = 32


def check_version(request: OpenJob, accept_unversioned: bool) -> None:
    """FAILED_PRECONDITION, naming both versions, for a reader of another protocol."""
    version = request.protocol_version
    if version == PROTOCOL_VERSION or (version == 0 and accept_unversioned):
        return
    spoken = "0 (a reader from before protocol versions)" if version == 0 else str(version)
    raise FailedPrecondition(
        f"job {clip(request.job)!r}: the reader speaks wire protocol {spoken}, this master "
        f"speaks {PROTOCOL_VERSION}; run readers and master of the same trainfeed release "
        f"(pip show trainfeed on both sides)")


def check_names(request: OpenJob) -> DistributionRules:
    """INVALID_ARGUMENT for a worker, job or dataset name no reader may send, or distribution
    rules that do not parse; else the rules."""
    bad_name = (check_worker_name(request.worker_name)
                or check_worker_name(request.resources.name, "worker resources name")
                or check_worker_name(request.resources.hostname, "worker hostname"))
    if bad_name is not None:
        raise InvalidArgument(f"job {clip(request.job)!r}: {bad_name}")
    try:
        validate_job_name(request.job)
        validate_dataset_name(request.dataset)
        return DistributionRules.parse(request.distribution_rules)
    except ValueError as e:  # InvalidNameError is one
        raise InvalidArgument(str(e)) from None


def new_job(request: OpenJob, manifest: Manifest, rules: DistributionRules,
            token_key: bytes, config: MasterConfig) -> Job:
    """A new job of `manifest`, planned into partitions."""
    if not request.distribution_rules and manifest.kind == PACKED_KIND:
        # MADlib's distribution_rules, given to the preprocessor, travel with the packed
        # dataset: a reader that names none gets them.
        rules = DistributionRules.parse(
            manifest.extra.get("summary", {}).get("distribution_rules"))
    partitions = plan_partitions(manifest, config.target_partitions)
    ledger = Ledger(len(partitions), seed=request.seed, max_failures=config.max_failures,
                    token_key=token_key)
    ledger.sizes = tuple(p.num_records for p in partitions)
    return Job(request.job, manifest, partitions, ledger, config.target_partitions, rules)


def restore_job(name: str, saved: SavedJob, read_manifest: Callable[[str, int | None], Manifest],
                now: float, lease_timeout_s: float) -> Job | None:
    """A saved job (snapshot + journal) with a fresh deadline on its outstanding leases; None
    (logged) when its dataset is gone, corrupt, re-uploaded or no longer plans alike."""
    state = saved.snapshot
    try:  # the version the job read (None in states before versions: the current one)
        manifest = read_manifest(state["dataset"], state.get("dataset_version"))
    except (DatasetNotFoundError, CorruptDatasetError) as e:
        logger.error("job %r not restored: %s", name, e)
        return None
    if manifest.fingerprint != state["fingerprint"]:
        logger.warning("job %r: dataset %r was re-uploaded since; starting the job afresh",
                       name, manifest.name)
        return None
    ledger = Ledger.from_state(state["ledger"])
    try:  # a job saved before row groups were sliced keeps its partition ids
        partitions = restored_plan(manifest, state["target_partitions"], ledger.num_partitions)
    except ValueError as e:
        logger.warning("job %r: %s; starting the job afresh", name, e)
        return None
    ledger.sizes = tuple(p.num_records for p in partitions)  # before replay: cuts use it
    group = state.get("sync_group")
    ledger.group = (int(group[0]), int(group[1])) if group else None
    ledger.replay(saved.journal)
    if ledger.token_key is None:  # saved before keyed tokens: the next leases get them
        ledger.token_key = secrets.token_bytes(TOKEN_KEY_BYTES)
    ledger.refresh_deadlines(now, lease_timeout_s)
    rules = DistributionRules.parse(state.get("distribution_rules"))
    logger.info("restored job %r (dataset %r, epoch %d, %s; %d journaled ops replayed)",
                name, manifest.name, ledger.epoch, ledger.counts(), len(saved.journal))
    return Job(name, manifest, partitions, ledger, state["target_partitions"], rules,
               sessions=SessionKeys.from_state(state.get("session_key")))


def check_joinable(job: Job, request: OpenJob) -> None:
    """FAILED_PRECONDITION for a reader of another dataset or version, or one the job's
    distribution rules do not admit."""
    if job.manifest.name != request.dataset:
        raise FailedPrecondition(
            f"job {request.job!r} reads dataset {job.manifest.name!r}, not "
            f"{request.dataset!r}; use another job name (TRAINFEED_JOB or job=...)")
    _check_version(job, request)
    res = request.resources
    if not job.rules.admits(res.name, res.gpus):
        raise FailedPrecondition(job.rules.refusal(job.name, res.name, res.hostname, res.gpus))


def join_group(job: Job, sync: SyncGroup) -> bool:
    """Checks a synchronous rank's group against the job's; a new group (the first ranks of
    the job, or a group restarted with another world size) takes effect at once if the
    current epoch is untouched, else from the next epoch, refused while one is half done.
    Returns whether the ledger changed."""
    world, batch = sync.world_size, sync.batch_size
    if world < 1 or batch < 1 or sync.rank >= world:
        raise InvalidArgument(
            f"job {job.name!r}: synchronous rank {sync.rank} of world size {world} with "
            f"batch size {batch}: need world size ≥ 1, batch size ≥ 1 and rank < world size")
    records = job.manifest.num_records
    if records < world * batch:
        raise FailedPrecondition(
            f"job {job.name!r}: dataset {job.manifest.name!r} has {records} records, fewer "
            f"than world size × batch size = {world} × {batch}: a synchronous epoch would "
            f"have no step")
    group = (world, batch)
    ledger = job.ledger
    if group == ledger.group:
        return False
    if not (ledger.untouched or ledger.complete):
        now = ledger.group
        raise FailedPrecondition(
            f"job {job.name!r}: epoch {ledger.epoch} is half read by "
            + (f"a synchronous group of world size {now[0]}, batch size {now[1]}"
               if now else "asynchronous readers")
            + f"; a group of world size {world}, batch size {batch} can join at an epoch "
            f"boundary (restore the ranks from reader.state() saved at the end of an epoch, "
            f"or wait for it to end), or use another job name")
    ledger.set_group(group)
    logger.info("job %r: synchronous, world size %d, batch size %d (from epoch %d%s)",
                job.name, world, batch, ledger.epoch + (0 if ledger.untouched else 1),
                f"; {ledger.dropped} records of it dropped" if ledger.untouched else "")
    return True


def check_resume_range(job: Job, resume: ResumePosition) -> None:
    """INVALID_ARGUMENT for a resume position naming a partition that does not exist or more
    records of one than it has."""
    for p in (*resume.done, *resume.positions):
        if p >= len(job.partitions):
            raise InvalidArgument(out_of_range(job, f"resume position names partition {p}"))
    for p, n in resume.positions.items():
        if n > max_delivered(job, p):
            raise InvalidArgument(
                f"job {job.name!r}: resume position: {n} records consumed of partition {p}, "
                f"which has {job.partitions[p].num_records}")


def rewind(job: Job, worker: str, resume: ResumePosition
           ) -> tuple[list[int], list[int], dict[int, tuple[str, int] | None]]:
    """Rewinds what the checkpointing reader `resume.worker_id` did after its checkpoint, as
    far as the ledger can vouch for it (Ledger.vouched_resume): returns the partitions put
    back, those whose claim went beyond what reports showed (cut to it), and the old reader's
    leases before (partition -> (holder, token))."""
    old = resume.worker_id
    tokens = {p: job.ledger.leases.get(p) for p in job.ledger.held_by(old)}
    keep, positions, cut = job.ledger.vouched_resume(
        resume.epoch, old, resume.done, dict(resume.positions))
    if cut:
        logger.warning("job %r: the checkpoint of %s claims more than its reports showed "
                       "consumed, or partitions it never held, in %d partition(s) (%s): "
                       "they resume where the reports left them", job.name, old, len(cut),
                       cut[:10])
    back = job.ledger.rewind(resume.epoch, old, keep, positions)
    if resume.epoch != job.ledger.epoch:
        logger.warning("job %r: worker %s resumes a checkpoint of epoch %d, but the job is "
                       "at epoch %d; nothing to rewind", job.name, worker, resume.epoch,
                       job.ledger.epoch)
    else:
        logger.info("job %r: worker %s resumes the checkpoint of %s in epoch %d: %d "
                    "partition(s) back to todo", job.name, worker, old, resume.epoch,
                    len(back))
    return back, cut, tokens


def answer(job: Job, worker: str, config: MasterConfig, resumed: int, cut: int
           ) -> Opened:
    """The OpenJob answer of session `worker`."""
    folder = dataset_storage(config.storage, job.manifest.name)
    return Opened(
        worker_id=worker, job=job.name, dataset=job.manifest.name, dataset_url=folder.url,
        storage_options_json=folder.options_json(),
        fields=[(f.name, f.type) for f in job.manifest.fields],
        num_records=job.manifest.num_records, num_partitions=len(job.partitions),
        current_epoch=job.ledger.join_epoch(), lease_timeout_s=config.lease_timeout_s,
        num_bytes=job.manifest.num_bytes, resumed_partitions=resumed,
        session_secret=job.sessions.secret(worker),
        resume_credential=job.sessions.resume_credential(worker), resume_cut=cut,
        protocol_version=PROTOCOL_VERSION, dataset_version=job.manifest.dataset_version)


def resumes(request: OpenJob) -> str:
    """The worker id a request resumes ("" for none)."""
    return request.resume.worker_id if request.resume is not None else ""


def _check_version(job: Job, request: OpenJob) -> None:
    """FAILED_PRECONDITION for a reader of `job` asking for another version of its dataset, or
    resuming a state saved on another: a job reads the version it was created on until it ends
    (trainfeed.formats.manifest, "Versions"). Before anything changed."""
    pinned = job.manifest.dataset_version
    if request.dataset_version and request.dataset_version != pinned:
        raise FailedPrecondition(
            f"job {request.job!r} reads version {pinned} of dataset {request.dataset!r}, "
            f"not version {request.dataset_version}: a job reads the version it was created "
            f"on until it ends. Read {request.dataset}@{pinned}, or read version "
            f"{request.dataset_version} under another job name (TRAINFEED_JOB or job=...)")
    saved = request.resume.dataset_version if request.resume is not None else 0
    if saved and saved != pinned:
        raise FailedPrecondition(
            f"job {request.job!r} reads version {pinned} of dataset {request.dataset!r}; "
            f"the reader state restored was saved reading version {saved}, whose partitions "
            f"it counts. Restore it into a job of version {saved} (another job name, "
            f"dataset {request.dataset}@{saved}), or start the reader without the state")
