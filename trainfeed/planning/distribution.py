"""Distribution rules: which workers may take a job's tasks (MADlib's `distribution_rules`).

`all` (the default) admits every worker; `gpu` only workers that declare at least one GPU, so
that a job's data goes where its model trains; a comma-separated list admits the workers of
those names (`$TRAINFEED_WORKER_NAME`, else the hostname).

MADlib's own spellings are accepted too: `all_segments` and `gpu_segments` (the values its
`training_preprocessor_dl` documents, and what its summary table stores), and a list of names as
a list. `madlib_value` and `gpu_config` give back what MADlib's summary stores for the rules.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
# MADlib's names for the two keyword rules (input_data_preprocessor.py_in,
# DistributionRulesOptions), matched as MADlib does: case-insensitively.
MADLIB_ALL = "all_segments"
MADLIB_GPU = "gpu_segments"
_KEYWORDS = {"all": "all", MADLIB_ALL: "all", "gpu": "gpu", MADLIB_GPU: "gpu"}


@dataclass(frozen=True)
class DistributionRules:
    kind: str  # "all", "gpu" or "list"
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str | Sequence[str] | None) -> DistributionRules:
        """Parses "all"/"all_segments" (or empty), "gpu"/"gpu_segments", "name1,name2,…" or a
        list of names (as a packed summary stores them); raises ValueError otherwise."""
        if text is not None and not isinstance(text, str):
            names = [str(n).strip() for n in text]
            if not names:
                raise ValueError("distribution rules name no worker (an empty list)")
            return cls._names(names, repr(list(text)))
        text = (text or "all").strip()
        keyword = _KEYWORDS.get(text.lower())
        if keyword is not None:
            return cls(keyword)
        return cls._names([n.strip() for n in text.split(",")], repr(text))

    @classmethod
    def _names(cls, names: list[str], given: str) -> DistributionRules:
        bad = [n for n in names if not _NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"invalid distribution rules {given}: expected 'all' "
                             f"('{MADLIB_ALL}'), 'gpu' ('{MADLIB_GPU}') or a comma-separated "
                             f"list of worker names; bad names: {bad}")
        return cls("list", frozenset(names))

    def admits(self, name: str, gpus: int) -> bool:
        if self.kind == "gpu":
            return gpus > 0
        if self.kind == "list":
            return name in self.names
        return True

    def __str__(self) -> str:
        return ",".join(sorted(self.names)) if self.kind == "list" else self.kind

    @property
    def madlib_value(self) -> str | list[str]:
        """What MADlib's summary stores as `distribution_rules`: 'all_segments',
        'gpu_segments', or the sorted list of the workers named (MADlib: their dbids)."""
        if self.kind == "list":
            return sorted(self.names)
        return MADLIB_ALL if self.kind == "all" else MADLIB_GPU

    @property
    def gpu_config(self) -> str | list[str]:
        """MADlib's `__internal_gpu_config__`: 'all_segments', or the workers the rules select.

        MADlib resolves 'gpu_segments' to the segments of its hosts that have GPUs when it
        packs; trainfeed's workers come and go, so which ones have a GPU is only known when
        they join: the rule itself, 'gpu_segments', is stored."""
        return self.madlib_value

    def refusal(self, job: str, name: str, host: str, gpus: int) -> str:
        """Why a worker is not admitted, and what to do about it."""
        if self.kind == "gpu":
            return (f"job {job!r} runs on GPU workers only (distribution rules 'gpu'); worker "
                    f"{name!r} on {host} declares no GPU (set TRAINFEED_GPUS if detection "
                    f"missed them)")
        return (f"job {job!r} runs on workers {sorted(self.names)} only; this worker is named "
                f"{name!r} (set TRAINFEED_WORKER_NAME)")
