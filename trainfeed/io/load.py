"""How a reader reads one leased or planned task: the `Load` every pass is given.

A `Load` reads a task's partition as the trainer will get it: its records in delivery order,
minus the `task.skip` first ones (trainfeed.reader.batcher.partition_loader builds the
pipeline's). It lives in io, beside the partition reader it calls, because every backend uses it,
local and leased alike: in trainfeed.lease.session it made a local reader import gRPC (issue 36).
"""
from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from trainfeed.io.partition_reader import PartitionReader, read_task
from trainfeed.io.prefetch import TaskRef

__all__ = ["Load", "plain_load"]

# Reads a task's partition as the trainer will get it: its records in delivery order, minus the
# `task.skip` first ones.
Load = Callable[[PartitionReader, TaskRef], pa.Table]


def plain_load(reader: PartitionReader, task: TaskRef) -> pa.Table:
    """Records in storage order, minus the leading `task.skip`."""
    return read_task(reader, task, None)
