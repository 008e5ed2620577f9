"""The share of an interval's requests that met the TTFT target, read from the frontend's TTFT histogram.

Every run says what it saw: Dynamo's frontend counts each request's time to
first token in `dynamo_frontend_time_to_first_token_seconds` (its buckets are
DYNAMO_TTFT_BOUNDS_S; ../shared/dynamo/metrics.md), and the collect step reads
that histogram's increase over the interval. A target between two bounds is
read as Prometheus' histogram_quantile reads a quantile: observations spread
evenly within the bucket (200 ms falls in Dynamo's 0.1-0.22 s bucket). A target
past the last finite bound gives what is known: the share below that bound.

Pure functions, no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from planner.histograms import cumulative_counts
from planner.types import LatencyHistogram

# Finite bucket bounds of Dynamo 1.6.1's frontend TTFT histogram, seconds (+Inf follows).
DYNAMO_TTFT_BOUNDS_S: tuple[float, ...] = (
    0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480,
)


@dataclass(frozen=True)
class TargetShare:
    """Share of a histogram's observations at or below a target, and the bucket it was read in.

    share: 0-1; requests: observations counted; bucket_s: (lower, upper) bound of the
    bucket holding the target, seconds (upper inf past the last finite bound, where
    share is the share below that bound: a lower bound of the truth).
    """

    share: float
    requests: float
    bucket_s: tuple[float, float]


def share_within(h: LatencyHistogram, target_s: float) -> TargetShare | None:
    """The share of h's observations <= target_s (linear within the bucket holding it); None when h is empty."""
    if not target_s >= 0:
        raise ValueError(f"slo attainment: target must be >= 0 s, got {target_s!r}")
    total = h.count
    if not total > 0:
        return None
    bounds, cum = h.upper_bounds_s, h.cumulative_counts
    k = bisect.bisect_left(bounds, target_s)  # first bound >= target
    if k == len(bounds):
        return TargetShare(min(1.0, cum[-2] / total), total, (bounds[-1], float("inf")))
    lo, below = (bounds[k - 1], cum[k - 1]) if k > 0 else (0.0, 0.0)
    hi = bounds[k]
    inside = cum[k] - below
    frac = 1.0 if hi <= lo else (target_s - lo) / (hi - lo)
    return TargetShare(min(1.0, max(0.0, (below + frac * inside) / total)), total, (lo, hi))


def ttft_histogram_of(ttft_s, bounds_s: tuple[float, ...] = DYNAMO_TTFT_BOUNDS_S) -> LatencyHistogram:
    """The histogram a frontend would have counted for these TTFTs, seconds (tests)."""
    return LatencyHistogram(tuple(float(b) for b in bounds_s), cumulative_counts(ttft_s, bounds_s))
