"""Sub-interval burstiness: how much of an interval's traffic arrives in its busiest moments.

A planner interval's mean arrival rate hides bursts shorter than the interval
(Azure code arrives in 10-30 s bursts inside quiet minutes). The collect step
reads one more signal per interval, the peak arrival rate over a short window
(`peak_rps` over `peak_window_s`, e.g. the max over the minute of a 15 s rate),
and the history carries it. Its ratio to the interval's mean rate is the burst
ratio b, between 1 (flat) and interval/window (everything in one window).

The queue models use a two-class picture of an interval: a share
f = b x window / interval of its requests arrives at b times the mean rate
(inside the peak window), the rest at the remaining rate over the rest of the
interval. With b = 1 both classes have the mean rate, i.e. today's single-rate
model. `arrival_classes` builds the classes, `expected_peak_ratio` gives the
ratio to size the next interval for, `peak_ratio` reads one interval's.

Pure functions, no I/O.
"""

from __future__ import annotations

import math

import numpy as np

from planner.types import LoadHistory, is_number


def peak_ratio(
    *, num_requests: float | None, peak_rps: float | None, interval_s: float, window_s: float | None
) -> float | None:
    """Peak-window rate over the interval's mean rate, beyond Poisson noise, in [1, interval_s / window_s].

    num_requests: arrivals in the interval (count). peak_rps: highest rate over a
    `window_s` sub-window, requests/s. The busiest window's count less its Poisson
    standard deviation (sqrt of the count), over the mean window's count. Rates are
    measured (Prometheus' rate() extrapolates at window edges), so the ratio is
    clipped to what a window can hold: never below 1 and never above
    interval / window (every request in one window). None if any input is unknown.
    """
    if not (is_number(num_requests) and is_number(peak_rps) and is_number(window_s) and is_number(interval_s)):
        return None
    if num_requests <= 0 or peak_rps < 0 or window_s <= 0 or interval_s <= 0:
        return None
    top = max(1.0, interval_s / window_s)
    # Even Poisson arrivals have a busiest window about one standard deviation above the mean
    # (the max of an interval's ~4 disjoint windows); the queue model already holds that
    # noise, so only the excess over it is burst. It matters at low rates: 33 requests in the
    # busiest 15 s of a 2 rps interval are 1.1x the mean window, not a burst.
    peak_count = peak_rps * window_s
    peak_count = max(0.0, peak_count - math.sqrt(peak_count))
    return min(max(peak_count * interval_s / (window_s * num_requests), 1.0), top)


def peak_rates(arrival_s, *, ends_s, interval_s: float, window_s: float, step_s: float) -> np.ndarray:
    """Each interval's peak arrival rate, requests/s, from request arrival times: the collect step's signal.

    arrival_s: sorted arrival times, seconds; ends_s: the intervals' end times. For an interval
    ending at e, window ends every step_s in (e - interval_s, e], each window (end - window_s, end]:
    what max_over_time(rate(requests_total[window])[interval:step]) reads from the frontend's
    counter (without Prometheus' extrapolation at window edges).
    """
    if not (window_s > 0 and 0 < step_s <= interval_s):
        raise ValueError(f"peak_rates: need window_s > 0 and 0 < step_s <= interval_s, got {window_s}, {step_s}, "
                         f"{interval_s}")
    a = np.asarray(arrival_s, dtype=np.float64)
    steps = max(1, round(interval_s / step_s))
    ends = (np.asarray(ends_s, dtype=np.float64)[:, None] - interval_s
            + step_s * np.arange(1, steps + 1)[None, :])
    counts = np.searchsorted(a, ends, side="right") - np.searchsorted(a, ends - window_s, side="right")
    return counts.max(axis=1).astype(np.float64) / window_s if counts.size else np.zeros(0)


def recent_peaks(
    history: LoadHistory | None, *, lookback_intervals: int, min_requests: float = 1.0
) -> tuple[tuple[float, float], ...]:
    """(requests, peak rps) of the last `lookback_intervals` intervals that have both, oldest first."""
    if history is None or history.peak_rps is None or history.peak_window_s is None or lookback_intervals < 1:
        return ()
    out = []
    for n, peak in zip(history.num_requests[-lookback_intervals:], history.peak_rps[-lookback_intervals:]):
        if is_number(n) and n >= min_requests and is_number(peak) and peak >= 0:
            out.append((float(n), float(peak)))
    return tuple(out)


