"""The apply step: write the targets through the connector."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.base import Connector
from planner.types import Decision, DecisionRecord
from tasks.collect import NETWORK_RETRY_DELAYS_S


@task(retries=len(NETWORK_RETRY_DELAYS_S), retry_delay_seconds=NETWORK_RETRY_DELAYS_S, cache_policy=NO_CACHE)
def apply_decision(connector: Connector, decision: Decision, *, now_s: float) -> DecisionRecord | None:
    """None when nothing was written (unchanged targets or a hold)."""
    return connector.apply(decision, now_s=now_s)
