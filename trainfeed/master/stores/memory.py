"""`memory://`: job state in this process only, for tests and throwaway runs."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trainfeed.master.stores.base import SavedJob

__all__ = ["MemoryStateStore"]


class MemoryStateStore:
    """Keeps state in this process only (ops are still serialized, to catch what JSON cannot
    hold in tests)."""

    url = "memory://"

    def __init__(self) -> None:
        self._snapshots: dict[str, str] = {}
        self._journals: dict[str, list[str]] = {}

    @classmethod
    def from_url(cls, url: str) -> MemoryStateStore:
        return cls()

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        pass  # nobody else can see this process's memory

    def leading(self) -> bool:
        return True

    def load_jobs(self) -> dict[str, SavedJob]:
        return {job: SavedJob(json.loads(snapshot),
                              [op for text in self._journals.get(job, [])
                               for op in json.loads(text)])
                for job, snapshot in self._snapshots.items()}

    def append(self, job: str, ops: Sequence[Any]) -> None:
        if ops:
            self._journals.setdefault(job, []).append(json.dumps(list(ops)))

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        for job, ops in ops_by_job.items():
            self.append(job, ops)

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        self._snapshots[job] = json.dumps(snapshot)
        self._journals.pop(job, None)

    def close(self) -> None:
        pass
