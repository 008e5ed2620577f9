"""The collect step: metrics from Prometheus and the fleet from the connector."""

from __future__ import annotations

from prefect import get_run_logger, task

from connectors.base import Connector
from connectors.config import ConnectorConfig, MetricsConfig
from connectors.factory import make_connector
from connectors.read_only import ReadOnlyConnector
from planner.types import POOLS, FleetState, Observation
from tasks.retry import network_task


@task(**network_task)
def collect_metrics(
    metrics: MetricsConfig, *, now_s: float, interval_s: float, history_intervals: int,
    fleet: FleetState | None = None,
) -> Observation:
    """Averages over the last interval, per-pod saturation signals, the load history and how many
    frontends and workers reported (of the fleet's ready replicas, when `fleet` is given)."""
    from connectors.prometheus import PrometheusCollector

    expected = None if fleet is None else {p: getattr(fleet, p).ready_replicas for p in POOLS}
    get_run_logger().info(metrics.source_note())
    with PrometheusCollector(metrics) as collector:
        return collector.collect(now_s=now_s, interval_s=interval_s, history_intervals=history_intervals,
                                 expected_workers=expected)


@task(**network_task)
def fetch_ready_history(
    metrics: MetricsConfig, *, now_s: float, window_s: float, step_s: float, interval_s: float,
) -> tuple[tuple[float, int, int], ...]:
    """Workers reporting per pool over the last window_s (where the counts change): the ready counts each pool's
    startup time is measured from when scale to zero weighs a cold start (planner.signals.startup_time)."""
    from connectors.prometheus import PrometheusCollector

    with PrometheusCollector(metrics) as collector:
        return collector.ready_history(now_s=now_s, window_s=window_s, step_s=step_s, interval_s=interval_s)


@task(**network_task)
def open_connector(config: ConnectorConfig, *, namespace: str, read_only: bool = False) -> Connector:
    """Build the connector and check the backend holds what the planner needs.

    read_only: an advisory run's connector (connectors.read_only): reads only, refuses to write.
    """
    connector = make_connector(config, default_namespace=namespace)
    if read_only:
        connector = ReadOnlyConnector(connector)
    connector.validate()
    return connector


@task(**network_task)
def read_fleet(connector: Connector, *, now_s: float) -> FleetState:
    """Current and ready replicas, the last decision and the recent targets."""
    return connector.read_fleet(now_s=now_s)
