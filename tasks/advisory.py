"""Advisory mode's steps as Prefect tasks: read back what the running autoscaler set, and compare with it."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.autoscaler_history import AdvisoryHistory, read_advisory_history
from connectors.config import AdvisoryConfig, MetricsConfig
from planner.advisory import AdvisoryComparison, compare_run
from planner.config import PlannerConfig
from planner.pipeline import PlanResult
from tasks.retry import network_task


@task(**network_task)
def fetch_advisory_history(metrics: MetricsConfig, advisory: AdvisoryConfig, cfg: PlannerConfig, *,
                           now_s: float) -> AdvisoryHistory:
    """The running autoscaler's replicas and the advisory's own targets and recommendations, from Prometheus."""
    return read_advisory_history(
        metrics, advisory, namespace=cfg.namespace, model_id=cfg.model_id, now_s=now_s,
        interval_s=cfg.adjustment_interval_s, recommendation_window_s=cfg.decision.recommendation_window[1],
    )


@task(cache_policy=NO_CACHE)
def compare_with_autoscaler(result: PlanResult, history: AdvisoryHistory, advisory: AdvisoryConfig, *,
                            now_s: float, interval_s: float) -> AdvisoryComparison:
    """This run's decision and the advisory's history against the autoscaler's, over advisory.window_s."""
    return compare_run(result.decision, result.fleet, advisory=history.advisory, autoscaler=history.autoscaler,
                       now_s=now_s, window_s=advisory.window_s, step_s=interval_s)
