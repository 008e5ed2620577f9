"""The predict step as its Prefect task: next-interval load from the collected history."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.predictor_cache import open_predictor_cache
from planner.config import PredictorConfig
from planner import pipeline
from planner.types import Forecast, LoadHistory, Observation
from sim.traces import bin_trace, load_trace


@task(cache_policy=NO_CACHE)
def load_warmup_history(path: str, *, interval_s: float) -> LoadHistory:
    """The warm-up trace's per-interval load (predictor.warmup_trace_path), binned at interval_s seconds.

    Errors name the file: a missing or malformed trace fails the run rather
    than silently forecasting without it.
    """
    try:
        trace = load_trace(path)
    except OSError as exc:
        raise ValueError(f"predictor.warmup_trace_path: {path}: cannot read the warm-up trace: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"predictor.warmup_trace_path: {exc}") from None
    if len(trace) == 0:
        raise ValueError(f"predictor.warmup_trace_path {path}: the warm-up trace holds no requests")
    return bin_trace(trace, bin_s=interval_s)


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
