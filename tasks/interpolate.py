"""The interpolate step: profiling data turns the forecast into replicas per pool."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.profiles import load_profile
from planner.config import PlannerConfig, ProfileConfig
from planner.pipeline import size_pools
from planner.profile import EngineProfile
from planner.types import Corrections, Forecast, Pool, PoolSizing


@task(cache_policy=NO_CACHE)
def load_profiling_data(cfg: ProfileConfig) -> EngineProfile:
    """The pre-deployment profile (NPZ files), validated."""
    return load_profile(cfg)


@task(cache_policy=NO_CACHE)
def interpolate_replicas(
    forecast: Forecast, *, corrections: Corrections, profile: EngineProfile, cfg: PlannerConfig
) -> dict[Pool, PoolSizing]:
    return size_pools(forecast, corrections=corrections, profile=profile, cfg=cfg)
