"""The fast path's events: a saturation signal and a wake from zero, sent to Prefect's event API.

The planner deployment's trigger (prefect.yaml, `triggers:`) expects this
event for its namespace and starts a scale-up-only run (`fast_path: true`).
The event's resource names the fleet by namespace and model, so one Prefect
server can serve several planners; its payload carries the signal's numbers.
"""

from __future__ import annotations

from datetime import datetime, timezone

from prefect.events import Event, emit_event

from planner.decision.wake import WakeSignal
from planner.saturation.fast_path import SaturationSignal

SATURATION_EVENT = "sla-planner.saturation.detected"
WAKE_EVENT = "sla-planner.wake.requested"
NAMESPACE_LABEL = "sla-planner.namespace"
MODEL_LABEL = "sla-planner.model-id"


def fleet_resource(*, namespace: str, model_id: str) -> dict[str, str]:
    """The event's resource: the fleet the planner in `namespace` scales for `model_id`."""
    return {
        "prefect.resource.id": f"sla-planner.fleet.{namespace}.{model_id}",
        "prefect.resource.name": f"{namespace}/{model_id}",
        NAMESPACE_LABEL: namespace,
        MODEL_LABEL: model_id,
    }


def emit_saturation(signal: SaturationSignal, *, namespace: str, model_id: str, now_s: float) -> Event | None:
    """Send the saturation event (Prefect's events client, in the background); the event, or None when
    this process sends no events (no Prefect API configured, or events switched off).

    now_s: when the signal was read, Unix seconds.
    """
    return emit_event(
        event=SATURATION_EVENT,
        resource=fleet_resource(namespace=namespace, model_id=model_id),
        occurred=datetime.fromtimestamp(now_s, tz=timezone.utc),
        payload={
            "message": signal.message,
            "pools": list(signal.pools),
            "shed": signal.shed,
            "numbers": dict(signal.numbers),
        },
    )


def emit_wake(signal: WakeSignal, *, namespace: str, model_id: str, now_s: float) -> Event | None:
    """Send the wake event (requests waiting for a pool at zero); the event, or None when this process sends
    none. The wake deployment's trigger (prefect.yaml) starts the wake run. now_s: Unix seconds."""
    return emit_event(
        event=WAKE_EVENT,
        resource=fleet_resource(namespace=namespace, model_id=model_id),
        occurred=datetime.fromtimestamp(now_s, tz=timezone.utc),
        payload={"message": signal.message, "pools": list(signal.at_zero), "numbers": dict(signal.numbers)},
    )


__all__ = ["MODEL_LABEL", "NAMESPACE_LABEL", "SATURATION_EVENT", "WAKE_EVENT", "emit_saturation", "emit_wake",
           "fleet_resource"]
