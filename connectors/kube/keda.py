"""KEDA ScaledObjects as the planner reads them: what they scale, whether they apply the planner's gauge,
and the replica count KEDA's HPA makes of a value. Pure functions, no I/O.

KEDA v2.20 (keda.sh/v1alpha1): `spec.scaleTargetRef` {apiVersion (default apps/v1),
kind (default Deployment), name}; `minReplicaCount` (default 0), `maxReplicaCount`
(default 100); each `prometheus` trigger's query must return one element (an empty
result reads 0 unless `ignoreNullValues: "false"`, then it is an error that leaves
the replicas as they are); with `metricType: AverageValue` (the default) the HPA KEDA
creates asks ceil(value / threshold) replicas, skipped while the ratio to the current
count is within its tolerance (10% unless `behavior.<direction>.tolerance` is set),
clamped to [max(min, 1), max] (KEDA itself scales to 0 when min is 0 and the value is
at or below `activationThreshold`). The annotation `autoscaling.keda.sh/paused-replicas`
pauses a ScaledObject at that count.
"""

from __future__ import annotations

import math
import re

GAUGE = "sla_planner_inference_pool_desired_replicas"
PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"
PAUSED = "autoscaling.keda.sh/paused"
DEFAULT_MIN_REPLICAS, DEFAULT_MAX_REPLICAS = 0, 100
HPA_DEFAULT_TOLERANCE = 0.1


def name_of(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name', '?')}" if meta.get("namespace") else str(meta.get("name", "?"))


def scale_target(obj: dict) -> tuple[str, str, str]:
    """(API group, kind, name) a ScaledObject or an autoscaling/v2 HPA scales (KEDA's defaults filled in)."""
    ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
    api_version = ref.get("apiVersion") or "apps/v1"
    group = api_version.split("/")[0] if "/" in api_version else ""
    return group, ref.get("kind") or "Deployment", str(ref.get("name") or "")


def replica_bounds(obj: dict) -> tuple[int, int]:
    """(minReplicaCount, maxReplicaCount) of a ScaledObject, KEDA's defaults filled in."""
    spec = obj.get("spec") or {}
    low, high = spec.get("minReplicaCount"), spec.get("maxReplicaCount")
    return (DEFAULT_MIN_REPLICAS if low is None else int(low)), (DEFAULT_MAX_REPLICAS if high is None else int(high))


def paused_replicas(obj: dict) -> int | None:
    """The count a ScaledObject is paused at (annotation paused-replicas); None when not paused that way."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(PAUSED_REPLICAS)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def planner_query(*, pool_namespace: str, pool: str, role: str) -> str:
    """The PromQL that returns the planner's desired replicas of one role of one InferencePool as one element.

    max() collapses duplicates (two Prometheus jobs scraping one Pushgateway) to one
    element and, were two planners to publish for one pool, leans toward more replicas.
    """
    return f'max({GAUGE}{{inference_pool_namespace="{pool_namespace}",inference_pool="{pool}",role="{role}"}})'


def _matchers(query: str) -> dict[str, str]:
    """The equality matchers on the planner's gauge in a query ({} when it does not read the gauge)."""
    match = re.search(re.escape(GAUGE) + r"\s*\{([^}]*)\}", query)
    if match is None:
        return {}
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', match.group(1)))


def planner_trigger_problem(obj: dict, *, pool_namespace: str, pool: str, role: str) -> str | None:
    """Why a ScaledObject does not apply exactly the planner's desired replicas of pool/role; None when it does.

    It must hold one trigger (the HPA takes the largest answer of several), of type
    prometheus, metricType AverageValue, threshold 1, whose query reads the planner's
    gauge for this pool and role.
    """
    triggers = (obj.get("spec") or {}).get("triggers") or []
    described = "; ".join(
        f"{t.get('name') or t.get('type')}: {' '.join(str((t.get('metadata') or {}).get('query', t.get('type'))).split())}"
        for t in triggers)
    if not any(GAUGE in str((t.get("metadata") or {}).get("query", "")) for t in triggers):
        return f"its triggers read another metric ({described or 'none'}), not the planner's {GAUGE}"
    if len(triggers) != 1:
        return f"it has {len(triggers)} triggers ({described}): the HPA applies the largest answer, not the planner's"
    (trigger,) = triggers
    meta = trigger.get("metadata") or {}
    if trigger.get("type") != "prometheus":
        return f"its trigger is of type {trigger.get('type')!r}, expected prometheus"
    if (trigger.get("metricType") or "AverageValue") != "AverageValue":
        return f"its trigger's metricType is {trigger.get('metricType')!r}, expected AverageValue"
    try:
        threshold = float(meta.get("threshold"))
    except (TypeError, ValueError):
        threshold = None
    if threshold != 1.0:
        return f"its trigger's threshold is {meta.get('threshold')!r}, expected \"1\" (one replica per unit of the gauge)"
    want = {"inference_pool_namespace": pool_namespace, "inference_pool": pool, "role": role}
    have = _matchers(str(meta.get("query", "")))
    wrong = {k: have.get(k) for k, v in want.items() if have.get(k) != v}
    if wrong:
        return (f"its query reads the planner's gauge for {wrong} instead of {dict((k, want[k]) for k in wrong)}: "
                f"{' '.join(str(meta.get('query')).split())}")
    return None


def behavior_tolerance(obj: dict, direction: str) -> float:
    """The HPA tolerance KEDA's HPA uses for `direction` (scaleUp, scaleDown): the ScaledObject's, else 10%."""
    behavior = ((((obj.get("spec") or {}).get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {})
                .get("behavior") or {})
    value = (behavior.get(direction) or {}).get("tolerance")
    return HPA_DEFAULT_TOLERANCE if value is None else float(value)


def query_value(result: list[dict], *, ignore_null_values: bool = True, source: str = "query") -> float | None:
    """The value KEDA's prometheus scaler reads from an instant query's result (Prometheus' /api/v1/query data).

    One element: its value. None: no element and ignoreNullValues false (KEDA reports an
    error and the HPA keeps the replicas). ValueError for several elements, as KEDA raises.
    """
    if not result:
        return 0.0 if ignore_null_values else None
    if len(result) > 1:
        raise ValueError(f"{source}: prometheus query returned {len(result)} elements; KEDA needs one "
                         f"(wrap it in an aggregation such as max())")
    return float(result[0]["value"][1])


def keda_replicas(value: float, *, threshold: float, current: int, min_replicas: int, max_replicas: int,
                  tolerance_up: float = HPA_DEFAULT_TOLERANCE, tolerance_down: float = HPA_DEFAULT_TOLERANCE,
                  activation_threshold: float = 0.0) -> int:
    """Replicas KEDA's HPA asks for an AverageValue trigger at `value` (its stabilization windows aside).

    ceil(value / threshold) unless value / (threshold * current) is within the tolerance of 1
    (then current), clamped to [max(min_replicas, 1), max_replicas]; 0 when min_replicas is 0
    and the value is at or below activation_threshold (KEDA deactivates the target).
    """
    if min_replicas == 0 and value <= activation_threshold:
        return 0
    wanted = math.ceil(value / threshold)
    if current > 0:
        ratio = value / (threshold * current)
        if (ratio > 1 and ratio - 1 <= tolerance_up) or (ratio < 1 and 1 - ratio <= tolerance_down) or ratio == 1:
            wanted = current
    return min(max(wanted, max(min_replicas, 1)), max_replicas)
