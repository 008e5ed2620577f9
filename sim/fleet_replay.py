"""Several traces replayed at once, one per deployment, against one GPU budget with the arbitration in the loop.

Each deployment is its own simulated fleet with its own planner (sim.policies.PlannerPolicy: its profile,
SLA and settings), on one shared clock. Every interval each planner decides as the planner flow would;
then the fleet's rule (planner.fleet: the arbitration by expected SLA loss, or a fixed split / priority
order) turns the decisions into grants within the budget, and each fleet applies its grant. A planner
whose wants were cut sees the granted fleet on its next run, as it would in a cluster. The initial
fleets (each planner's warm start) are cut to the budget by the loss-free arbitration (the GPUs to the
higher priority), the same for every rule.

A deployment whose trace has finished stops (its GPUs are no longer asked for); its result counts up to
its own end.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.fleet.arbitrate import DEFAULT_GUARANTEED_SHARE_FRAC, Arbitration, arbitrate
from planner.fleet.demand import DeploymentDemand, demand_from_plan
from planner.fleet.fixed import RULES
from planner.types import POOLS
from sim.lookup import ProfileTables
from sim.policies import PlannerPolicy
from sim.replay import IntervalStep, PolicyOutput, ReplayResult, ReplayRun, ReplaySettings, first_interval_observation
from workloads.traces import Trace


@dataclass(frozen=True)
class FleetMemberReplay:
    """One deployment of a simulated fleet: its trace, profile tables, planner, settings and priority."""

    name: str
    trace: Trace
    tables: ProfileTables
    policy: PlannerPolicy
    scenario: ReplaySettings
    priority: float = 1.0


@dataclass(frozen=True)
class FleetReplayResult:
    """Each deployment's replay, and how often the budget held whom.

    short_intervals: intervals in which the planners together wanted more than the budget.
    held_intervals: per deployment, intervals in which its grant was below its wants.
    peak_granted_gpus: the most GPUs the grants set at once (never above the budget once the initial
        fleets are cut); peak_allocated_gpus: the most allocated at an interval's end (starting and
        draining workers included, so it can pass the budget while one fleet drains and another starts).
    arbitrations: the short intervals' arbitrations (t_s, Arbitration.as_dict()), the first `keep_arbitrations`.
    """

    budget_gpus: int
    rule: str
    results: dict[str, ReplayResult]
    short_intervals: int
    held_intervals: dict[str, int]
    peak_granted_gpus: int
    peak_allocated_gpus: int
    wall_s: float
    arbitrations: tuple[tuple[float, dict], ...] = ()

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.results.values())


@dataclass
class _Member:
    spec: FleetMemberReplay
    run: ReplayRun
    step: IntervalStep | None = None
    done: bool = False
    end_s: float = 0.0
    held: int = 0
    gpus: dict = field(default_factory=dict)


def replay_fleet(
    members: Sequence[FleetMemberReplay], *, budget_gpus: int, rule: str = "loss",
    guaranteed_share_frac: float = DEFAULT_GUARANTEED_SHARE_FRAC,
    keep_arbitrations: int = 50, progress: Callable[[int], None] | None = None,
) -> FleetReplayResult:
    """Replay every member's trace against one budget; `rule` is a planner.fleet.fixed.RULES name.

    guaranteed_share_frac: rule "loss"'s guaranteed share (planner.fleet.arbitrate.arbitrate).
    Every member needs the same interval_s. progress: called with the interval index after each interval.
    """
    if rule not in RULES:
        raise ValueError(f"fleet replay: unknown rule {rule!r}; valid: {', '.join(RULES)}")
    if not members:
        raise ValueError("fleet replay: no deployments")
    intervals = {m.scenario.interval_s for m in members}
    if len(intervals) != 1:
        raise ValueError(f"fleet replay: every deployment needs one interval_s, got {sorted(intervals)}")
    for m in members:
        if m.policy.fast_path is not None:
            raise ValueError(f"fleet replay: deployment {m.name!r} has the fast path on; its scale-ups would pass "
                             f"the budget between intervals (switch planner.fast_path off)")
    wall0 = time.perf_counter()
    interval_s = intervals.pop()
    _cut_initial_fleets(members, budget_gpus)
    fleet = [_Member(m, ReplayRun(m.trace, m.tables, m.policy, scenario=m.scenario, router=None)) for m in members]
    for f in fleet:
        f.gpus = {"prefill": f.run.sim.cfg.gpus_per_prefill, "decode": f.run.sim.cfg.gpus_per_decode}
    short, peak_granted, peak_allocated, kept = 0, 0, 0, []
    k = 0
    while not all(f.done for f in fleet):
        t = (k + 1) * interval_s
        live = [f for f in fleet if not f.done]
        for f in live:
            f.step = f.run.decide(k, t)
        deciding = [f for f in live if not f.step.finished]
        grants = None
        if deciding:
            demands = [_demand(f) for f in deciding]
            grants = (arbitrate(demands, budget_gpus, guaranteed_share_frac=guaranteed_share_frac) if rule == "loss"
                      else RULES[rule](demands, budget_gpus))
            if grants.short:
                short += 1
                if len(kept) < keep_arbitrations:
                    kept.append((t, grants.as_dict()))
            peak_granted = max(peak_granted, grants.granted_gpus)
        for f in live:
            if f.step.finished:
                f.run.settle(f.step)
                f.done, f.end_s = True, t
                continue
            grant = grants.grants[f.spec.name]
            f.held += grant.held
            f.run.settle(f.step, _granted(f.step, grant, grants))
        peak_allocated = max(peak_allocated, sum(
            f.run.sim.allocated_count(p) * f.gpus[p] for f in fleet if not f.done for p in POOLS))
        if progress is not None:
            progress(k)
        for f in live:
            if not f.done and t > f.spec.trace.duration_s + f.spec.scenario.max_drain_s:
                raise RuntimeError(f"fleet replay: {f.spec.name}'s requests still running "
                                   f"{f.spec.scenario.max_drain_s:g} s after its last arrival")
        k += 1
    return FleetReplayResult(
        budget_gpus=budget_gpus, rule=rule, results={f.spec.name: f.run.result(end_s=f.end_s) for f in fleet},
        short_intervals=short, held_intervals={f.spec.name: f.held for f in fleet}, peak_granted_gpus=peak_granted,
        peak_allocated_gpus=peak_allocated, wall_s=time.perf_counter() - wall0, arbitrations=tuple(kept))


def _demand(f: _Member) -> DeploymentDemand:
    """The member's demand from its planner's plan of this interval."""
    policy, spec = f.spec.policy, f.spec
    return demand_from_plan(spec.name, policy.last_plan, cfg=policy.cfg, profile=policy.profile,
                            priority=spec.priority, ttft_view=policy.ttft_view)


def _granted(step: IntervalStep, grant, arbitration: Arbitration) -> PolicyOutput:
    """The planner's output with the grant in place of its targets when the budget held it (else as it was)."""
    out = step.out
    if not grant.held:
        return out
    why = "; ".join(f"{r.code.value}: {r.message}" for r in grant.reasons)
    return dataclasses.replace(out, prefill_replicas=grant.targets["prefill"], decode_replicas=grant.targets["decode"],
                               reason=f"{out.reason}; {why}" if out.reason else why)


def _cut_initial_fleets(members: Sequence[FleetMemberReplay], budget_gpus: int) -> None:
    """Each planner's warm start, cut to the budget with no loss tables (the GPUs go to the higher priority)."""
    demands = []
    for m in members:
        p, d = m.policy.initial_fleet(first_interval_observation(m.trace, m.scenario))
        gpus = {"prefill": m.scenario.sim.gpus_per_prefill, "decode": m.scenario.sim.gpus_per_decode}
        floor = {pool: max(1, getattr(m.policy.cfg.decision, pool).min_replicas) for pool in POOLS}
        demands.append(DeploymentDemand(m.name, {"prefill": p, "decode": d}, floor, gpus, priority=m.priority))
    cut = arbitrate(demands, budget_gpus)
    for m in members:
        g = cut.grants[m.name].targets
        m.policy.initial = (g["prefill"], g["decode"])


def fleet_attainment(result: FleetReplayResult) -> float:
    """Share of all the fleet's requests that met their own deployment's SLA."""
    met = sum(int(r.sla_met().sum()) for r in result.results.values())
    total = sum(len(r.sla_met()) for r in result.results.values())
    return met / total if total else math.nan
