"""Where a reader's partitions come from: `LocalSource` (storage, no master) or `MasterSource`.

`dist.reader(name, source=...)` takes one of them whole. Without one, the environment decides as
it always did (`from_environment`): `TRAIN_LOCAL` set reads locally, anything else joins a job on
`$TRAINFEED_MASTER`; so the same training script runs on a laptop and in a cluster.

Example:
    >>> LocalSource(storage="/data", seed=3)
    LocalSource(storage='/data', seed=3, prefetch_partitions=None)
    >>> MasterSource("localhost:50051", "resnet").job
    'resnet'
    >>> MasterSource(lost_partitions="ignore")
    Traceback (most recent call last):
    ...
    ValueError: MasterSource.lost_partitions is 'ignore' (str), expected one of ['raise', 'skip']
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from trainfeed import settings
from trainfeed.names import validate_job_name
from trainfeed.planning.distribution import DistributionRules
from trainfeed.reader.checks import check_choice, check_int, check_text

# What a reader does with partitions its job gave up on (MasterSource.lost_partitions).
LOST_POLICIES = ("raise", "skip")


@dataclass(frozen=True)
class LocalSource:
    """Read every partition of the dataset straight from storage, with no master.

    One process reads the whole epoch (or, synchronous, its rank's fixed share of it); a local
    pass raises at the first partition it cannot read.

    Attributes:
        storage: The storage root, an fsspec URL or a folder. None: `$TRAINFEED_STORAGE`, else
            `./trainfeed-data` (the embedded default: a laptop needs no setup).
        seed: Seeds the epochs' partition order and every random choice of the pipeline
            (numpy generators seeded with (seed, epoch, ...), which take ints ≥ 0 only).
        prefetch_partitions: Partitions loaded ahead of the trainer. None: as many as fit
            64 MiB (trainfeed.io.prefetch.DEFAULT_PREFETCH_BYTES), between 2 and 32.
    """

    storage: str | None = None
    seed: int = 0
    prefetch_partitions: int | None = None

    def __post_init__(self) -> None:
        check_text("LocalSource.storage", self.storage,
                   none="$TRAINFEED_STORAGE, else ./trainfeed-data")
        _check_common(self, "LocalSource")


@dataclass(frozen=True)
class MasterSource:
    """Lease partitions from a master: the readers of one job split each epoch between them.

    Nothing connects until the first pass (or the first property that needs the dataset). The
    master's token comes from `$TRAINFEED_TOKEN` (or the file `$TRAINFEED_TOKEN_FILE` names),
    TLS settings from `$TRAINFEED_TLS_*`, this worker's name from `$TRAINFEED_WORKER_NAME` and
    how long an unreachable master is retried from `$TRAINFEED_MASTER_GIVE_UP_S`
    (docs/security.md, README "Configuration").

    Attributes:
        address: The master's `host:port`. None: `$TRAINFEED_MASTER`.
        job: The job to join: readers of one job share its epochs. None: `$TRAINFEED_JOB`,
            else "default" (read, and checked, when the reader is built: `resolved()`).
        seed: Seeds the job's partition order (the reader that creates the job sets it) and
            every random choice of this reader's pipeline.
        prefetch_partitions: Partitions loaded ahead of the trainer. None: as many as fit
            64 MiB, between 2 and 32.
        distribution_rules: Which workers may take the job's tasks: "all", "gpu", or a
            comma-separated list of worker names. The reader that creates the job sets them;
            a worker they exclude is refused with the reason. None: the dataset's own (a
            packed dataset's summary), else "all".
        lost_partitions: What a pass does when the master gave up on partitions of its epoch
            (no reader could read them, `--max-failures` times): "raise" raises
            LostRecordsError at the end of the pass, naming them and why; "skip" goes on and
            lists them in `reader.lost_partitions`.
    """

    address: str | None = None
    job: str | None = None
    seed: int = 0
    prefetch_partitions: int | None = None
    distribution_rules: str | None = None
    # "raise": losing records silently would skew training; "skip" is the informed choice.
    lost_partitions: str = "raise"

    def __post_init__(self) -> None:
        """Each field checked here, and only here (issue 36): the reader and the lease session
        take the source whole, as it is."""
        check_text("MasterSource.address", self.address, none="$TRAINFEED_MASTER")
        check_text("MasterSource.job", self.job, none="$TRAINFEED_JOB, else 'default'")
        if self.job is not None:
            validate_job_name(self.job)
        _check_common(self, "MasterSource")
        check_text("MasterSource.distribution_rules", self.distribution_rules,
                   none="the dataset's or 'all'")
        if self.distribution_rules:  # normalized; a bad one fails here, early
            object.__setattr__(self, "distribution_rules",
                               str(DistributionRules.parse(self.distribution_rules)))
        check_choice("MasterSource.lost_partitions", self.lost_partitions, LOST_POLICIES)

    def resolved(self) -> MasterSource:
        """This source with its job named: `$TRAINFEED_JOB`'s (else "default") for None,
        checked as a given one is."""
        return self if self.job is not None else replace(self, job=settings.JOB.get())


Source = LocalSource | MasterSource


def from_environment(seed: int = 0, prefetch_partitions: int | None = None) -> Source:
    """The source the environment names: `LocalSource()` with `TRAIN_LOCAL` set (any non-empty
    value but `0`), else `MasterSource()` (`$TRAINFEED_MASTER`, `$TRAINFEED_JOB`).

    Args:
        seed: The source's seed.
        prefetch_partitions: The source's prefetch depth (None: sized by bytes).

    Returns:
        A LocalSource or a MasterSource whose other fields are None: their environment defaults.
    """
    if settings.TRAIN_LOCAL.get():
        return LocalSource(seed=seed, prefetch_partitions=prefetch_partitions)
    return MasterSource(seed=seed, prefetch_partitions=prefetch_partitions)


def _check_common(source: Source, kind: str) -> None:
    """The fields both sources have, checked and normalized (numpy ints become Python ints)."""
    # The seed seeds numpy's generators, (seed, epoch, ...), which take ints ≥ 0 only.
    object.__setattr__(source, "seed", check_int(f"{kind}.seed", source.seed, 0))
    object.__setattr__(source, "prefetch_partitions", check_int(
        f"{kind}.prefetch_partitions", source.prefetch_partitions, 1,
        none="as many as fit 64 MiB"))


__all__ = ["LocalSource", "MasterSource", "Source", "from_environment"]
