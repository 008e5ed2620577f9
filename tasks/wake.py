"""The wake run's read: requests waiting for a pool at zero, from Prometheus."""

from __future__ import annotations

from prefect import task

from connectors.config import MetricsConfig
from tasks.retry import network_task


@task(**network_task)
def fetch_wake_requests(metrics: MetricsConfig, *, now_s: float, interval_s: float) -> float | None:
    """metrics.queries.wake_requests at now_s (Unix seconds); None: no series. interval_s: for ${interval}."""
    from connectors.prometheus import PrometheusCollector

    with PrometheusCollector(metrics) as collector:
        return collector.wake_requests(now_s=now_s, interval_s=interval_s)
