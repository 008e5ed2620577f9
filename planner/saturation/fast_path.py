"""The fast path's trigger: does the saturation signal call for a scale-up before the next interval?

It fires when the saturation guardrail (planner.saturation.guardrail, WVA-style) calls
for a scale-up on either pool's pods, or when the routing service shed
requests. The watcher evaluates it every poll; the simulator does the same on
its clock. The decision the trigger starts is `planner.decision.decide.decide` in
fast-path mode (scale-up only, with a cooldown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.config import FastPathConfig, SaturationThresholds
from planner.saturation.analysis import analyze_saturation
from planner.types import POOLS, PodMetrics, Pool, is_number


@dataclass(frozen=True)
class SaturationSignal:
    """Whether the fast path's trigger fires now, and the numbers behind it.

    pools: pools whose guardrail calls for a scale-up.
    shed: True when the router shed at least shed_min_requests.
    """

    fire: bool
    pools: tuple[Pool, ...]
    shed: bool
    message: str
    numbers: dict[str, float] = field(default_factory=dict)


def saturation_signal(
    *,
    pods: Sequence[PodMetrics],
    thresholds: SaturationThresholds,
    cfg: FastPathConfig,
    shed_requests: float | None = None,
) -> SaturationSignal:
    """The trigger's verdict on the pods' queue and KV-cache use and the router's shedding.

    pods: every worker's metrics (kv_usage_frac 0..1, queue_length requests),
        both pools; a pool with no reporting pod never fires.
    shed_requests: requests the routing service shed over its query's window;
        None (no router, no series) or NaN: not known, never fires.
    """
    pools: list[Pool] = []
    numbers: dict[str, float] = {}
    parts: list[str] = []
    for pool in POOLS:
        a = analyze_saturation(pods=[p for p in pods if p.pool == pool], thresholds=thresholds)
        numbers[f"{pool}_reporting_replicas"] = float(a.reporting_replicas)
        numbers[f"{pool}_saturated_count"] = float(a.saturated_count)
        if a.avg_spare_kv_frac is not None:
            numbers[f"{pool}_avg_spare_kv_frac"] = a.avg_spare_kv_frac
            numbers[f"{pool}_avg_spare_queue"] = a.avg_spare_queue
        if a.should_scale_up:
            pools.append(pool)
            parts.append(f"{pool} {a.message}")
    shed = is_number(shed_requests) and shed_requests >= cfg.shed_min_requests
    if is_number(shed_requests):
        numbers["shed_requests"] = float(shed_requests)
    if shed:
        parts.append(f"router shed {shed_requests:g} requests (>= {cfg.shed_min_requests:g})")
    fire = bool(pools) or shed
    message = "; ".join(parts) if fire else "no pool short of spare KV or queue, no shedding"
    return SaturationSignal(fire=fire, pools=tuple(pools), shed=shed, message=message, numbers=numbers)


__all__ = ["SaturationSignal", "saturation_signal"]
