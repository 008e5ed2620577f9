"""The connector interface: how a planner run reads the fleet and applies a decision.

A connector is the only thing that knows where replicas live (a Kubernetes
DynamoGraphDeployment, the "virtual" etcd key protocol, or a local file). Every
call reads fresh state from that backend, so a planner run that crashed or was
rescheduled loses nothing: the previous decision, whether it is done, and the
recent targets (for the scale-down stabilization window) all live in the
backend, not in the process.

Errors name the backend object and what the connector was doing. Transient
backend trouble raises `ConnectorUnavailableError` (a `ConnectionError`), so the
Prefect task's retries apply; everything else is a `ConnectorError` that a retry
will not fix.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from planner.types import Decision, DecisionRecord, FleetState

if TYPE_CHECKING:
    from connectors.config import ConnectorConfig


class ConnectorError(RuntimeError):
    """A connector could not do its job; the message names object, verb and cause."""


class ConnectorUnavailableError(ConnectorError, ConnectionError):
    """The backend (etcd, API server) could not be reached; retrying may help."""


class ConcurrentWriteError(ConnectorError):
    """Another writer changed the planner's state between our read and our write."""


class ResourceAccessError(ConnectorError):
    """The backend refused or lacks the object (HTTP 403/404 and the like)."""


@runtime_checkable
class Connector(Protocol):
    """Read current/ready replicas per pool, apply targets, report whether done."""

    def validate(self) -> None:
        """Check the backend holds what the planner needs; raise naming what is missing."""
        ...

    def read_fleet(self, *, now_s: float) -> FleetState:
        """Current and ready replicas per pool, the last decision (with its done
        flag as of now_s, seconds) and the recent targets history."""
        ...

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Write the decision's targets; None when skipped (decision.apply is
        False or the targets are already in place). now_s: decision time, s."""
        ...

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        """True when the deployment reached the last decision's targets (or there
        is none). now_s: seconds, for connectors with a done timeout; None reads
        the wall clock."""
        ...


def targets_entry(*, decision_id: int, decided_at_s: float, prefill: int, decode: int) -> dict:
    """One element of the stored recent-targets history (JSON-friendly)."""
    return {"id": decision_id, "t_s": decided_at_s, "prefill": prefill, "decode": decode}


def parse_targets_history(text: str | bytes | None, *, source: str) -> list[dict]:
    """Decode a stored recent-targets history; empty when absent.

    source: where the text came from (etcd key, annotation), for the error message.
    """
    if text is None or text in ("", b""):
        return []
    try:
        items = json.loads(text)
        return [
            targets_entry(
                decision_id=int(item["id"]),
                decided_at_s=float(item["t_s"]),
                prefill=int(item["prefill"]),
                decode=int(item["decode"]),
            )
            for item in items
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise ConnectorError(
            f"{source}: recent targets history is not a JSON list of "
            f'{{"id", "t_s", "prefill", "decode"}} objects ({exc}): {text[:200]!r}'
        ) from None


def append_targets(history: list[dict], entry: dict, *, max_entries: int) -> list[dict]:
    """The history with `entry` appended, keeping the newest max_entries."""
    return (list(history) + [entry])[-max_entries:]


def as_recent_targets(history: list[dict]) -> tuple[tuple[float, int, int], ...]:
    """FleetState.recent_targets from a stored history, oldest first."""
    ordered = sorted(history, key=lambda e: (e["t_s"], e["id"]))
    return tuple((e["t_s"], e["prefill"], e["decode"]) for e in ordered)


def make_connector(config: "ConnectorConfig", *, default_namespace: str = "default") -> Connector:
    """Build the connector a config describes.

    default_namespace: used when the config leaves `namespace` unset (the
    planner config's namespace).
    """
    kind = config.kind
    if kind == "kubernetes":
        from connectors.kubernetes import KubernetesConnector

        return KubernetesConnector(config, default_namespace=default_namespace)
    if kind == "virtual":
        from connectors.virtual import VirtualConnector

        return VirtualConnector(config, default_namespace=default_namespace)
    if kind == "local":
        from connectors.local import LocalConnector

        return LocalConnector(config)
    raise ValueError(f"connector.kind: expected kubernetes, virtual or local, got {kind!r}")
