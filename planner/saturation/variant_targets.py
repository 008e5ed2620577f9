"""Per-variant guardrail targets: cost-aware +1 / -1 on a stable model, preserved while in transition.

A model has variants (the same model on different accelerators or configs),
each with a cost. With the model stable, a scale-up goes to the cheapest
variant without pending pods and a scale-down to the most expensive one that
keeps a replica; while any variant is mid-transition (a previous target not
reached, or pods not all reporting metrics) no new decision is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planner.config import SaturationThresholds
from planner.saturation.analysis import SaturationAnalysis, analyze_saturation
from planner.types import PodMetrics, is_number

VariantAction = Literal["scale_up", "scale_down", "no_change", "preserved"]
DEFAULT_VARIANT_COST = 10.0


@dataclass(frozen=True)
class VariantState:
    """One variant's replica counts, as the connector reports them.

    cost: cost per replica (any unit, compared between variants).
    desired_replicas: the target a previous run set and the environment has
        not reached yet; None or 0 means no target in flight (WVA convention).
    pending_replicas: pods that exist but are not ready yet.
    """

    name: str
    current_replicas: int
    cost: float = DEFAULT_VARIANT_COST
    desired_replicas: int | None = None
    pending_replicas: int = 0
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        for name in ("current_replicas", "pending_replicas", "min_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"variant {self.name!r}: {name} must be an integer >= 0, got {value!r}")
        if self.desired_replicas is not None and self.desired_replicas < 0:
            raise ValueError(
                f"variant {self.name!r}: desired_replicas must be >= 0 or None, got {self.desired_replicas}"
            )
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"variant {self.name!r}: max_replicas {self.max_replicas} < min_replicas {self.min_replicas}"
            )
        if not is_number(self.cost) or self.cost < 0:
            raise ValueError(f"variant {self.name!r}: cost must be a finite number >= 0, got {self.cost!r}")

    @property
    def has_target_in_flight(self) -> bool:
        return self.desired_replicas not in (None, 0) and self.desired_replicas != self.current_replicas

    def clamp(self, replicas: int) -> int:
        upper = replicas if self.max_replicas is None else min(replicas, self.max_replicas)
        return max(self.min_replicas, upper)


@dataclass(frozen=True)
class VariantTarget:
    """The guardrail's target for one variant and why."""

    name: str
    current_replicas: int
    target_replicas: int
    action: VariantAction
    reason: str


@dataclass(frozen=True)
class ModelSaturation:
    """Analysis plus per-variant targets for one model."""

    analysis: SaturationAnalysis
    in_transition: bool
    transition_reasons: tuple[str, ...]
    targets: tuple[VariantTarget, ...]

    @property
    def total_current(self) -> int:
        return sum(t.current_replicas for t in self.targets)

    @property
    def total_target(self) -> int:
        return sum(t.target_replicas for t in self.targets)

    def target(self, name: str) -> VariantTarget:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(f"no variant {name!r}; have {[t.name for t in self.targets]}")


def transition_reasons(analysis: SaturationAnalysis, variants: Sequence[VariantState]) -> tuple[str, ...]:
    """Why the model is mid-transition (empty: stable).

    A variant is transitioning if a previous target is still in flight
    (desired not 0/None and != current) or its reporting replicas != current.
    """
    reasons = []
    for v in variants:
        if v.has_target_in_flight:
            reasons.append(f"variant {v.name}: desired {v.desired_replicas} != current {v.current_replicas}")
        va = analysis.variant(v.name)
        reporting = va.reporting_replicas if va else 0
        if reporting != v.current_replicas:
            reasons.append(f"variant {v.name}: {reporting} of {v.current_replicas} replicas report metrics")
    return tuple(reasons)


def _cost_order(v: VariantState) -> tuple[float, str]:
    return (v.cost, v.name)


def saturation_targets(*, analysis: SaturationAnalysis, variants: Sequence[VariantState]) -> ModelSaturation:
    """Per-variant targets: preserve while in transition, else cost-aware +1 / -1, clamped.

    Scale-up: +1 on the cheapest variant without pending pods and below its max
    (ties: alphabetically first). Scale-down (when safe): -1 on the most
    expensive variant whose target stays >= max(1, min) (ties: alphabetically
    last). Targets start from the replicas reporting metrics, which equal
    current when the model is stable.
    """
    if not variants:
        raise ValueError("saturation: a model needs at least one variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"saturation: variant names must be unique, got {names}")
    unknown = sorted({r.variant for r in analysis.replicas} - set(names))
    if unknown:
        pods = [r.pod for r in analysis.replicas if r.variant in unknown]
        raise ValueError(f"saturation: pods {pods} belong to unknown variant(s) {unknown}; known: {sorted(names)}")

    blocked = transition_reasons(analysis, variants)
    if blocked:
        targets = []
        for v in variants:
            if v.has_target_in_flight:
                targets.append(VariantTarget(v.name, v.current_replicas, v.desired_replicas, "preserved",
                                             "model in transition: desired target preserved"))
            else:
                targets.append(VariantTarget(v.name, v.current_replicas, v.current_replicas, "preserved",
                                             "model in transition: current replicas preserved"))
        return ModelSaturation(analysis, True, blocked, tuple(targets))

    ready = {v.name: v.current_replicas for v in variants}
    chosen: str | None = None
    action: VariantAction = "no_change"
    note = analysis.message
    if analysis.should_scale_up:
        eligible = [
            v for v in variants
            if v.pending_replicas == 0 and (v.max_replicas is None or ready[v.name] + 1 <= v.max_replicas)
        ]
        if eligible:
            chosen, action = min(eligible, key=_cost_order).name, "scale_up"
            ready[chosen] += 1
        else:
            note = f"{analysis.message}; no eligible variant (all pending or at max)"
    elif analysis.scale_down_safe:
        eligible = [v for v in variants if ready[v.name] - 1 >= max(1, v.min_replicas)]
        if eligible:
            chosen, action = max(eligible, key=_cost_order).name, "scale_down"
            ready[chosen] -= 1
        else:
            note = f"{analysis.message}; no variant above its minimum"

    targets = []
    for v in variants:
        target = v.clamp(ready[v.name])
        if v.name == chosen:
            what = "cheapest eligible" if action == "scale_up" else "most expensive eligible"
            reason = f"{what} variant (cost {v.cost:g}): {note}"
            targets.append(VariantTarget(v.name, v.current_replicas, target, action, reason))
        else:
            targets.append(VariantTarget(v.name, v.current_replicas, target, "no_change", note))
    return ModelSaturation(analysis, False, (), tuple(targets))


def analyze_model(
    *, pods: Sequence[PodMetrics], variants: Sequence[VariantState], thresholds: SaturationThresholds
) -> ModelSaturation:
    """The general multi-variant guardrail: analysis then per-variant targets."""
    return saturation_targets(analysis=analyze_saturation(pods=pods, thresholds=thresholds), variants=variants)



__all__ = [
    "ModelSaturation",
    "VariantState",
    "VariantTarget",
    "analyze_model",
    "saturation_targets",
    "transition_reasons",
]
