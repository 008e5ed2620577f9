"""The correct step: observed / expected latency factors."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.config import PlannerConfig
from planner.pipeline import correct_latency as correct_step
from planner.profile import EngineProfile
from planner.types import Corrections, FleetState, Observation


@task(cache_policy=NO_CACHE)
def correct_latency(
    obs: Observation, *, fleet: FleetState, profile: EngineProfile, cfg: PlannerConfig
) -> Corrections:
    return correct_step(obs, fleet=fleet, profile=profile, cfg=cfg)
