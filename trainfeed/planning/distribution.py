"""Distribution rules: which workers may take a job's tasks (MADlib's `distribution_rules`).

`all` (the default) admits every worker; `gpu` only workers that declare at least one GPU, so
that a job's data goes where its model trains; a comma-separated list admits the workers of
those names (`$TRAINFEED_WORKER_NAME`, else the hostname).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


@dataclass(frozen=True)
class DistributionRules:
    kind: str  # "all", "gpu" or "list"
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str | None) -> DistributionRules:
        """Parses "all" (or empty), "gpu", or "name1,name2,…"; raises ValueError otherwise."""
        text = (text or "all").strip()
        if text in ("all", "gpu"):
            return cls(text)
        names = [n.strip() for n in text.split(",")]
        bad = [n for n in names if not _NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"invalid distribution rules {text!r}: expected 'all', 'gpu' or a "
                             f"comma-separated list of worker names; bad names: {bad}")
        return cls("list", frozenset(names))

    def admits(self, name: str, gpus: int) -> bool:
        if self.kind == "gpu":
            return gpus > 0
        if self.kind == "list":
            return name in self.names
        return True

    def __str__(self) -> str:
        return ",".join(sorted(self.names)) if self.kind == "list" else self.kind

    def refusal(self, job: str, name: str, host: str, gpus: int) -> str:
        """Why a worker is not admitted, and what to do about it."""
        if self.kind == "gpu":
            return (f"job {job!r} runs on GPU workers only (distribution rules 'gpu'); worker "
                    f"{name!r} on {host} declares no GPU (set TRAINFEED_GPUS if detection "
                    f"missed them)")
        return (f"job {job!r} runs on workers {sorted(self.names)} only; this worker is named "
                f"{name!r} (set TRAINFEED_WORKER_NAME)")
