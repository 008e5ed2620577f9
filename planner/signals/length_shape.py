"""Spread of request lengths, measured from the frontend's length histograms.

Sizing models prompt lengths as Gamma-distributed around the forecast mean with
a coefficient of variation (SizingConfig.isl_cv), and the KV context a decoding
request holds (ISL + OSL / 2) by its own CV (decode_context_cv). Workloads
differ a lot (Azure 2023 ~1, ServeGen ~3), so a configured value is wrong for
most fleets; Dynamo's frontend already counts both lengths in histograms
(dynamo_frontend_input_sequence_tokens / output_sequence_tokens), from which
this module estimates the two CVs over a trailing window.

Within a bucket (lo, hi] lengths follow a power law whose exponent is the
local slope of the bucket densities (log-uniform where a bucket has no
non-empty neighbour); the first bucket (0, hi] is uniform; the +Inf bucket
holds what the exact sum leaves over the finite buckets' estimate (at least
its lower bound). Output and input lengths are taken as independent for the
context CV: Var(ISL + OSL/2) = Var ISL + Var OSL/4. On whole traces this reads
ISL CV 1.11 / 0.99 / 1.13 / 3.22 where the lengths themselves give 0.96 / 0.96
/ 1.20 / 3.15 (Azure 2023 code / conversation, Mooncake, a ServeGen m-mid day):
a histogram cannot tell more than its buckets hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from planner.signals.histograms import cumulative_buckets, cumulative_counts
from planner.types import LengthHistogram, LengthShape

# Trailing window the length histograms are counted over, s (metrics.length_window_s, the simulator's
# ReplaySettings.length_window_s): a few hundred prompts at modest load, short enough to follow a changing mix.
DEFAULT_LENGTH_WINDOW_S = 1800.0

# Finite bucket bounds of Dynamo 1.6.1's frontend histograms (../shared/dynamo/metrics.md; +Inf follows).
DYNAMO_ISL_BOUNDS_TOKENS: tuple[float, ...] = (0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000)
DYNAMO_OSL_BOUNDS_TOKENS: tuple[float, ...] = (0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000)

MAX_CV = 10.0  # SizingConfig's bound on isl_cv / decode_context_cv


def histogram_moments(h: LengthHistogram) -> tuple[float, float]:
    """(mean, second moment) of a histogram's lengths, tokens and tokens^2; NaN when it is empty."""
    bounds = np.append(np.asarray(h.upper_bounds_tokens, dtype=float), math.inf)
    # Counters reset or scraped out of step can leave a bucket below the one before it.
    cumulative = np.maximum.accumulate(np.maximum(np.asarray(h.cumulative_counts, dtype=float), 0.0))
    counts = np.diff(cumulative, prepend=0.0)
    n = counts.sum()
    if n <= 0:
        return math.nan, math.nan
    lo, hi = np.concatenate(([0.0], bounds[:-1])), bounds
    m1, m2 = _bucket_moments(lo[:-1], hi[:-1], counts[:-1])
    total, total_sq = float(counts[:-1] @ m1), float(counts[:-1] @ m2)
    n_inf = counts[-1]
    if n_inf > 0:
        tail = lo[-1]
        if h.sum_tokens is not None and math.isfinite(h.sum_tokens):
            tail = max(tail, (h.sum_tokens - total) / n_inf)
        total += n_inf * tail
        total_sq += n_inf * tail * tail
    return total / n, total_sq / n


