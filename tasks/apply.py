"""The apply step: record the run's recommendation and write the targets through the connector."""

from __future__ import annotations

from prefect import task

from connectors.base import Connector
from planner.types import Decision, DecisionRecord
from tasks.retry import network_task


@task(**network_task)
def apply_decision(connector: Connector, decision: Decision, *, now_s: float) -> DecisionRecord | None:
    """Record the run's recommendation (stabilization window) and write changed targets, in one write.

    Returns the new decision's record; None when no targets were written
    (unchanged targets or a hold), though the recommendation still was. Call it
    on every run that acts, never on a dry run or what-if.
    """
    return connector.apply(decision, now_s=now_s)
