"""The analyze-saturation step: the per-replica KV-cache / queue guardrail."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.config import PlannerConfig
from planner.pipeline import analyze_saturation as analyze_pools
from planner.saturation import PoolSaturation
from planner.types import FleetState, Observation, Pool


@task(cache_policy=NO_CACHE)
def analyze_saturation(
    obs: Observation, *, fleet: FleetState, cfg: PlannerConfig, now_s: float
) -> dict[Pool, PoolSaturation] | None:
    return analyze_pools(obs, fleet, cfg, now_s=now_s)
