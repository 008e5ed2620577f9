"""The decide step: bounds, GPU budget, stabilization and transitions."""

from __future__ import annotations

from collections.abc import Mapping

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.config import DecisionConfig, FastPathConfig
from planner.decide import decide
from planner.saturation import PoolSaturation
from planner.types import Decision, FleetState, Observation, Pool, PoolSizing


@task(cache_policy=NO_CACHE)
def decide_targets(
    *,
    sizing: Mapping[Pool, PoolSizing],
    saturation: Mapping[Pool, PoolSaturation] | None,
    fleet: FleetState,
    obs: Observation,
    cfg: DecisionConfig,
    now_s: float,
    fast_path: FastPathConfig | None = None,
) -> Decision:
    return decide(sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s,
                  fast_path=fast_path)
