"""`batch(reader, n)`: Paddle's batching of a reader creator, plus a columnar fast path."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


def batch(reader: Callable[[], Iterable[Any]], batch_size: int, drop_last: bool = False,
          columnar: bool = False) -> Callable[[], Iterator[Any]]:
    """Wraps a reader creator into one that yields batches.

    Args:
        reader: any reader creator (a callable returning an iterable of instances).
        batch_size: instances per batch.
        drop_last: drop a last, shorter batch.
        columnar: yield dicts of columns (`{field: list, "_id": array}`) instead of lists of
            tuples; needs a trainfeed Reader and skips building one tuple per instance.

    Returns:
        A reader creator: each call is one pass yielding lists (or dicts) of up to `batch_size`.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    from trainfeed.reader.reader import Reader

    if isinstance(reader, Reader):
        # Batching inside the reader keeps the guarantee that a partition is acknowledged only
        # after the batch holding its last instance reached the trainer.
        if columnar:
            return lambda: reader.column_batches(batch_size, drop_last)
        return lambda: reader.instance_batches(batch_size, drop_last)
    if columnar:
        raise TypeError(f"columnar=True needs a trainfeed Reader, got {type(reader).__name__}")

    def batched() -> Iterator[list[Any]]:
        pending: list[Any] = []
        for instance in reader():
            pending.append(instance)
            if len(pending) == batch_size:
                yield pending
                pending = []
        if pending and not drop_last:
            yield pending
    return batched
