"""A reader refuses class ids that differ from its model's (issue 38).

A model's output layer is sized and ordered by the class ids it was trained with. A reader
knows them from two places: the checkpoint it restores (`state_dict()` records the labels behind
ids 0..K-1 it delivered, `class_values`), and a pin (`LabelOptions(class_values=...)`). When the
dataset version it opens maps labels otherwise, it fails when it opens the dataset, before its
first record, naming both mappings: what moved, what was added. Otherwise a new class trips an
`IndexError` somewhere in an epoch, and a renamed id with the same count trains on wrong labels
without a word.
"""
from __future__ import annotations

from collections.abc import Sequence

from trainfeed.errors import CheckpointError, UnknownLabelError

# Labels named in an error (a dataset may have thousands).
SHOWN = 10


def delivered(manifest_classes: Sequence[str], pinned: Sequence[str] | None) -> tuple[str, ...]:
    """The labels behind the ids a reader delivers: its pin, else the dataset version's."""
    return tuple(pinned) if pinned is not None else tuple(manifest_classes)


def changes(old: Sequence[str], new: Sequence[str]) -> str:
    """What differs from `old` to `new` (labels behind ids 0..K-1), e.g. "moved: 'boat' 0 → 1;
    added: 'auk' as 0"."""
    before = {label: i for i, label in enumerate(old)}
    after = {label: i for i, label in enumerate(new)}
    parts = []
    moved = [f"{label!r} {i} → {after[label]}" for label, i in before.items()
             if label in after and after[label] != i]
    added = [f"{label!r} as {i}" for label, i in after.items() if label not in before]
    gone = [f"{label!r} (was {i})" for label, i in before.items() if label not in after]
    for name, items in (("moved", moved), ("added", added), ("missing", gone)):
        if items:
            more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
            parts.append(f"{name}: {', '.join(items[:SHOWN])}{more}")
    return "; ".join(parts) or "the same"


def mapping(values: Sequence[str]) -> str:
    """`values` as ids, e.g. "{0: 'bird', 1: 'boat'}" (the first few, and the count)."""
    shown = ", ".join(f"{i}: {v!r}" for i, v in enumerate(values[:SHOWN]))
    more = f", … ({len(values)} classes)" if len(values) > SHOWN else ""
    return f"{{{shown}{more}}}"


def check_pin(dataset: str, version: int, labels: Sequence[str],
              pinned: Sequence[str] | None) -> None:
    """Refuses a dataset version with labels outside the reader's pinned class values (they
    would have no id). A pin that holds classes the version lacks is fine (a validation set).

    Raises:
        UnknownLabelError: naming the labels outside, and both mappings.
    """
    if pinned is None:
        return
    outside = [label for label in labels if label not in set(pinned)]
    if outside:
        raise UnknownLabelError(
            f"dataset {dataset!r} version {version} has label(s) {outside[:SHOWN]} outside the "
            f"reader's class_values: pinned {mapping(pinned)} ({len(pinned)} classes), the "
            f"dataset's {mapping(labels)} ({len(labels)} classes). "
            f"Read the version the model was trained on (dataset@N), or give the model the "
            f"new classes and pin the dataset's class values")


def check_saved(dataset: str, saved: Sequence[str], saved_version: int,
                current: Sequence[str], version: int) -> None:
    """Refuses to restore a state whose reader delivered other class ids (`saved`, from a state
    that records them) than this one would (`current`: of dataset version `version`, or its
    pin where `version` is 0, checked before the reader opens anything).

    Raises:
        CheckpointError: naming both mappings and what changed.
    """
    if not saved or not current or tuple(saved) == tuple(current):
        return
    was = f"version {saved_version}" if saved_version else "its version"
    raise CheckpointError(
        f"reader state was saved by a reader of dataset {dataset!r} ({was}) whose class ids "
        f"were {mapping(saved)} ({len(saved)} classes); this reader "
        f"({f'version {version}' if version else 'its pinned class_values'}) maps "
        f"{mapping(current)} ({len(current)} classes): {changes(saved, current)}. A model "
        f"trained on the state's ids would read wrong labels. Restore it into a reader of the "
        f"state's version (dataset@{saved_version or 'N'}), or pin its class values "
        f"(LabelOptions(class_values=state['class_values']))")
