"""The saved form of one job, as a state store holds it: a snapshot and the ops after it.

A plain type of the core: the coordinator restores jobs from it and the stores
(trainfeed.master.stores) hold it, so it lives here, where the core reaches it without loading
any store (issue 36: through `trainfeed.master.stores` it loaded SQLite, etcd and memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SavedJob"]


@dataclass
class SavedJob:
    """What a store holds for one job: the latest snapshot and the ops appended after it."""

    snapshot: dict[str, Any]
    journal: list[Any] = field(default_factory=list)
