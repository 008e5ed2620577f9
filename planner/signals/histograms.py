"""Prometheus classic histograms read as cumulative buckets: the parse every histogram signal shares.

Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def cumulative_buckets(buckets: Mapping[str | None, float | None]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(finite bounds ascending, cumulative counts with the +Inf total last) from per-`le` series values.

    buckets: bound text -> cumulative count, "+Inf" the total (one query's `le` series).
    Raises ValueError naming what is wrong: no series, no +Inf bucket, a bound that
    is not a number, or a count that is not finite.
    """
    if not buckets:
        raise ValueError("no bucket series")
    finite: list[tuple[float, float]] = []
    total = None
    for le, value in buckets.items():
        if value is None or not math.isfinite(value):
            raise ValueError(f"bucket le={le!r} has no finite value")
        try:
            bound = float(le) if le is not None else math.nan
        except ValueError:
            bound = math.nan
        if bound == math.inf:
            total = float(value)
        elif math.isfinite(bound):
            finite.append((bound, float(value)))
        else:
            raise ValueError(f"bucket bound le={le!r} is not a number")
    if total is None:
        raise ValueError("no le=\"+Inf\" bucket")
    finite.sort()
    return tuple(b for b, _ in finite), tuple(c for _, c in finite) + (total,)


def cumulative_counts(values: Sequence[float] | np.ndarray, upper_bounds: Sequence[float]) -> tuple[float, ...]:
    """What a Prometheus histogram with these finite bounds would count for values: <= each bound, then all."""
    x = np.sort(np.asarray(values, dtype=float))
    below = np.searchsorted(x, np.asarray(upper_bounds, dtype=float), side="right")
    return tuple(float(c) for c in below) + (float(len(x)),)