def _bucket_moments(lo: np.ndarray, hi: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and second moments of the lengths in each finite bucket (lo, hi].

    A bucket starting at 0 (or of width 0) is uniform. Any other is a power law
    x^a across it, a being the slope of log density over log length through the
    bucket and its non-empty neighbours (-1, log-uniform, when it has none): the
    buckets double, and a density that falls across them puts a bucket's lengths
    nearer its lower bound than its middle.
    """
    m1 = (lo + hi) / 2.0
    m2 = (lo * lo + lo * hi + hi * hi) / 3.0
    powered = (lo > 0) & (hi > lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_density = np.where(powered & (counts > 0), np.log(counts / (hi - lo)), np.nan)
        log_mid = np.log(np.sqrt(lo * hi))
    for i in np.flatnonzero(powered & (counts > 0)):
        near = [j for j in (i - 1, i, i + 1) if 0 <= j < len(lo) and np.isfinite(log_density[j])]
        slope = -1.0
        if len(near) > 1:
            slope = _line_slope(log_mid[near].tolist(), log_density[near].tolist())
        z = _power_integral(lo[i], hi[i], slope + 1.0)
        m1[i] = _power_integral(lo[i], hi[i], slope + 2.0) / z
        m2[i] = _power_integral(lo[i], hi[i], slope + 3.0) / z
    return m1, m2


def _line_slope(x: list[float], y: list[float]) -> float:
    """The least-squares slope of y over x (two or three points here, so no library call's overhead)."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)


def _power_integral(a: float, b: float, p: float) -> float:
    """The integral of x^(p-1) from a to b (0 < a < b)."""
    if abs(p) < 1e-9:
        return math.log(b / a)
    return (b**p - a**p) / p


def _cv(mean: float, var: float) -> float:
    """Coefficient of variation, bounded by MAX_CV; a negative variance (rounding) counts as 0."""
    return min(MAX_CV, math.sqrt(max(0.0, var)) / mean) if mean > 0 else 0.0


def measure_length_shape(
    isl: LengthHistogram, osl: LengthHistogram | None, *, min_requests: float
) -> tuple[LengthShape | None, str]:
    """The window's prompt-length and decode-context CVs, with a one-line account of them.

    isl / osl: the input / output length histograms' increase over the window
        (osl None or empty: the context CV is the prompt one, with a note).
    min_requests: fewer prompts than this in the window: None (the configured
        CVs stand).
    """
    n, window_s = isl.count, isl.window_s
    if not n >= min_requests:
        return None, f"length shape: {n:.0f} prompts in the last {window_s:g} s (< {min_requests:g}); configured CVs used"
    isl_mean, isl_sq = histogram_moments(isl)
    isl_cv = _cv(isl_mean, isl_sq - isl_mean * isl_mean)
    if osl is None or not osl.count > 0:
        shape = LengthShape(isl_cv=isl_cv, decode_context_cv=isl_cv, requests=n, window_s=window_s)
        return shape, (f"length shape over {n:.0f} prompts in the last {window_s:g} s: ISL CV {isl_cv:.2f}; "
                       "no output lengths, context CV taken as the ISL one")
    osl_mean, osl_sq = histogram_moments(osl)
    ctx_mean = isl_mean + osl_mean / 2.0
    ctx_var = max(0.0, isl_sq - isl_mean**2) + max(0.0, osl_sq - osl_mean**2) / 4.0
    ctx_cv = _cv(ctx_mean, ctx_var)
    shape = LengthShape(isl_cv=isl_cv, decode_context_cv=ctx_cv, requests=n, window_s=window_s)
    return shape, (f"length shape over {n:.0f} prompts in the last {window_s:g} s: ISL CV {isl_cv:.2f}, "
                   f"decode context CV {ctx_cv:.2f}")


def histogram_from_buckets(
    buckets: Mapping[str | None, float | None], *, sum_tokens: float | None, window_s: float
) -> LengthHistogram:
    """A histogram from Prometheus' per-`le` series (bound text -> cumulative count, "+Inf" the total).

    Raises ValueError naming what is missing: no series, no +Inf bucket, a bound
    that is not a number, or a count that is not finite.
    """
    bounds, cumulative = cumulative_buckets(buckets)
    return LengthHistogram(bounds, cumulative, sum_tokens, window_s)


def histogram_of(
    lengths_tokens: Sequence[float] | np.ndarray, upper_bounds_tokens: tuple[float, ...], *, window_s: float
) -> LengthHistogram:
    """The histogram a frontend would have counted for these lengths over a window of window_s seconds."""
    x = np.asarray(lengths_tokens, dtype=float)
    return LengthHistogram(tuple(float(b) for b in upper_bounds_tokens), cumulative_counts(x, upper_bounds_tokens),
                           float(x.sum()), window_s)
