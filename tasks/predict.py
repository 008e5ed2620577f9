"""The predict step: next-interval load from the collected history."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from planner.config import PredictorConfig
from planner.pipeline import predict_next
from planner.types import Forecast, Observation


@task(cache_policy=NO_CACHE)
def predict_load(obs: Observation, *, cfg: PredictorConfig) -> Forecast | None:
    """None when the history holds no load data (the decision then holds)."""
    return predict_next(obs, cfg)
