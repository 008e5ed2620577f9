"""llm-d's autoscaling objects as our run configuration: KEDA ScaledObjects and WVA VariantAutoscalings.
Pure functions, no I/O.

A ScaledObject scales one role's model servers (the role from its `llm-d.ai/role`
label, else its target's name): its replica bounds become that role's
`planner.decision.<role>` bounds, its polling interval the planner's adjustment
interval, its HPA's scale-down stabilization window ours. Its triggers (EPP queue,
in-flight tokens, KV usage) have no equivalent: the planner sizes from the SLA and
the profile, so each is reported. A VariantAutoscaling (WVA, llmd.ai/v1alpha1)
gives the model id; its accelerator, cost and performance parameters are reported.
An autoscaling/v2 HorizontalPodAutoscaler (WVA's legacy actuator, on the External
metric wva_desired_replicas) gives bounds and stabilization the same way.
The target itself becomes `connector: {kind: llmd}` once the InferencePool that
selects it is named (`inference_pool`).
"""

from __future__ import annotations

import re

from connectors.kube import keda
from connectors.migrate.result import Migration, MigrationError

KEDA_DEFAULT_POLLING_S = 30
HPA_DEFAULT_SCALE_DOWN_WINDOW_S = 300


def role_of(obj: dict) -> str | None:
    """prefill or decode: the object's llm-d.ai/role label, else a role word in its target's name."""
    label = ((obj.get("metadata") or {}).get("labels") or {}).get("llm-d.ai/role")
    if label in ("prefill", "decode"):
        return label
    name = keda.scale_target(obj)[2]
    found = {r for r in ("prefill", "decode") if re.search(rf"(^|[-_.]){r}([-_.]|$)", name)}
    return found.pop() if len(found) == 1 else None