def history_classes(
    peaks: tuple[tuple[float, float], ...], *, window_s: float, interval_s: float
) -> tuple[tuple[float, float], ...]:
    """(share of requests, rate) parts of the recent intervals together: the traffic mix they served.

    Each interval contributes its peak and off-peak parts (arrival_classes), weighted
    by its requests; a fleet meeting the target for this mix would have served the
    last intervals' requests as the SLA asks.
    """
    total = sum(n for n, _ in peaks)
    out = []
    for n, peak in peaks:
        ratio = peak_ratio(num_requests=n, peak_rps=peak, interval_s=interval_s, window_s=window_s)
        for share, rate, _ in arrival_classes(rps=n / interval_s, ratio=ratio, window_s=window_s,
                                              interval_s=interval_s):
            out.append((share * n / total, rate))
    return tuple(out)


def expected_peak_ratio(
    history: LoadHistory | None, *, lookback_intervals: int, min_requests: float = 1.0
) -> tuple[float | None, str]:
    """The burst ratio to size the next interval for, and a note saying where it came from.

    The request-weighted mean of the last `lookback_intervals` intervals' ratios:
    weighting by requests gives the ratio a random request saw, and busy
    intervals, the ones sizing is for, count most. Intervals with fewer than
    `min_requests` requests or no peak measurement are skipped. None (with the
    reason) when the history carries no peak signal or no usable interval:
    sizing then treats the interval as flat.
    """
    if lookback_intervals < 1:
        return None, "burst: disabled (lookback_intervals 0)"
    if history is None or history.peak_rps is None or history.peak_window_s is None:
        return None, "burst: no peak-rate signal in the history; arrivals treated as flat within the interval"
    num = den = 0.0
    used = 0
    for n, peak in zip(history.num_requests[-lookback_intervals:], history.peak_rps[-lookback_intervals:]):
        if not (is_number(n) and n >= min_requests):
            continue
        b = peak_ratio(num_requests=n, peak_rps=peak, interval_s=history.interval_s, window_s=history.peak_window_s)
        if b is None:
            continue
        num += n * b
        den += n
        used += 1
    if used == 0:
        return None, (f"burst: no interval of the last {lookback_intervals} has both requests and a peak rate; "
                      f"arrivals treated as flat within the interval")
    ratio = num / den
    return ratio, (f"burst: peak {history.peak_window_s:g} s rate {ratio:.2f}x the mean "
                   f"(request-weighted over {used} of the last {lookback_intervals} intervals)")


def arrival_classes(
    *, rps: float, ratio: float | None, window_s: float | None, interval_s: float
) -> tuple[tuple[float, float, float], ...]:
    """(share of requests, arrival rate in requests/s, duration in s) of the peak and off-peak parts.

    rps: the interval's mean arrival rate. With ratio b over a window w of an
    interval T: a share f = b w / T arrives at b x rps for w seconds, the rest
    (1 - f) at rps (1 - f) T / (T - w) for T - w seconds. No ratio, b = 1 or
    w >= T: one class, (1, rps, T).
    """
    if ratio is None or window_s is None or ratio <= 1.0 or window_s >= interval_s or rps <= 0:
        return ((1.0, rps, interval_s),)
    share = min(1.0, ratio * window_s / interval_s)
    rest_s = interval_s - window_s
    peak = (share, ratio * rps, window_s)
    if share >= 1.0:
        return (peak,)
    return peak, (1.0 - share, rps * (1.0 - share) * interval_s / rest_s, rest_s)


def window_mean_wait_s(
    *, servers: int, arrival_rps: float, service_s: float, variability: float, window_s: float,
    stationary_wait_s: float,
) -> float:
    """Mean queueing delay of arrivals during a window of `window_s` at a constant rate, seconds.

    A burst lasts seconds, so the stationary M/G/c wait (infinite at or above
    saturation) overstates it: a queue that starts empty cannot build more than
    the window allows. Below saturation: the stationary mean, capped by the
    diffusion wait of a critically loaded queue over the window,
    D = (2/3) sqrt(2 g S / c) sqrt(2 W / pi) (the time-averaged mean of a
    reflected Brownian motion with the queue's work variance 2 g S / c per
    second). At or above it: D plus the fluid backlog, (rho - 1) W / 2 on
    average. Continuous and non-decreasing in the load, so the correction step
    can solve for the service-time factor.
    """
    if arrival_rps <= 0 or service_s <= 0 or variability <= 0:
        return 0.0
    rho = arrival_rps * service_s / servers
    cap = (2.0 / 3.0) * math.sqrt(2.0 * variability * service_s / servers) * math.sqrt(2.0 * window_s / math.pi)
    if rho < 1.0:
        return min(stationary_wait_s, cap)
    return cap + (rho - 1.0) * window_s / 2.0
