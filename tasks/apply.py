"""The apply step: write the targets through the connector."""

from __future__ import annotations

from prefect import task

from connectors.base import Connector
from planner.types import Decision, DecisionRecord
from tasks.collect import network_task


@task(**network_task)
def apply_decision(connector: Connector, decision: Decision, *, now_s: float) -> DecisionRecord | None:
    """None when nothing was written (unchanged targets or a hold)."""
    return connector.apply(decision, now_s=now_s)
