"""What one deployment asks of a shared GPU budget: its planner's targets, its floor, and what fewer would cost.

A `DeploymentDemand` is plain data, so the arbitration (planner.fleet.arbitrate) can be tested with hand
tables; `demand_from_plan` builds one from a deployment's own planner run (planner.pipeline.PlanResult)
and its profile, through the loss model (planner.fleet.loss).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.config import PlannerConfig
from planner.fleet.loss import itl_met_fracs, ttft_met_fracs
from planner.latency.profile import EngineProfile
from planner.latency.ttft_view import TtftView, ttft_view_of
from planner.pipeline import PlanResult
from planner.types import POOLS, Pool, Targets

# Which SLA target each pool's replicas decide, for messages.
POOL_TARGET = {"prefill": "TTFT", "decode": "ITL"}


@dataclass(frozen=True)
class DeploymentDemand:
    """One deployment's claim on the budget.

    wanted: replicas per pool its own planner decided (the most it is granted).
    min_replicas: the fewest per pool (its decision bounds; above `wanted` they count as `wanted`).
    gpus_per_replica: GPUs one replica of each pool uses.
    priority: weight of its expected loss (>= 0; 2 counts each missed request twice).
    requests: requests the loss counts over (the interval's load its planner sized for).
    met_frac: per pool, the share of requests meeting that pool's target (prefill: TTFT, decode: ITL) with
        0, 1, ... replicas, at least up to `wanted` (counts past the end take the last value).
    A request meets the SLA when it meets both: the expected loss at (p, d) is
    requests x (1 - met_frac[prefill][p] x met_frac[decode][d]).
    """

    name: str
    wanted: Targets
    min_replicas: Targets
    gpus_per_replica: Targets
    priority: float = 1.0
    requests: float = 0.0
    met_frac: Mapping[Pool, tuple[float, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"deployment {self.name!r}"
        if not (isinstance(self.priority, (int, float)) and math.isfinite(self.priority) and self.priority >= 0):
            raise ValueError(f"{where}: priority must be a number >= 0, got {self.priority!r}")
        if not (math.isfinite(self.requests) and self.requests >= 0):
            raise ValueError(f"{where}: requests must be >= 0, got {self.requests!r}")
        for pool in POOLS:
            for what, low in (("wanted", 0), ("min_replicas", 0), ("gpus_per_replica", 1)):
                v = getattr(self, what).get(pool)
                if isinstance(v, bool) or not isinstance(v, int) or v < low:
                    raise ValueError(f"{where}: {what}[{pool}] must be an integer >= {low}, got {v!r}")
            fracs = self.met_frac.get(pool, ())
            if fracs and (len(fracs) < self.wanted[pool] + 1 or any(not 0.0 <= f <= 1.0 for f in fracs)):
                raise ValueError(f"{where}: met_frac[{pool}] needs shares in 0..1 for 0..{self.wanted[pool]} "
                                 f"replicas, got {list(fracs)}")

    @property
    def floor(self) -> Targets:
        """The fewest replicas per pool: min_replicas, never above wanted."""
        return {p: min(self.min_replicas[p], self.wanted[p]) for p in POOLS}

    def gpus(self, targets: Mapping[Pool, int]) -> int:
        return sum(targets[p] * self.gpus_per_replica[p] for p in POOLS)

    def met(self, pool: Pool, replicas: int) -> float:
        """Share of requests meeting the pool's target with `replicas` (1.0 without a loss table)."""
        fracs = self.met_frac.get(pool, ())
        if not fracs:
            return 1.0
        return fracs[min(replicas, len(fracs) - 1)]

    def miss_frac(self, targets: Mapping[Pool, int]) -> float:
        """Expected share of requests missing the SLA (either target) at these targets."""
        return 1.0 - self.met("prefill", targets["prefill"]) * self.met("decode", targets["decode"])

    def expected_loss(self, targets: Mapping[Pool, int]) -> float:
        """Expected requests missing the SLA at these targets."""
        return self.requests * self.miss_frac(targets)


def demand_from_plan(
    name: str, plan: PlanResult, *, cfg: PlannerConfig, profile: EngineProfile, priority: float = 1.0,
    ttft_view: TtftView | None = None,
) -> DeploymentDemand:
    """A deployment's demand from its planner's run: the decision's targets, its bounds, the fleet's GPUs per
    replica, and the loss model at the load its sizing used (without a forecast: no loss table, so it only
    keeps what others do not need).

    cfg: the configuration the plan ran with (SLO, sizing spreads, decision bounds). ttft_view: prefill's
    single-request TTFT as the plan used it (planner.latency.ttft_view); None: the profile's.
    """
    d = plan.decision
    wanted = {"prefill": d.prefill_replicas, "decode": d.decode_replicas}
    mins = {p: getattr(cfg.decision, p).min_replicas for p in POOLS}
    gpus = {p: getattr(plan.fleet, p).gpus_per_replica for p in POOLS}
    if not plan.sizing or plan.forecast is None:
        return DeploymentDemand(name, wanted, mins, gpus, priority=priority,
                                notes=("no forecast this run: no expected loss",))
    pre, dec = plan.sizing["prefill"].numbers, plan.sizing["decode"].numbers
    sizing = cfg.sizing
    shape = plan.forecast.length_shape if sizing.length_cv == "measured" else None
    isl_cv = shape.isl_cv if shape is not None else sizing.isl_cv
    context_cv = shape.decode_context_cv if shape is not None else sizing.decode_context_cv
    rps = float(pre.get("load_rps", 0.0))
    met = {
        "prefill": ttft_met_fracs(
            rps=rps, isl_tokens=float(pre.get("isl_tokens", 0.0)), isl_cv=isl_cv,
            correction=float(pre.get("prefill_correction", 1.0)), ttft_target_ms=cfg.slo.ttft_ms,
            ttft=ttft_view_of(profile.prefill, ttft_view), arrival_cv=sizing.prefill_arrival_cv,
            service_cv=sizing.prefill_service_cv, up_to=wanted["prefill"]),
        "decode": itl_met_fracs(
            profile.decode, rps=float(dec.get("load_rps", 0.0)), osl_tokens=float(dec.get("osl_tokens", 0.0)),
            context_tokens=float(dec.get("context_tokens", 0.0)), correction=float(dec.get("decode_correction", 1.0)),
            itl_target_ms=cfg.slo.itl_ms, context_cv=context_cv, arrival_cv=sizing.prefill_arrival_cv,
            up_to=wanted["decode"]),
    }
    return DeploymentDemand(name, wanted, mins, gpus, priority=priority,
                            requests=float(pre.get("requests", 0.0)), met_frac=met)
