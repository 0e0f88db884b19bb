"""The keyword spellings `dist.reader` took before its options became values (issue 27).

`dist.reader(name, local=True, storage=s, batch_size=32, sync=True)` still works for one release:
each keyword is moved into the value that now holds it (`source=LocalSource(storage=s)`,
`pipeline=PipelineOptions(batch=BatchOptions(size=32))`, `sync=SyncOptions()`) and one
DeprecationWarning prints that grouped spelling, so that a user can paste it. Delete this module,
and the `**shortcuts` of `dist.reader`, in the release after.
"""
from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from typing import Any

from trainfeed.reader.options import GROUPS, KEYWORDS, PipelineOptions
from trainfeed.reader.sources import LocalSource, MasterSource, Source, from_environment
from trainfeed.reader.world import SyncOptions

# dist.reader's own former keywords -> the field of LocalSource / MasterSource that holds them
# ("" where that source has none: the keyword did nothing there before either).
LOCAL_FIELDS = {"storage": "storage", "seed": "seed", "prefetch_partitions": "prefetch_partitions"}
MASTER_FIELDS = {"master": "address", "job": "job", "seed": "seed",
                 "prefetch_partitions": "prefetch_partitions",
                 "distribution_rules": "distribution_rules", "lost_partitions": "lost_partitions"}
SOURCE_KEYWORDS = ("local", *sorted(set(LOCAL_FIELDS) | set(MASTER_FIELDS)))
SYNC_KEYWORDS = ("world_size", "rank")
# Names dist.reader took once and takes no more, each with what replaces it.
RETIRED = {
    "prefetch": "dist.reader(prefetch=...) was retired: it is the source's prefetch_partitions "
                "(source=LocalSource(prefetch_partitions=...) or MasterSource(...), partitions "
                "loaded ahead); batches prepared ahead are pipeline=PipelineOptions("
                "batch=BatchOptions(prefetch=...))",
}
PARAMETERS = ("source", "pipeline", "sync", "state")


