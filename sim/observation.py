"""The simulated frontend as the planner's collect step reads it: counters and the TTFT and ITL histograms over one
interval, length histograms over a trailing window."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from planner.signals.length_shape import DYNAMO_ISL_BOUNDS_TOKENS, DYNAMO_OSL_BOUNDS_TOKENS
from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, DYNAMO_TTFT_BOUNDS_S
from planner.types import LatencyHistogram, LatencyWindow, LengthHistogram, LoadHistory, Observation, PodMetrics


_TTFT_BOUNDS = list(DYNAMO_TTFT_BOUNDS_S)
_ITL_BOUNDS = list(DYNAMO_ITL_BOUNDS_S)


@dataclass
class IntervalStats:
    """Frontend counters since the last collection (what Prometheus would rate over)."""

    arrivals: int = 0
    isl_sum: float = 0.0
    first_tokens: int = 0
    ttft_sum_s: float = 0.0
    completions: int = 0
    osl_sum: float = 0.0
    itl_count: int = 0
    itl_sum_s: float = 0.0
    # TTFTs per bucket of Dynamo's frontend histogram (non-cumulative; the last: above every bound)
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * (len(_TTFT_BOUNDS) + 1))
    # token gaps per bucket of its inter-token latency histogram (one per output token after the first)
    itl_buckets: list[int] = field(default_factory=lambda: [0] * (len(_ITL_BOUNDS) + 1))

    def first_token(self, ttft_s: float) -> None:
        """Count one first token, ttft_s after its request arrived."""
        self.first_tokens += 1
        self.ttft_sum_s += ttft_s
        self.ttft_buckets[bisect_left(_TTFT_BOUNDS, ttft_s)] += 1

    def token_gaps(self, gap_s: float, count: int) -> None:
        """Count `count` output tokens that each came gap_s after the request's previous one (a decode step).

        The engine counts each gap at its step's length; a request's first gap also
        holds the rest of the step it was admitted in, which this leaves out.
        """
        self.itl_buckets[bisect_left(_ITL_BOUNDS, gap_s)] += count


def interval_observation(
    stats: IntervalStats,
    *,
    taken_at_s: float,
    interval_s: float,
    history: LoadHistory | None,
    pods: tuple[PodMetrics, ...],
) -> Observation:
    """What the planner's collect step would read for one interval of the simulated frontend."""
    return Observation(
        taken_at_s=taken_at_s,
        interval_s=interval_s,
        num_requests=float(stats.arrivals),
        avg_isl_tokens=stats.isl_sum / stats.arrivals if stats.arrivals else None,
        avg_osl_tokens=stats.osl_sum / stats.completions if stats.completions else None,
        avg_ttft_ms=stats.ttft_sum_s * 1e3 / stats.first_tokens if stats.first_tokens else None,
        avg_itl_ms=stats.itl_sum_s * 1e3 / stats.itl_count if stats.itl_count else None,
        history=history,
        pods=pods,
        ttft_histogram=LatencyHistogram(DYNAMO_TTFT_BOUNDS_S, tuple(float(c) for c in accumulate(stats.ttft_buckets))),
        itl_histogram=LatencyHistogram(DYNAMO_ITL_BOUNDS_S, tuple(float(c) for c in accumulate(stats.itl_buckets))),
    )


class LengthWindow:
    """The frontend's length histograms over a trailing window, as the collect step reads them.

    Counts each interval's arrivals into Dynamo's ISL and OSL buckets (output
    lengths at arrival, known from the trace: the frontend counts them at
    completion, seconds later, which a window of many intervals does not see)
    and sums the last `window_intervals` intervals.
    """

    def __init__(self, isl_tokens: np.ndarray, osl_tokens: np.ndarray, *, window_intervals: int, interval_s: float):
        self.isl = np.asarray(isl_tokens, dtype=float)
        self.osl = np.asarray(osl_tokens, dtype=float)
        self._isl_b = np.searchsorted(DYNAMO_ISL_BOUNDS_TOKENS, self.isl, side="left")
        self._osl_b = np.searchsorted(DYNAMO_OSL_BOUNDS_TOKENS, self.osl, side="left")
        self._parts: deque[tuple[np.ndarray, float, np.ndarray, float]] = deque(maxlen=window_intervals)
        self._start = 0
        self.interval_s = interval_s

    def add_interval(self, end_index: int) -> None:
        """Count the requests [previous end, end_index) (arrival order) as the newest interval."""
        i0, i1 = self._start, end_index
        self._parts.append((
            np.bincount(self._isl_b[i0:i1], minlength=len(DYNAMO_ISL_BOUNDS_TOKENS) + 1), float(self.isl[i0:i1].sum()),
            np.bincount(self._osl_b[i0:i1], minlength=len(DYNAMO_OSL_BOUNDS_TOKENS) + 1), float(self.osl[i0:i1].sum()),
        ))
        self._start = i1

    def histograms(self) -> tuple[LengthHistogram, LengthHistogram]:
        """(ISL, OSL) histograms over the window (the intervals counted so far, up to window_intervals)."""
        window_s = len(self._parts) * self.interval_s
        isl_c = np.cumsum(sum(p[0] for p in self._parts))
        osl_c = np.cumsum(sum(p[2] for p in self._parts))
        return (
            LengthHistogram(DYNAMO_ISL_BOUNDS_TOKENS, tuple(isl_c.tolist()), sum(p[1] for p in self._parts), window_s),
            LengthHistogram(DYNAMO_OSL_BOUNDS_TOKENS, tuple(osl_c.tolist()), sum(p[3] for p in self._parts), window_s),
        )


class SloWindow:
    """The frontend's TTFT and ITL histograms over a trailing window (the collect step's metrics.slo_window_s)."""

    def __init__(self, *, window_intervals: int, interval_s: float):
        self._parts: deque[tuple[list[int], list[int]]] = deque(maxlen=window_intervals)
        self.interval_s = interval_s

    def add_interval(self, stats: IntervalStats) -> LatencyWindow:
        """Count one interval's buckets as the newest; the window's histograms (the intervals so far, up to its length)."""
        self._parts.append((stats.ttft_buckets, stats.itl_buckets))
        ttft, itl = (np.sum([p[k] for p in self._parts], axis=0) for k in (0, 1))
        return LatencyWindow(
            len(self._parts) * self.interval_s,
            LatencyHistogram(DYNAMO_TTFT_BOUNDS_S, tuple(float(c) for c in np.cumsum(ttft))),
            LatencyHistogram(DYNAMO_ITL_BOUNDS_S, tuple(float(c) for c in np.cumsum(itl))),
        )
