"""The predict step as its Prefect task: next-interval load from the collected history."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.predictor_cache import open_predictor_cache
from planner.config import PredictorConfig
from planner import pipeline
from planner.types import Forecast, LoadHistory, Observation
from workloads import traces


# The warm-up trace's per-interval load (workloads.traces.load_warmup_history; the simulator reads the same
# file with load_warmup_trace and bins it per history window).
load_warmup_history = task(traces.load_warmup_history, name="load_warmup_history", cache_policy=NO_CACHE)


def predict_with_cache(
    obs: Observation,
    *,
    cfg: PredictorConfig,
    cache_namespace: str | None = None,
    warmup: LoadHistory | None = None,
) -> Forecast | None:
    """The predict step with the namespace's fitted predictor state; None when the history holds no load data
    (the decision then holds).

    cache_namespace: whose fitted predictor state to reuse and update in
    cfg.cache_dir (e.g. "<namespace>/<model id>"); None runs without a cache
    (what-if runs, whose scaled load must not touch the real series' state).
    warmup: the warm-up trace's load, put before a short collected history.
    """
    cache = open_predictor_cache(cfg.cache_dir, namespace=cache_namespace)
    return pipeline.predict_load(obs, cfg, cache=cache, warmup=warmup)


predict_load = task(predict_with_cache, name="predict_load", cache_policy=NO_CACHE)
