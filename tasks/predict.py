"""The predict step: next-interval load from the collected history."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.predictor_cache import open_predictor_cache
from planner.config import PredictorConfig
from planner.pipeline import predict_next
from planner.types import Forecast, Observation


@task(cache_policy=NO_CACHE)
def predict_load(obs: Observation, *, cfg: PredictorConfig, cache_namespace: str | None = None) -> Forecast | None:
    """None when the history holds no load data (the decision then holds).

    cache_namespace: whose fitted predictor state to reuse and update in
    cfg.cache_dir (e.g. "<namespace>/<model id>"); None runs without a cache
    (what-if runs, whose scaled load must not touch the real series' state).
    """
    cache = open_predictor_cache(cfg.cache_dir, namespace=cache_namespace)
    return predict_next(obs, cfg, cache=cache)
