"""The connector a recommend-only (advisory) run uses: every read goes through, every write is refused.

Advisory mode runs beside an autoscaler that owns the replicas, so the checks a connector makes
before writing (the llm-d connector refuses a target an HPA or a KEDA ScaledObject scales) do not
apply: a connector that has such checks offers `validate_reads`, the checks a reader needs, and
`validate` calls it when present. `apply` raises: nothing reaches the backend, whatever calls it.
"""

from __future__ import annotations

from connectors.base import Connector, ConnectorError
from planner.types import Decision, DecisionRecord, FleetState


class ReadOnlyConnector:
    """Wraps a connector: reads delegated, writes refused (Connector protocol)."""

    def __init__(self, inner: Connector):
        self.inner = inner

    def validate(self) -> None:
        """The backend holds what a reader needs (the wrapped connector's validate_reads, else its validate)."""
        getattr(self.inner, "validate_reads", self.inner.validate)()

    def read_fleet(self, *, now_s: float) -> FleetState:
        return self.inner.read_fleet(now_s=now_s)

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        raise ConnectorError(
            f"advisory mode (planner.mode advisory): a run writes nothing, but was asked to apply prefill "
            f"{decision.prefill_replicas}, decode {decision.decode_replicas}")

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        return self.inner.last_decision_done(now_s=now_s)
