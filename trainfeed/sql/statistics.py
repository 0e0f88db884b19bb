"""Feature statistics of a column sampled from a query's result (what SQLFlow derives its feature
columns from): a vocabulary for strings, range, mean and decile bucket boundaries for numbers."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["NUM_BUCKETS", "describe"]

# Quantile buckets: deciles, the usual default of SQLFlow's BUCKETIZE.
NUM_BUCKETS = 10


def describe(column: pa.ChunkedArray) -> dict[str, Any]:
    """One column's statistics (see SqlSource.sample_statistics for the keys)."""
    type_ = column.type
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        values = [v for v in column.to_pylist() if v is not None]
        return {"kind": "string", "count": len(values), "vocabulary": sorted(set(values))}
    if pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        numbers = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        numbers = numbers[~np.isnan(numbers)]  # nulls became NaN
        if numbers.size == 0:
            return {"kind": "numeric", "count": 0, "min": None, "max": None, "mean": None,
                    "bucket_boundaries": []}
        low, high = numbers.min(), numbers.max()
        whole = pa.types.is_integer(type_)
        quantiles = np.quantile(numbers, np.arange(1, NUM_BUCKETS) / NUM_BUCKETS)
        return {"kind": "numeric", "count": int(numbers.size),
                "min": int(low) if whole else float(low),
                "max": int(high) if whole else float(high),
                "mean": float(numbers.mean()),
                "bucket_boundaries": [float(b) for b in np.unique(quantiles)]}
    return {"kind": "other", "count": len(column) - column.null_count, "type": str(type_)}
