"""The correct step: observed / expected latency factors."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.config import CorrectionConfig
from planner.correct import correction_factors
from planner.profile import EngineProfile
from planner.types import Corrections, Observation


@task(cache_policy=NO_CACHE)
def correct_latency(
    obs: Observation, *, profile: EngineProfile, decode_replicas: int, cfg: CorrectionConfig
) -> Corrections:
    return correction_factors(obs, profile=profile, decode_replicas=decode_replicas, cfg=cfg)
