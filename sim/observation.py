"""The simulated frontend as the planner's collect step reads it: counters over one interval."""

from __future__ import annotations

from dataclasses import dataclass

from planner.types import LoadHistory, Observation, PodMetrics


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
    )
