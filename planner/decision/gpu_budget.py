"""GPU budget: both pools cut together, proportionally, to fit the configured total GPUs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from planner.config import DecisionConfig
from planner.types import POOLS, Pool, Reason, ReasonCode, Step, Targets


def _proportional_share(
    targets: Targets, *, gpus: Mapping[Pool, int], mins: Mapping[Pool, int], budget: int
) -> dict[Pool, float]:
    """Real-valued replicas: every target times one factor, pools that would drop below min held at min."""
    fixed: set[Pool] = set()
    while True:
        free = [p for p in POOLS if p not in fixed]
        free_budget = budget - sum(mins[p] * gpus[p] for p in fixed)
        free_demand = sum(targets[p] * gpus[p] for p in free)
        factor = free_budget / free_demand if free_demand > 0 else 0.0
        newly = {p for p in free if targets[p] * factor < mins[p]}
        if not newly:
            return {p: (mins[p] if p in fixed else targets[p] * factor) for p in POOLS}
        fixed |= newly


def fit_gpu_budget(
    targets: Targets, *, gpus_per_replica: Mapping[Pool, int], cfg: DecisionConfig
) -> Step:
    """Cut both pools together so their GPUs fit cfg.max_gpu_budget.

    Each target is scaled by one common factor (a pool that would fall below
    its min stays at min and the other absorbs the rest), rounded down, then
    leftover GPUs go back one replica at a time to the pool with the largest
    rounding remainder. No target ever rises; none goes below its min. When the
    mins alone exceed the budget, the pools get their mins and the reason says
    the budget cannot be met.
    """
    budget = cfg.max_gpu_budget
    out = dict(targets)
    if budget is None:
        return out, []
    for pool in POOLS:
        if not isinstance(gpus_per_replica[pool], int) or gpus_per_replica[pool] < 1:
            raise ValueError(f"decide: {pool} gpus_per_replica must be an integer >= 1, got {gpus_per_replica[pool]!r}")
    gpus = {p: gpus_per_replica[p] for p in POOLS}
    mins = {p: min(getattr(cfg, p).min_replicas, targets[p]) for p in POOLS}
    demand = sum(targets[p] * gpus[p] for p in POOLS)
    if demand <= budget:
        return out, []
    numbers = {"max_gpu_budget": float(budget), "requested_gpus": float(demand)}
    numbers.update({f"{p}_requested_replicas": float(targets[p]) for p in POOLS})
    numbers.update({f"{p}_gpus_per_replica": float(gpus[p]) for p in POOLS})
    floor_gpus = sum(mins[p] * gpus[p] for p in POOLS)
    if floor_gpus > budget:
        out = dict(mins)
        numbers["granted_gpus"] = float(floor_gpus)
        return out, [
            Reason(ReasonCode.GPU_BUDGET, None,
                   f"GPU budget {budget} cannot be met: the pool minimums alone need {floor_gpus} GPUs; "
                   f"holding prefill {out['prefill']}, decode {out['decode']}", numbers)
        ]
    share = _proportional_share(targets, gpus=gpus, mins=mins, budget=budget)
    out = {p: max(mins[p], math.floor(share[p])) for p in POOLS}
    while True:
        used = sum(out[p] * gpus[p] for p in POOLS)
        room = [p for p in POOLS if out[p] < targets[p] and used + gpus[p] <= budget]
        if not room:
            break
        best = max(room, key=lambda p: (share[p] - out[p], -POOLS.index(p)))
        out[best] += 1
    granted = sum(out[p] * gpus[p] for p in POOLS)
    numbers["granted_gpus"] = float(granted)
    numbers.update({f"{p}_granted_replicas": float(out[p]) for p in POOLS})
    return out, [
        Reason(ReasonCode.GPU_BUDGET, None,
               f"GPU budget {budget}: requested {demand} GPUs (prefill {targets['prefill']}, decode "
               f"{targets['decode']}), both cut to prefill {out['prefill']}, decode {out['decode']} ({granted} GPUs)",
               numbers)
    ]



__all__ = ["fit_gpu_budget"]
