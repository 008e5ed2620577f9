"""The interpolate step as its Prefect task: profiling data turns the forecast into replicas per pool."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.profiles import load_profile
from planner import pipeline
from planner.config import ProfileConfig
from planner.profile import EngineProfile


@task(cache_policy=NO_CACHE)
def load_profiling_data(cfg: ProfileConfig) -> EngineProfile:
    """The pre-deployment profile (NPZ files), validated."""
    return load_profile(cfg)


interpolate_replicas = task(pipeline.interpolate_replicas, cache_policy=NO_CACHE)
