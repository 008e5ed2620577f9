"""The share of an interval's requests (token gaps) that met the TTFT (ITL) target, from the frontend's histograms.

Every run says what it saw: Dynamo's frontend counts each request's time to
first token in `dynamo_frontend_time_to_first_token_seconds` (its buckets are
DYNAMO_TTFT_BOUNDS_S; ../shared/dynamo/metrics.md), and the collect step reads
that histogram's increase over the interval. A target between two bounds is
read on a monotone cubic (PCHIP) through the cumulative shares at the bounds,
against log time: 200 ms falls in Dynamo's 0.1-0.22 s bucket, where an even
spread (Prometheus' histogram_quantile reading) counts a sixth of that bucket's
requests as misses whatever their real spread. Measured per minute on simulated
Azure code, conv and Mooncake fleets (Dynamo's buckets, 200 ms): the even spread
read 0.35-2.3 points below the true share on average, the curve 0.03-0.34
(docs/control.md, "Reading the TTFT share from Dynamo's buckets").
The bucket's bounds always come with it: the share is at least the share at
its lower bound and at most the share at its upper one. A target past the last
finite bound gives what is known: the share below that bound.

The ITL histogram (`dynamo_frontend_inter_token_latency_seconds`, buckets
DYNAMO_ITL_BOUNDS_S) counts one observation per output token after the first:
its share within the ITL target is the share of token gaps within it, read the
same way (10 ms falls in the 0.0059-0.011 s bucket). The SLA holds a request's
mean gap to the target, so the two differ: a request whose gaps straddle it can
meet it on average while some gaps do not.

Pure functions, no I/O.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
from scipy.interpolate import PchipInterpolator

from planner.signals.histograms import cumulative_counts
from planner.types import LatencyHistogram

# Finite bucket bounds of Dynamo 1.6.1's frontend TTFT histogram, seconds (+Inf follows).
DYNAMO_TTFT_BOUNDS_S: tuple[float, ...] = (
    0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480,
)
# Trailing window each run also reads both shares over, s (metrics.slo_window_s, the simulator's
# ReplaySettings.slo_window_s): the SLO's view beside the interval's.
DEFAULT_SLO_WINDOW_S = 1800.0
# Finite bucket bounds of its inter-token latency histogram, seconds (+Inf follows).
DYNAMO_ITL_BOUNDS_S: tuple[float, ...] = (
    0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2, 2.3, 4.1, 7.4, 13, 24, 44, 80,
)


@dataclass(frozen=True)
class TargetShare:
    """Share of a histogram's observations at or below a target, and the bucket it was read in.

    share: 0-1, the estimate; requests: observations counted; bucket_s: (lower, upper)
    bound of the bucket holding the target, seconds (upper inf past the last finite
    bound, where share is the share below that bound: a lower bound of the truth).
    at_least / at_most: the shares at the bucket's lower and upper bound, between
    which the true share lies (at_most 1 past the last finite bound).
    """

    share: float
    requests: float
    bucket_s: tuple[float, float]
    at_least: float
    at_most: float


def share_within(h: LatencyHistogram, target_s: float) -> TargetShare | None:
    """The share of h's observations <= target_s, with the bounds it lies within; None when h is empty.

    Within a bucket: the monotone cubic through the cumulative shares against log
    time (module docstring); linear from 0 in the bucket below the first positive
    bound, and wherever fewer than two positive bounds leave no curve.
    """
    if not target_s >= 0:
        raise ValueError(f"slo attainment: target must be >= 0 s, got {target_s!r}")
    total = h.count
    if not total > 0:
        return None
    bounds, cum = h.upper_bounds_s, h.cumulative_counts
    k = bisect.bisect_left(bounds, target_s)  # first bound >= target
    if k == len(bounds):
        below = min(1.0, cum[-2] / total)
        return TargetShare(below, total, (bounds[-1], math.inf), below, 1.0)
    lo, at_least = (bounds[k - 1], cum[k - 1] / total) if k > 0 else (0.0, 0.0)
    hi, at_most = bounds[k], cum[k] / total
    if target_s >= hi or at_most <= at_least:
        share = at_most
    elif lo > 0 and sum(b > 0 for b in bounds) >= 2:
        share = _on_log_curve(bounds, cum, total, target_s)
    else:
        share = at_least + (at_most - at_least) * (target_s - lo) / (hi - lo)
    share = min(at_most, max(at_least, share))
    return TargetShare(share, total, (lo, hi), at_least, at_most)


def _on_log_curve(bounds: tuple[float, ...], cum: tuple[float, ...], total: float, target_s: float) -> float:
    """The cumulative share at target_s on the PCHIP through (log bound, share) over the positive bounds."""
    x = np.log([b for b in bounds if b > 0])
    y = np.array([c for b, c in zip(bounds, cum) if b > 0]) / total
    return float(PchipInterpolator(x, y)(math.log(target_s)))


def ttft_histogram_of(ttft_s, bounds_s: tuple[float, ...] = DYNAMO_TTFT_BOUNDS_S) -> LatencyHistogram:
    """The histogram a frontend would have counted for these TTFTs, seconds (tests); other bounds: bounds_s."""
    return LatencyHistogram(tuple(float(b) for b in bounds_s), cumulative_counts(ttft_s, bounds_s))
