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
from planner.sizing.pools import lead_intervals
from planner.signals.burst import peak_ratio
from planner.types import POOLS, LoadHistory, Pool, Targets, is_number

# Which SLA target each pool's replicas decide, for messages.
POOL_TARGET = {"prefill": "TTFT", "decode": "ITL"}


@dataclass(frozen=True)
class DeploymentDemand:
    """One deployment's claim on the budget.

    wanted: replicas per pool its own planner decided (the most it is granted).
    min_replicas: the fewest per pool (its decision bounds; above `wanted` they count as `wanted`).
    gpus_per_replica: GPUs one replica of each pool uses.
    priority: weight of its expected loss (>= 0; 2 counts each point of SLA attainment twice).
    requests: the requests it expects next interval (its mean forecast), for messages.
    met_frac: per pool, the share of requests meeting that pool's target (prefill: TTFT, decode: ITL) with
        0, 1, ... replicas, at least up to `wanted` (counts past the end take the last value).
    A request meets the SLA when it meets both: the expected attainment lost at (p, d) is
    miss_frac = 1 - met_frac[prefill][p] x met_frac[decode][d] (expected_loss: that many requests). The
    arbitration weighs attainment, so a small deployment's SLA counts as much as a large one's.
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


# The forecast's uncertainty as three loads: the 3-point Gauss-Hermite rule for a normal, mean +- 1.2247 sd
# with weights 1/6, 2/3, 1/6 (exact for polynomials up to degree 5), sd from the p90 band widened to the horizon.
_GAUSS_HERMITE_3 = ((-1.224744871391589, 1 / 6), (0.0, 2 / 3), (1.224744871391589, 1 / 6))
_Z90 = 1.2815515655446004
# Of the recent window's intervals, this many order statistics (by requests) stand for them.
_RECENT_POINTS = 8
# Weight of the forecast against the recent window's intervals in the load mixture.
FORECAST_WEIGHT = 0.5


@dataclass(frozen=True)
class LoadPoint:
    """One load the loss is averaged over: requests in an interval, mean lengths (tokens), burst ratio, weight."""

    requests: float
    isl_tokens: float
    osl_tokens: float
    peak_ratio: float | None
    weight: float


def load_points(plan: PlanResult, cfg: PlannerConfig) -> list[LoadPoint]:
    """The loads the next intervals may bring, weights summing to 1.

    Half (FORECAST_WEIGHT) the forecast: three loads around its mean (Gauss-Hermite), the spread from its
    p90 band widened to the startup horizon as sizing widens it, each with the forecast's burst ratio. Half
    the recent intervals of the planner's longest scale-down window (decision.recommendation_window), as
    they came (their own lengths and burst ratios), by _RECENT_POINTS order statistics of their requests:
    the window its scale-down rules hold capacity for, because bursty tenants come back. Without a usable
    history, the forecast alone.
    """
    f = plan.forecast
    interval_s = cfg.adjustment_interval_s
    horizon = lead_intervals(startup_s=cfg.sizing.replica_startup_s, interval_s=interval_s)
    sd = max(0.0, f.num_requests_p90 - f.num_requests) * math.sqrt(horizon) / _Z90
    recent = _recent(plan.observation.history, window_s=cfg.decision.recommendation_window[1])
    w_forecast = FORECAST_WEIGHT if recent else 1.0
    out = [LoadPoint(max(0.0, f.num_requests + z * sd), f.avg_isl_tokens, f.avg_osl_tokens, f.peak_ratio,
                     w_forecast * w) for z, w in _GAUSS_HERMITE_3]
    if recent:
        recent.sort(key=lambda p: p.requests)
        n = min(_RECENT_POINTS, len(recent))
        picks = [recent[min(len(recent) - 1, int((i + 0.5) * len(recent) / n))] for i in range(n)]
        out += [LoadPoint(p.requests, p.isl_tokens, p.osl_tokens, p.peak_ratio, (1.0 - w_forecast) / n)
                for p in picks]
    return out


def _recent(history: LoadHistory | None, *, window_s: float) -> list[LoadPoint]:
    if history is None or len(history) == 0:
        return []
    n = max(1, math.ceil(window_s / history.interval_s - 1e-9))
    out = []
    for j in range(max(0, len(history) - n), len(history)):
        req, isl, osl = history.num_requests[j], history.avg_isl_tokens[j], history.avg_osl_tokens[j]
        if not (is_number(req) and is_number(isl) and is_number(osl)) or req <= 0:
            continue
        peak = None if history.peak_rps is None else history.peak_rps[j]
        ratio = peak_ratio(num_requests=req, peak_rps=peak, interval_s=history.interval_s,
                           window_s=history.peak_window_s)
        out.append(LoadPoint(req, isl, osl, ratio, 0.0))
    return out


def demand_from_plan(
    name: str, plan: PlanResult, *, cfg: PlannerConfig, profile: EngineProfile, priority: float = 1.0,
    ttft_view: TtftView | None = None,
) -> DeploymentDemand:
    """A deployment's demand from its planner's run: the decision's targets, its bounds, the fleet's GPUs per
    replica, and the loss model over the forecast (without one: no loss table, so it only keeps what others
    do not need).

    The shares meeting each target are averaged over the loads the next intervals may bring (load_points:
    the forecast with its uncertainty, and the recent window's intervals), each with its sub-interval burst:
    capacity a planner holds for bursts, for the upper forecast and for tenants that come back is worth
    what it would save there, not nothing.
    cfg: the configuration the plan ran with (SLO, sizing spreads, decision bounds). ttft_view: prefill's
    single-request TTFT as the plan used it (planner.latency.ttft_view); None: the profile's.
    """
    d = plan.decision
    wanted = {"prefill": d.prefill_replicas, "decode": d.decode_replicas}
    mins = {p: getattr(cfg.decision, p).min_replicas for p in POOLS}
    gpus = {p: getattr(plan.fleet, p).gpus_per_replica for p in POOLS}
    f = plan.forecast
    if not plan.sizing or f is None:
        return DeploymentDemand(name, wanted, mins, gpus, priority=priority,
                                notes=("no forecast this run: no expected loss",))
    pre, dec = plan.sizing["prefill"].numbers, plan.sizing["decode"].numbers
    sizing, interval_s = cfg.sizing, cfg.adjustment_interval_s
    shape = f.length_shape if sizing.length_cv == "measured" else None
    isl_cv = shape.isl_cv if shape is not None else sizing.isl_cv
    context_cv = shape.decode_context_cv if shape is not None else sizing.decode_context_cv
    ttft = ttft_view_of(profile.prefill, ttft_view)
    met = {"prefill": [0.0] * (wanted["prefill"] + 1), "decode": [0.0] * (wanted["decode"] + 1)}
    for load in load_points(plan, cfg):
        rps = load.requests / interval_s
        tables = {
            "prefill": ttft_met_fracs(
                rps=rps, isl_tokens=load.isl_tokens, isl_cv=isl_cv,
                correction=float(pre.get("prefill_correction", 1.0)), ttft_target_ms=cfg.slo.ttft_ms, ttft=ttft,
                arrival_cv=sizing.prefill_arrival_cv, service_cv=sizing.prefill_service_cv, up_to=wanted["prefill"],
                peak_ratio=load.peak_ratio, peak_window_s=f.peak_window_s, interval_s=interval_s),
            "decode": itl_met_fracs(
                profile.decode, rps=rps, osl_tokens=load.osl_tokens,
                context_tokens=load.isl_tokens + load.osl_tokens / 2.0,
                correction=float(dec.get("decode_correction", 1.0)), itl_target_ms=cfg.slo.itl_ms,
                context_cv=context_cv, arrival_cv=sizing.prefill_arrival_cv, up_to=wanted["decode"]),
        }
        for pool in POOLS:
            met[pool] = [m + load.weight * x for m, x in zip(met[pool], tables[pool])]
    return DeploymentDemand(name, wanted, mins, gpus, priority=priority, requests=f.num_requests,
                            met_frac={p: tuple(min(1.0, max(0.0, x)) for x in met[p]) for p in POOLS})