def from_llmd_autoscalers(objects: list[dict], *, inference_pool: str | None = None,
                          source: str = "llm-d") -> Migration:
    """Our decision bounds, cadence, stabilization, model and connector from ScaledObjects and VariantAutoscalings."""
    out = Migration(config={})
    decision: dict = {}
    planner: dict = {}
    polling: list[tuple[str, int]] = []
    windows: list[tuple[str, float]] = []
    namespaces: set[str] = set()
    used = 0
    for obj in objects:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in ("ScaledObject", "VariantAutoscaling", "HorizontalPodAutoscaler"):
            out.skip(f"{source}: {kind or type(obj).__name__}", None,
                     "not a ScaledObject, VariantAutoscaling or HorizontalPodAutoscaler: ignored")
            continue
        used += 1
        name = f"{kind} {keda.name_of(obj)}"
        role = role_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace")
        if namespace:
            namespaces.add(namespace)
        target = "/".join(keda.scale_target(obj)[1:])
        if kind == "VariantAutoscaling":
            _variant(obj, name, planner, out)
            out.note(f"{name} targets {target} ({role or 'role unknown'}): WVA's decision for it is now the planner's")
            continue
        if role is None:
            out.skip(name, target, "no llm-d.ai/role label and no prefill/decode in its target's name: which role "
                     "its bounds are for is unknown")
        else:
            _bounds(obj, name, role, decision, out)
        spec = obj.get("spec") or {}
        if kind == "HorizontalPodAutoscaler":
            behavior = spec.get("behavior") or {}
            _hpa_metrics(spec, name, out)
        else:
            polling.append((name, int(spec.get("pollingInterval") or KEDA_DEFAULT_POLLING_S)))
            behavior = (((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior")
                        or {})
        down = (behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")
        windows.append((name, float(HPA_DEFAULT_SCALE_DOWN_WINDOW_S if down is None else down)))
        up = (behavior.get("scaleUp") or {}).get("stabilizationWindowSeconds")
        if up:
            out.skip(f"{name}.behavior.scaleUp.stabilizationWindowSeconds", up,
                     "the planner scales up as soon as its sizing asks (it has no scale-up window)")
        for direction in ("scaleUp", "scaleDown"):
            if (behavior.get(direction) or {}).get("policies"):
                out.skip(f"{name}.behavior.{direction}.policies", behavior[direction]["policies"],
                         "per-period limits: planner.decision.max_step_replicas is the nearest (one limit, both ways)")
        if spec.get("cooldownPeriod") is not None:
            out.skip(f"{name}.cooldownPeriod", spec["cooldownPeriod"], "applies to KEDA's scale to zero only")
        for trigger in spec.get("triggers") or []:
            meta = trigger.get("metadata") or {}
            query = " ".join(str(meta.get("query", "")).split())
            if keda.GAUGE in query:
                out.note(f"{name}: its trigger already applies the planner's gauge: use connector.actuation keda")
                continue
            out.skip(f"{name}.triggers.{trigger.get('name') or trigger.get('type')}",
                     f"{query or trigger.get('type')} (threshold {meta.get('threshold')})",
                     "the planner sizes each role from the SLA and the profile, not from this signal")
    if not used:
        raise MigrationError(f"{source}: no KEDA ScaledObject, WVA VariantAutoscaling or HorizontalPodAutoscaler in it")
    if polling:
        chosen = min(s for _, s in polling)
        planner["adjustment_interval_s"] = float(chosen)
        out.note(f"planner.adjustment_interval_s {chosen} s: the shortest pollingInterval "
                 f"({', '.join(f'{n} {s} s' for n, s in polling)}); the planner decides once per interval")
    if windows:
        window_s = max(s for _, s in windows)
        decision["scale_down_stabilization_s"] = window_s
        out.note(f"planner.decision.scale_down_stabilization_s {window_s:g} s: the longest HPA scale-down window "
                 f"({', '.join(f'{n} {s:g} s' for n, s in windows)}; the HPA's default is 300 s)")
    if decision:
        planner["decision"] = decision
    out.config = {"planner": planner} if planner else {}
    _connector(out, inference_pool=inference_pool, namespaces=namespaces)
    return out


def _bounds(obj: dict, name: str, role: str, decision: dict, out: Migration) -> None:
    spec = obj.get("spec") or {}
    bounds: dict = {}
    if obj.get("kind") == "HorizontalPodAutoscaler":  # minReplicas defaults to 1, maxReplicas is required
        low_key, high_key, low, high = "minReplicas", "maxReplicas", spec.get("minReplicas", 1), spec.get("maxReplicas")
    else:
        low_key, high_key = "minReplicaCount", "maxReplicaCount"
        low, high = spec.get(low_key), spec.get(high_key)
    if low is None or int(low) == 0:
        out.skip(f"{name}.{low_key}", low, "0 (KEDA's default): KEDA scales to zero while the trigger is "
                 "inactive; the planner keeps min_replicas 1 (decision.allow_scale_to_zero to follow)")
    else:
        bounds["min_replicas"] = int(low)
    bounds["max_replicas"] = keda.DEFAULT_MAX_REPLICAS if high is None else int(high)
    if high is None:
        out.note(f"{name}: {high_key} unset, KEDA's default {keda.DEFAULT_MAX_REPLICAS}")
    if role in decision:
        raise MigrationError(f"{name}: a second autoscaler for the {role} role: give one per role")
    decision[role] = bounds


def _hpa_metrics(spec: dict, name: str, out: Migration) -> None:
    """Report an HPA's metrics: WVA's desired replicas become the planner's decision; others have no equivalent."""
    for metric in spec.get("metrics") or []:
        kind = str(metric.get("type") or "")
        source = metric.get(kind[:1].lower() + kind[1:]) or {}  # type External -> its `external` block
        metric_name = (source.get("metric") or {}).get("name") or source.get("name") or metric.get("type")
        if metric_name == "wva_desired_replicas":
            out.note(f"{name}: applies WVA's wva_desired_replicas: the planner's decision takes its place "
                     f"(connector kind llmd writes /scale; delete this HPA, or the connector refuses to fight it)")
            continue
        out.skip(f"{name}.metrics.{metric_name}", (source.get("target") or {}),
                 "the planner sizes each role from the SLA and the profile, not from this signal")


def _variant(obj: dict, name: str, planner: dict, out: Migration) -> None:
    spec = obj.get("spec") or {}
    if spec.get("modelID"):
        planner["model_id"] = str(spec["modelID"])
    for key, why in (("acceleratorCount", "GPUs per replica are read from the model servers' pod template"),
                     ("accelerator", "the profile names the accelerator the planner sizes for"),
                     ("variantID", "a WVA label; the planner scales one variant per InferencePool"),
                     ("variantCost", "no cost model: planner.decision.max_gpu_budget caps GPUs"),
                     ("variantProfile", "WVA's queueing-model parameters: the planner sizes from the measured profile"),
                     ("sloClassRef", "set planner.slo (ttft_ms, itl_ms) from that ConfigMap key")):
        if spec.get(key) not in (None, "", {}):
            out.skip(f"{name}.spec.{key}", spec[key], why)


def _connector(out: Migration, *, inference_pool: str | None, namespaces: set[str]) -> None:
    if len(namespaces) > 1:
        raise MigrationError(f"objects from {len(namespaces)} namespaces ({', '.join(sorted(namespaces))}): "
                             f"import one InferencePool's at a time")
    if inference_pool is None:
        out.skip("connector", None, "name the InferencePool whose model servers these scale (--pool NAME) to get "
                 "connector: {kind: llmd, inference_pool: NAME}")
        return
    connector = {"kind": "llmd", "inference_pool": inference_pool}
    if namespaces:
        connector["namespace"] = next(iter(namespaces))
    out.config["connector"] = connector