def check_known(shortcuts: Mapping[str, Any]) -> None:
    """Refuses a retired or unknown keyword, naming what replaces it or the closest option.

    Raises:
        TypeError: a keyword `dist.reader` does not take.
    """
    known = (*PARAMETERS, *KEYWORDS, *SOURCE_KEYWORDS, *SYNC_KEYWORDS)
    for keyword in shortcuts:
        if keyword in RETIRED:
            raise TypeError(RETIRED[keyword])
        if keyword not in known:
            close = difflib.get_close_matches(keyword, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown reader option {keyword!r}{hint} (dist.reader takes "
                            f"source=, pipeline=, sync= and state=)")


def translate(source: Source | None, pipeline: PipelineOptions | None, sync: Any,
              shortcuts: Mapping[str, Any]
              ) -> tuple[Source | None, PipelineOptions | None, SyncOptions | None]:
    """(source, pipeline, sync) with the keyword `shortcuts` (and a bool `sync`) moved into them,
    and one DeprecationWarning that prints the grouped spelling.

    Raises:
        TypeError: a keyword given twice: beside the value that now holds it.
        ValueError: world_size=/rank= without sync=True (as before).
    """
    check_known(shortcuts)
    said = _said(shortcuts, sync)  # before `sync` becomes the value that holds it
    use: dict[str, str] = {}  # parameter -> its grouped spelling, printed in signature order
    note = ""
    piped = {k: v for k, v in shortcuts.items() if k in KEYWORDS}
    if piped:
        pipeline, use["pipeline"] = _moved_pipeline(pipeline, piped)
    sourced = {k: v for k, v in shortcuts.items() if k in SOURCE_KEYWORDS}
    if sourced:
        source, use["source"], note = _moved_source(source, sourced)
    if isinstance(sync, bool) or any(k in shortcuts for k in SYNC_KEYWORDS):
        sync, use["sync"] = _moved_sync(sync, shortcuts)
    grouped = ", ".join(use[p] for p in PARAMETERS if p in use)
    warnings.warn(f"dist.reader({said}) is deprecated: use {grouped}{note}",
                  DeprecationWarning, stacklevel=3)
    return source, pipeline, sync


def _said(shortcuts: Mapping[str, Any], sync: Any) -> str:
    """The former spelling as the user wrote it (a bool sync= last), for the warning to quote."""
    said = [f"{k}={_shown(v)}" for k, v in shortcuts.items()]
    said += [f"sync={sync}"] if isinstance(sync, bool) else []
    return ", ".join(said)


def _moved_pipeline(pipeline: PipelineOptions | None, piped: Mapping[str, Any]
                    ) -> tuple[PipelineOptions, str]:
    """The pipeline with the former pipeline keywords `piped` set on it (on the one given, if
    any), and its grouped spelling for the warning."""
    held = "" if pipeline is None else " (those fields set on the pipeline= given)"
    return (PipelineOptions.from_keywords(pipeline, **piped),
            f"pipeline={_pipeline_spelling(piped)}{held}")


def _moved_source(source: Source | None, sourced: Mapping[str, Any]) -> tuple[Source, str, str]:
    """The source the former source keywords `sourced` name, its grouped spelling, and a note
    when the environment chose its kind. Refuses them beside a source=, which would leave two
    answers to one question.

    Raises:
        TypeError: `source` is given too.
    """
    if source is not None:
        raise TypeError(f"dist.reader(source=..., {', '.join(sourced)}=...): set "
                        f"{', '.join(sourced)} inside the source (LocalSource(...) or "
                        f"MasterSource(...)), not beside it")
    chosen, note = _source(sourced)
    return chosen, f"source={_spelling(chosen)}", note


def _moved_sync(sync: Any, shortcuts: Mapping[str, Any]) -> tuple[SyncOptions | None, str]:
    """The sync options a bool `sync` and the former world_size=/rank= keywords name, and
    their grouped spelling for the warning."""
    moved = _sync(sync, {k: shortcuts[k] for k in SYNC_KEYWORDS if k in shortcuts})
    return moved, (f"sync={_spelling(moved)}" if moved is not None
                   else "sync=None (the default)")


def _source(keywords: Mapping[str, Any]) -> tuple[Source, str]:
    """The source the former keywords named, and a note when the environment chose it. Both
    kinds are built, so that every keyword is checked, as before, whichever is used."""
    rest = {k: v for k, v in keywords.items() if k != "local"}
    local = LocalSource(**{LOCAL_FIELDS[k]: v for k, v in rest.items() if k in LOCAL_FIELDS})
    master = MasterSource(**{MASTER_FIELDS[k]: v for k, v in rest.items() if k in MASTER_FIELDS})
    chosen = keywords.get("local")
    note = ""
    if chosen is None:
        chosen = isinstance(from_environment(), LocalSource)
        note = (f" (TRAIN_LOCAL is {'set' if chosen else 'not set'} here; leave source= out "
                f"to let the environment choose, with the default seed and prefetch)")
    elif not isinstance(chosen, bool):
        raise TypeError(f"local must be True or False, got {_shown(chosen)} "
                        f"({type(chosen).__name__})")
    return (local if chosen else master), note


def _sync(sync: Any, keywords: Mapping[str, Any]) -> SyncOptions | None:
    if isinstance(sync, SyncOptions):
        raise TypeError(f"dist.reader(sync=SyncOptions(...), {', '.join(keywords)}=...): set "
                        f"them inside SyncOptions, not beside it")
    if not sync:
        if keywords:
            raise ValueError("world_size= and rank= are for synchronous readers: pass "
                             "sync=SyncOptions(world_size=..., rank=...) (formerly sync=True)")
        return None
    return SyncOptions(**keywords)


def _pipeline_spelling(keywords: Mapping[str, Any]) -> str:
    """`PipelineOptions(group=GroupOptions(field=value, ...), ...)` for the given keywords."""
    groups: dict[str, list[str]] = {}
    top: list[str] = []
    for keyword, value in keywords.items():
        group, name = KEYWORDS[keyword]
        if group:
            groups.setdefault(group, []).append(f"{name}={_shown(value)}")
        else:
            top.append(f"{name}={_shown(value)}")
    parts = [f"{group}={GROUPS[group].__name__}({', '.join(fields)})"
             for group, fields in groups.items()]
    return f"PipelineOptions({', '.join(parts + top)})"


def _spelling(value: Any) -> str:
    """`Kind(field=value, ...)` with the fields that differ from their defaults."""
    fields = [f"{f.name}={_shown(getattr(value, f.name))}" for f in dataclasses.fields(value)
              if getattr(value, f.name) != f.default]
    return f"{type(value).__name__}({', '.join(fields)})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["RETIRED", "check_known", "translate"]
