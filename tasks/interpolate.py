"""The interpolate step as its Prefect task: profiling data turns the forecast into replicas per pool."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.profiles import load_profile
from planner import pipeline, warmup_floor
from planner.config import ProfileConfig
from planner.latency.profile import EngineProfile


@task(cache_policy=NO_CACHE)
def load_profiling_data(cfg: ProfileConfig) -> EngineProfile:
    """The pre-deployment profile (NPZ files), validated."""
    return load_profile(cfg)


interpolate_replicas = task(pipeline.interpolate_replicas, cache_policy=NO_CACHE)

# What the warm-up trace's last window needed, sized as this step sizes a forecast: the floor a planner just
# started keeps until its own recommendations fill the stabilization window (planner.warmup_floor).
size_warmup_floor = task(warmup_floor.warmup_floor, name="size_warmup_floor", cache_policy=NO_CACHE)
