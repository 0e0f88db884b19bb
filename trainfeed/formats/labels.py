"""The order of a dataset's label values, which class ids 0..K-1 follow (issue 26).

Labels are stored as text. A dataset whose labels are all integers ("0", "1", …, "11") has its
class ids in numeric order, so that label "2" is class 2 (sorted as text it was class 4, after
"0", "1", "10" and "11"); any other dataset sorts its labels as text. Upload records which order
it chose in the manifest (`Manifest.label_order`): a manifest written before the field existed
reads as "string", so datasets uploaded then keep the class ids their models were trained with.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

STRING_ORDER = "string"  # labels sorted as text (every dataset uploaded before label_order)
NUMERIC_ORDER = "numeric"  # integer labels sorted by value
LABEL_ORDERS = (STRING_ORDER, NUMERIC_ORDER)
# An integer as text, written one way only ("07" or "+7" would sort ambiguously beside "7").
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def label_order(labels: Iterable[str]) -> str:
    """The order a new dataset with these labels takes: "numeric" when every label is an
    integer in canonical decimal form, else "string".

    Example:
        >>> label_order(["0", "2", "10"]), label_order(["0", "cat"]), label_order(["007"])
        ('numeric', 'string', 'string')
    """
    values = list(labels)
    if values and all(isinstance(v, str) and _INTEGER.fullmatch(v) for v in values):
        return NUMERIC_ORDER
    return STRING_ORDER


def sorted_labels(labels: Iterable[str], order: str) -> list[str]:
    """The distinct labels in class-id order.

    Raises:
        ValueError: an unknown order, or a "numeric" order of a label that is no integer.

    Example:
        >>> sorted_labels(["10", "2", "0"], "numeric"), sorted_labels(["10", "2", "0"], "string")
        (['0', '2', '10'], ['0', '10', '2'])
    """
    distinct = set(map(str, labels))
    if order == STRING_ORDER:
        return sorted(distinct)
    if order == NUMERIC_ORDER:
        odd = sorted(v for v in distinct if not _INTEGER.fullmatch(v))
        if odd:
            raise ValueError(f"label order {NUMERIC_ORDER!r} needs integer labels, got "
                             f"{odd[:5]}")
        return sorted(distinct, key=int)
    raise ValueError(f"unknown label order {order!r}; expected one of {list(LABEL_ORDERS)}")
