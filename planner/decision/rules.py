"""Decision rules: each moves the per-pool replica targets and says why.

Every rule is a pure function over the targets that returns the new targets
and the reasons it changed them (a `Step`), so each is table-testable alone.
The order they run in is `planner.decision.decide`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.config import DecisionConfig, PoolBounds
from planner.saturation.guardrail import PoolSaturation
from planner.types import POOLS, Pool, PoolSizing, Reason, ReasonCode, Step, Targets


def _bounds(cfg: DecisionConfig, pool: Pool) -> PoolBounds:
    return cfg.prefill if pool == "prefill" else cfg.decode


def sizing_targets(*, sizing: Mapping[Pool, PoolSizing], current: Targets, missing: Sequence[str]) -> Step:
    """Start from the SLA sizing; where load data or the sizing is missing, from current replicas.

    Holding at current makes missing data neutral: nothing shrinks because of
    it, and the guardrail can still raise the target.
    """
    targets: Targets = {}
    reasons: list[Reason] = []
    for pool in POOLS:
        s = sizing.get(pool)
        if missing or s is None:
            what = ", ".join(missing) if missing else "no sizing for this pool"
            targets[pool] = current[pool]
            reasons.append(
                Reason(ReasonCode.HOLD_MISSING_METRICS, pool,
                       f"{pool}: load data missing ({what}), holding {current[pool]} replicas",
                       {"current_replicas": float(current[pool])})
            )
            continue
        if not isinstance(s.replicas, int) or s.replicas < 0:
            raise ValueError(f"decide: sizing for {pool} must be an integer >= 0 replicas, got {s.replicas!r}")
        targets[pool] = s.replicas
        numbers = {k: float(v) for k, v in s.numbers.items()}
        numbers["sizing_replicas"] = float(s.replicas)
        reasons.append(
            Reason(ReasonCode.SLA_SIZING, pool, f"{pool}: SLA sizing {s.replicas} replicas. {s.message}".strip(),
                   numbers)
        )
    return targets, reasons


def hold_on_partial_metrics(targets: Targets, *, current: Targets, partial: Reason | None) -> Step:
    """With partial metrics (partial_metrics_gate's reason), raise every target below current to current.

    A target above current stands: the load of the sources that reported is a
    lower bound of the whole.
    """
    if partial is None:
        return dict(targets), []
    out = {p: max(targets[p], current[p]) for p in POOLS}
    numbers = dict(partial.numbers)
    numbers.update({f"{p}_sized_replicas": float(targets[p]) for p in POOLS})
    numbers.update({f"{p}_current_replicas": float(current[p]) for p in POOLS})
    return out, [Reason(partial.code, None, partial.message, numbers)]


def apply_guardrail(
    targets: Targets,
    *,
    saturation: Mapping[Pool, PoolSaturation] | None,
    current: Targets,
    idle_scale_to_zero: bool = False,
) -> Step:
    """Raise each target to the guardrail's floor (scale-up, veto or limit of a scale-down).

    idle_scale_to_zero: no requests arrived and scale-to-zero is allowed; a
        target of 0 then stands (WVA's guardrail alone never removes the last
        replica).
    """
    if saturation is None:
        return dict(targets), []
    out = dict(targets)
    reasons: list[Reason] = []
    for pool in POOLS:
        sat = saturation.get(pool)
        if sat is None:
            continue
        if sat.current_replicas != current[pool]:
            raise ValueError(
                f"decide: saturation for {pool} saw {sat.current_replicas} replicas, fleet says {current[pool]}"
            )
        numbers = dict(sat.numbers)
        numbers["requested_replicas"] = float(targets[pool])
        reporting = sat.model.analysis.reporting_replicas
        if reporting < sat.current_replicas:
            reasons.append(
                Reason(ReasonCode.HOLD_MISSING_METRICS, pool,
                       f"{pool}: {reporting} of {sat.current_replicas} replicas report saturation metrics, "
                       "no scale-down on their account", numbers)
            )
        if sat.signal == "transition":
            reasons.append(Reason(ReasonCode.TRANSITION_IN_PROGRESS, pool, sat.message, numbers))
        floor = sat.floor_replicas
        if targets[pool] >= floor or (idle_scale_to_zero and targets[pool] == 0):
            continue
        out[pool] = floor
        if floor > current[pool]:
            code, what = ReasonCode.SATURATION_SCALE_UP, f"raised {targets[pool]} -> {floor}"
        elif floor == current[pool]:
            code, what = ReasonCode.SATURATION_VETO_SCALE_DOWN, f"scale-down to {targets[pool]} vetoed, keeping {floor}"
        else:
            code, what = ReasonCode.SATURATION_VETO_SCALE_DOWN, f"scale-down limited to {floor} (asked {targets[pool]})"
        reasons.append(Reason(code, pool, f"{pool}: saturation guardrail {what}: {sat.message}", numbers))
    return out, reasons


def clamp_to_bounds(targets: Targets, *, cfg: DecisionConfig) -> Step:
    """Clamp each target to its pool's [min_replicas, max_replicas]."""
    out = dict(targets)
    reasons: list[Reason] = []
    for pool in POOLS:
        b = _bounds(cfg, pool)
        t = targets[pool]
        numbers = {"requested_replicas": float(t), "min_replicas": float(b.min_replicas),
                   "max_replicas": float(b.max_replicas)}
        if t < b.min_replicas:
            out[pool] = b.min_replicas
            reasons.append(Reason(ReasonCode.CLAMPED_MIN, pool, f"{pool}: {t} raised to min {b.min_replicas}", numbers))
        elif t > b.max_replicas:
            out[pool] = b.max_replicas
            reasons.append(Reason(ReasonCode.CLAMPED_MAX, pool, f"{pool}: {t} capped at max {b.max_replicas}", numbers))
    return out, reasons


def limit_step(targets: Targets, *, current: Targets, max_step: int | None) -> Step:
    """Move each pool at most max_step replicas from current (the bounds are re-applied after)."""
    out = dict(targets)
    reasons: list[Reason] = []
    if max_step is None:
        return out, reasons
    for pool in POOLS:
        t, c = targets[pool], current[pool]
        stepped = min(max(t, c - max_step), c + max_step)
        if stepped != t:
            out[pool] = stepped
            reasons.append(
                Reason(ReasonCode.MAX_STEP, pool,
                       f"{pool}: {c} -> {t} limited to {stepped} (max step {max_step} per interval)",
                       {"requested_replicas": float(t), "current_replicas": float(c), "max_step_replicas": float(max_step)})
            )
    return out, reasons



__all__ = ["apply_guardrail", "clamp_to_bounds", "hold_on_partial_metrics", "limit_step", "sizing_targets"]
