"""The collect step: metrics from Prometheus and the fleet from the connector."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.base import ConcurrentWriteError, Connector
from connectors.config import ConnectorConfig, MetricsConfig
from connectors.factory import make_connector
from planner.types import POOLS, FleetState, Observation

# Backoff for calls that cross the network: 2 s, 4 s, 8 s, then the run fails visibly.
NETWORK_RETRY_DELAYS_S = [2, 4, 8]
# What a retry can fix: an unreachable backend or a lost optimistic-concurrency race.
# A 403/404 or a bad query fails at once, naming the problem.
RETRYABLE = (ConnectionError, TimeoutError, ConcurrentWriteError)


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect retry condition: retry only exceptions a retry can fix."""
    try:
        state.result()
    except RETRYABLE:
        return True
    except BaseException:
        return False
    return False


network_task = dict(
    retries=len(NETWORK_RETRY_DELAYS_S),
    retry_delay_seconds=NETWORK_RETRY_DELAYS_S,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)


@task(**network_task)
def collect_metrics(
    metrics: MetricsConfig, *, now_s: float, interval_s: float, history_intervals: int,
    fleet: FleetState | None = None,
) -> Observation:
    """Averages over the last interval, per-pod saturation signals, the load history and how many
    frontends and workers reported (of the fleet's ready replicas, when `fleet` is given)."""
    from connectors.prometheus import PrometheusCollector

    expected = None if fleet is None else {p: getattr(fleet, p).ready_replicas for p in POOLS}
    with PrometheusCollector(metrics) as collector:
        return collector.collect(now_s=now_s, interval_s=interval_s, history_intervals=history_intervals,
                                 expected_workers=expected)


@task(**network_task)
def open_connector(config: ConnectorConfig, *, namespace: str) -> Connector:
    """Build the connector and check the backend holds what the planner needs."""
    connector = make_connector(config, default_namespace=namespace)
    connector.validate()
    return connector


@task(**network_task)
def read_fleet(connector: Connector, *, now_s: float) -> FleetState:
    """Current and ready replicas, the last decision and the recent targets."""
    return connector.read_fleet(now_s=now_s)
