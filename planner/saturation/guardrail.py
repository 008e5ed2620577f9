"""Saturation guardrail: each pool's verdict for the decision step, as llm-d's WVA analyzer.

A replica is saturated when its KV-cache usage or its queue reaches a
threshold. Spare capacity (threshold - usage) is averaged over the replicas
that are not saturated; too little spare on average calls for one more
replica, and one fewer is safe only if the same load spread over the
remaining replicas still leaves the spare triggers free.

A model has variants (the same model on different accelerators or configs),
each with a cost. With the model stable, a scale-up goes to the cheapest
variant without pending pods and a scale-down to the most expensive one that
keeps a replica; while any variant is mid-transition (a previous target not
reached, or pods not all reporting metrics) no new decision is made.

Departures from WVA, all toward keeping capacity:
- a replica whose metrics are missing (None, NaN, inf) is never counted as
  spare capacity; it is "missing", which also puts the model in transition;
- a replica with one metric past its threshold is saturated even if the
  other metric is missing;
- a scale-up skips variants already at their max (WVA picks them, then clamps
  the +1 away);
- `max_safe_removals` extends WVA's one-replica N/(N-1) check to "how many
  replicas could go": the decision step may shrink by that many at most.

In the prefill/decode planner each pool is analysed as its own model
(`analyze_pool`, `analyze_fleet`), usually with a single variant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from planner.config import DecisionConfig, SaturationConfig, SaturationThresholds
from planner.types import POOLS, FleetState, Observation, PodMetrics, Pool, PoolState
from planner.saturation.variant_targets import ModelSaturation, VariantState, analyze_model

PoolSignal = Literal["scale_up", "scale_down_safe", "steady", "no_data", "transition"]


@dataclass(frozen=True)
class PoolSaturation:
    """The guardrail's verdict on one pool, as the decision step uses it.

    target_replicas: WVA's own one-step target for the pool (sum over variants).
    floor_replicas: the fewest replicas the guardrail accepts this interval: above
        current when it wants a scale-up, current when it vetoes any scale-down,
        current - max_safe_removals when shrinking is safe, the preserved
        targets while in transition.
    """

    pool: Pool
    signal: PoolSignal
    current_replicas: int
    target_replicas: int
    floor_replicas: int
    model: ModelSaturation
    message: str
    numbers: dict[str, float] = field(default_factory=dict)


def analyze_pool(
    *,
    pool: Pool,
    pods: Sequence[PodMetrics],
    state: PoolState,
    thresholds: SaturationThresholds,
    desired_replicas: int | None = None,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    variants: Sequence[VariantState] | None = None,
) -> PoolSaturation:
    """Analyse one prefill or decode pool as its own model.

    pods: the pool's replicas (others are ignored, so the whole observation can
        be passed). Without `variants` the pool is one variant (named after
        its pods' variant label) built from `state`: pending = current - ready.
    desired_replicas: the pool target a previous decision set and has not
        reached (None when none is in flight).
    """
    mine = [p for p in pods if p.pool == pool]
    current = state.current_replicas
    if variants is None:
        labels = sorted({p.variant for p in mine}) or ["default"]
        if len(labels) > 1:
            raise ValueError(
                f"saturation: pool {pool} has pods of variants {labels}; pass `variants` with their counts"
            )
        variants = [
            VariantState(
                name=labels[0],
                current_replicas=current,
                desired_replicas=desired_replicas,
                pending_replicas=max(0, current - state.ready_replicas),
                min_replicas=min_replicas,
                max_replicas=max_replicas,
            )
        ]
    elif sum(v.current_replicas for v in variants) != current:
        raise ValueError(
            f"saturation: pool {pool} variants sum to {sum(v.current_replicas for v in variants)} replicas, "
            f"pool state says {current}"
        )
    model = analyze_model(pods=mine, variants=variants, thresholds=thresholds)
    a = model.analysis
    target = model.total_target
    if model.in_transition:
        signal: PoolSignal = "transition"
        floor = target
        message = "in transition, targets preserved: " + "; ".join(model.transition_reasons)
    elif a.signal == "no_data":
        signal, floor, message = "no_data", current, f"{a.message}: no scale-down"
    elif a.signal == "scale_up":
        signal, floor, message = "scale_up", max(current, target), a.message
    elif a.signal == "scale_down_safe":
        lowest = sum(max(1, v.min_replicas) for v in variants)
        signal, floor, message = "scale_down_safe", max(lowest, current - a.max_safe_removals), a.message
        floor = min(floor, current)
    else:
        signal, floor, message = "steady", current, a.message
    numbers = dict(a.numbers)
    numbers.update(current_replicas=current, target_replicas=target, floor_replicas=floor)
    return PoolSaturation(
        pool=pool,
        signal=signal,
        current_replicas=current,
        target_replicas=target,
        floor_replicas=floor,
        model=model,
        message=f"{pool}: {message}",
        numbers={k: float(v) for k, v in numbers.items()},
    )


def desired_in_flight(*, fleet: FleetState, pool: Pool, now_s: float, wait_for_previous_s: float) -> int | None:
    """The previous decision's target for `pool` while it is not done and not timed out, else None.

    now_s: the run's clock, seconds; wait_for_previous_s: how long a target
    counts as in flight, seconds.
    """
    last = fleet.last_decision
    if last is None or last.done or now_s - last.decided_at_s >= wait_for_previous_s:
        return None
    return last.prefill_replicas if pool == "prefill" else last.decode_replicas


def analyze_fleet(
    *,
    obs: Observation,
    fleet: FleetState,
    saturation_cfg: SaturationConfig,
    decision_cfg: DecisionConfig,
    model_id: str,
    namespace: str,
    now_s: float,
    variants: Mapping[Pool, Sequence[VariantState]] | None = None,
) -> dict[Pool, PoolSaturation] | None:
    """Both pools' guardrail verdicts for `decide`; None when the guardrail is disabled.

    Thresholds come from the 'modelID#namespace' override or the default.
    """
    if not saturation_cfg.enabled:
        return None
    thresholds = saturation_cfg.for_model(model_id, namespace)
    out: dict[Pool, PoolSaturation] = {}
    for pool in POOLS:
        bounds = getattr(decision_cfg, pool)
        out[pool] = analyze_pool(
            pool=pool,
            pods=obs.pods,
            state=getattr(fleet, pool),
            thresholds=thresholds,
            desired_replicas=desired_in_flight(
                fleet=fleet, pool=pool, now_s=now_s, wait_for_previous_s=decision_cfg.wait_for_previous_s
            ),
            min_replicas=bounds.min_replicas,
            max_replicas=bounds.max_replicas,
            variants=None if variants is None else variants.get(pool),
        )
    return out



__all__ = ["PoolSaturation", "analyze_fleet", "analyze_pool", "desired_in_flight"]
