"""Arrival clumping: do requests arrive as independent tenants would, or in clumps?

The forecast's upper band (p90, widened to the lead time) holds capacity for what
a minute's count cannot show: requests that arrive together. Independent tenants
(arrivals close to Poisson within a minute) do not need it; synchronised copies
(the same burst from several sources within a second) do. The collect step's
peak-rate signal tells them apart: the busiest `peak_window_s` sub-window of an
interval holds about one Poisson standard deviation more than the mean window
when arrivals are independent, and about sqrt(c) of them when they come in
clumps of c.

Per interval with n requests, k = interval / window sub-windows, m = n / k
requests in the mean window, peak count p = peak_rps x window, and its
neighbours' counts n0 (before) and n1 (after, unknown for the newest). The rate
can change within the interval without any clumping, which raises its busiest
window by the allowance t, the larger of:
- a linear trend from n0: |n - n0| / k x (k - 1) / (2k);
- a step to a neighbour's rate, a burst starting or ending inside the interval:
  (n_nb - n - 2 sqrt(n_nb + n)) / k for n_nb = max(n0, n1), so only a step
  beyond two Poisson standard deviations of the two counts' difference counts
  (constant-rate arrivals keep their reading of about 1-2).

    z = max(0, p - m - t) / sqrt(m),   d = z^2

d is about 1-2 for independent arrivals (the square of the largest of k standard
normals) and grows with the clump size. The index is a low quantile (default the
40th percentile) of d over the last intervals, each read once its successor is
known: the newest counts only while there are too few others (a burst starting
inside it reads as a clump until the next interval shows the step). A low
quantile asks clumping of most of the recent intervals: synchronised copies
clump in every interval, while independent tenants' sub-minute bursts (Azure
code's) make a run of a few clumpy intervals, which the burst sizing
(planner.signals.burst) already sizes for. `sizing_basis` sizes on the mean forecast
while the index is below a threshold and on the upper band otherwise. Measured
(docs/control.md, "Sizing basis from arrival clumping"): the 40th percentile
over 10 intervals stays below 1.6 on Azure code and conv x8 independent tenants
and 1.3 on Mooncake x2 tenants, and reads 15-447 on code's synchronised copies,
1.9-2.8 on Mooncake's (the median read up to 6.3 on code tenants).

Pure functions, no I/O.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from planner.types import LoadHistory, is_number

__all__ = ["clumping_index", "interval_clumping", "quantile_words", "recent_clumping_index", "sizing_basis"]


STEP_SIGMAS = 2.0  # a neighbour's count must differ by more than this many Poisson SDs to read as a step


def interval_clumping(
    *, num_requests: float, peak_rps: float, previous_requests: float, interval_s: float, window_s: float,
    next_requests: float | None = None,
) -> float | None:
    """One interval's d = z^2 (module docstring); None when the inputs cannot give one.

    num_requests / previous_requests / next_requests: arrivals in this, the
    previous and the next interval (counts; next None: not known yet).
    peak_rps: the highest rate over a `window_s` sub-window of this one.
    """
    values = (num_requests, peak_rps, previous_requests, interval_s, window_s)
    if not all(is_number(v) for v in values) or not (next_requests is None or is_number(next_requests)):
        return None
    if num_requests <= 0 or peak_rps < 0 or previous_requests < 0 or not 0 < window_s < interval_s:
        return None
    k = interval_s / window_s
    mean_window = num_requests / k
    trend = abs(num_requests - previous_requests) / k * (k - 1) / (2 * k)
    neighbour = max(previous_requests, next_requests if next_requests is not None else 0.0)
    step = (neighbour - num_requests - STEP_SIGMAS * math.sqrt(neighbour + num_requests)) / k
    z = max(0.0, peak_rps * window_s - mean_window - max(trend, step)) / math.sqrt(mean_window)
    return z * z


def clumping_index(
    history: LoadHistory | None, *, lookback_intervals: int, min_intervals: int, quantile: float = 0.4
) -> tuple[float | None, str]:
    """The `quantile` of d over the newest `lookback_intervals` intervals with requests and a peak rate, and a note.

    Each interval's neighbours are the usable intervals (requests and a peak
    rate) before and after it. The newest has none after it yet and is left
    out, unless without it fewer than `min_intervals` remain. None (with the
    reason) when the history carries no peak signal or fewer than
    `min_intervals` usable intervals.
    """
    if lookback_intervals < 1 or min_intervals < 1:
        raise ValueError(
            f"clumping_index: lookback_intervals and min_intervals must be >= 1, got {lookback_intervals} and "
            f"{min_intervals}"
        )
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"clumping_index: quantile must be in (0, 1), got {quantile}")
    if history is None or history.peak_rps is None or history.peak_window_s is None:
        return None, "clumping: no peak-rate signal in the history"
    # The newest usable intervals (requests and a peak rate), newest first, two more than the
    # lookback: each one's trend is against the usable interval before it (the oldest in the
    # whole history has none and is taken as flat). Scanning back stops there: a run reads
    # hundreds of intervals of history and needs a dozen.
    usable: list[tuple[float, float]] = []
    for n, peak in zip(reversed(history.num_requests), reversed(history.peak_rps)):
        if is_number(n) and n > 0 and is_number(peak):
            usable.append((n, peak))
            if len(usable) > lookback_intervals + 1:
                break
    # The newest has no successor yet, so a burst starting inside it reads as a clump until the
    # next interval shows the step; it counts only while there are too few others.
    first = 1 if len(usable) > min_intervals else 0
    values: list[float] = []
    for i in range(first, min(len(usable), first + lookback_intervals)):
        n, peak = usable[i]
        previous = usable[i + 1][0] if i + 1 < len(usable) else n
        after = usable[i - 1][0] if i > 0 else None
        d = interval_clumping(num_requests=n, peak_rps=peak, previous_requests=previous, next_requests=after,
                              interval_s=history.interval_s, window_s=history.peak_window_s)
        if d is not None:
            values.append(d)
    if len(values) < min_intervals:
        return None, f"clumping: {len(values)} intervals with requests and a peak rate, {min_intervals} needed"
    index = float(np.quantile(values, quantile))
    which = quantile_words(quantile)
    return index, (f"clumping: index {index:.2f} ({which} over {len(values)} intervals of the busiest "
                   f"{history.peak_window_s:g} s beyond Poisson, trend and steps)")


def recent_clumping_index(
    history: LoadHistory | None, *, runs: int, lookback_intervals: int, min_intervals: int, quantile: float = 0.4
) -> tuple[float | None, str]:
    """The lowest clumping index of the last `runs` runs, each read from the history as it stood then, and a note.

    At or above a threshold only when every one of those runs read so: a single
    clumpy reading (code tenants x8, seed 3: 2.09 on two lone runs among 0.0s)
    does not switch the sizing basis, clumping that lasts does after `runs` runs.
    None when this run's index is None; an earlier run without one does not count.
    """
    if runs < 1:
        raise ValueError(f"recent_clumping_index: runs must be >= 1, got {runs}")
    kw = dict(lookback_intervals=lookback_intervals, min_intervals=min_intervals, quantile=quantile)
    index, note = clumping_index(history, **kw)
    if index is None:  # also when history is None
        return index, note
    earlier = [clumping_index(history.upto(len(history) - back), **kw)[0] for back in range(1, min(runs, len(history)))]
    readings = [index] + [x for x in earlier if x is not None]
    low = min(readings)
    if low < index:
        note += f"; {low:.2f}, the lowest of the last {len(readings)} runs', counts"
    return low, note


def quantile_words(quantile: float) -> str:
    """A quantile in words: 0.5 "median", 0.33 "33rd percentile", 0.125 "12.5th percentile"."""
    if quantile == 0.5:
        return "median"
    pct = round(quantile * 100, 6)
    if pct != int(pct):
        return f"{pct:g}th percentile"
    n = int(pct)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix} percentile"


def sizing_basis(
    size_on: Literal["mean", "p90", "auto"], index: float | None, *, max_index: float
) -> tuple[Literal["mean", "p90"], str]:
    """The forecast to size on, and why: `auto` takes the mean while the clumping index is below max_index."""
    if size_on in ("mean", "p90"):
        return size_on, f"sized on the {size_on} forecast (predictor.size_on)"
    if size_on != "auto":
        raise ValueError(f"sizing_basis: size_on must be 'mean', 'p90' or 'auto', got {size_on!r}")
    if index is None:
        return "p90", "sized on the p90 forecast: arrival clumping not measured yet"
    if index < max_index:
        return "mean", f"sized on the mean forecast: arrivals look independent (clumping {index:.2f} < {max_index:g})"
    return "p90", f"sized on the p90 forecast: arrivals clump (clumping {index:.2f} >= {max_index:g})"
