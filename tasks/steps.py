"""The planner's steps as Prefect tasks: each wraps the planner.steps function of the same name, and what it reads.

The flow hands these to the pipeline (planner.pipeline.Steps) in place of the plain functions, so the UI
shows each step as its own task run. Core calls never retry (a retry cannot fix arithmetic).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors import predictor_cache
from connectors.profiles import load_profile
from planner import steps
from planner.config import ProfileConfig
from planner.latency.profile import EngineProfile
from workloads import traces


@task(cache_policy=NO_CACHE)
def load_profiling_data(cfg: ProfileConfig) -> EngineProfile:
    """The pre-deployment profile (NPZ files), validated."""
    return load_profile(cfg)


# The warm-up trace's per-interval load (workloads.traces.load_warmup_history; the simulator reads the same
# file with load_warmup_trace and bins it per history window).
load_warmup_history = task(traces.load_warmup_history, name="load_warmup_history", cache_policy=NO_CACHE)

# The namespace's fitted predictor state (predictor.cache_dir), which the predict step reuses and updates;
# None without a namespace (what-if runs, whose scaled load must not touch the real series' state).
open_predictor_cache = task(predictor_cache.open_predictor_cache, name="open_predictor_cache",
                            cache_policy=NO_CACHE)

correct_latency = task(steps.correct_latency, cache_policy=NO_CACHE)
predict_load = task(steps.predict_load, cache_policy=NO_CACHE)
size_warmup_floor = task(steps.size_warmup_floor, cache_policy=NO_CACHE)
interpolate_replicas = task(steps.interpolate_replicas, cache_policy=NO_CACHE)
analyze_fleet_saturation = task(steps.analyze_fleet_saturation, cache_policy=NO_CACHE)
decide_targets = task(steps.decide_targets, cache_policy=NO_CACHE)
