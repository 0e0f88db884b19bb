"""Pure planning shared by the master, the workers and the readers: how a dataset is cut into
partitions, the order of an epoch, and which workers a job admits.

Why a package of its own: the master decides *what* is read and the readers and workers decide
*how*, but both must compute the same plan (a local reader cuts and orders partitions exactly as
the master does; a worker recognizes a SQL bucket by its pseudo-shard; `dist.reader` checks
distribution rules before it sends them). Kept in the master, that shared code made the reader
side import the master; here it depends on nothing but the manifest format, and the layers
contracts (pyproject.toml, `[tool.importlinter]`) keep the reader, the worker and the master
from importing each other.
"""
from trainfeed.planning.distribution import DistributionRules
from trainfeed.planning.order import epoch_order
from trainfeed.planning.partitions import (
    DEFAULT_TARGET_PARTITIONS,
    SQL_SHARD,
    Partition,
    plan_partitions,
)

__all__ = ["DEFAULT_TARGET_PARTITIONS", "SQL_SHARD", "DistributionRules", "Partition",
           "epoch_order", "plan_partitions"]
