"""The oracle policy: fewest workers per interval that meet the SLA, knowing the future.

Method (hindsight, per interval, per pool; the same simulator and startup delay):

1. Capacity sweeps. Replay the whole trace on static fleets, varying one pool at a
   time with the other pool generously sized (`max_replicas`): prefill k = 1, 2, ...
   recording for every interval the share of its arriving requests whose TTFT meets
   the target, and decode k = 1, 2, ... recording the share whose ITL meets it. A
   sweep stops when every interval reaches the goal, or when one more worker improves
   no interval (the rest cannot meet the SLA on any fleet, e.g. prompts whose
   prefill alone exceeds the TTFT target).
2. Need. For each interval and pool, the fewest workers whose share reaches
   min(goal, best achievable - 0.2 points).
3. Schedule with the startup delay. A worker serves `startup_s` after it is added,
   so the target set at a control step covers every interval until its new workers
   are ready: target(k) = max(need over intervals k+1 .. k+1+ceil(startup/interval)).
   Scale-downs happen as soon as the capacity is no longer needed (drain, nothing
   lost). The initial fleet covers the intervals before the first scale-up lands.
4. Verify and repair. Replay the schedule; in each interval whose joint attainment
   (both targets) falls short of its goal (a queue carried over from a leaner
   interval, both pools missing together), add one worker to the pool with the
   lower share and replay again, up to `refine_rounds` times.

The result is a feasible schedule within about one worker per pool per interval of
the cheapest per-interval-feasible one, so its GPU-hours are a tight upper bound on
the true optimum; a policy scoring below it has traded attainment for cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.engine import FleetSim, RequestResults
from sim.lookup import ProfileTables
from sim.policies import ScheduledPolicy
from sim.replay import ReplayResult, Scenario, replay
from sim.routing import make_router
from sim.traces import Trace

_SLACK = 0.002


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's per-interval needs, its schedule and the verified replay."""

    need_prefill: tuple[int, ...]
    need_decode: tuple[int, ...]
    policy: ScheduledPolicy
    result: ReplayResult
    sweep_sizes: dict[str, int]
    goal_frac: float


def _interval_shares(req: RequestResults, ok: np.ndarray, *, interval_s: float, n_intervals: int):
    """Per arrival interval: (requests, share meeting `ok`); share 1 where empty."""
    idx = np.minimum((req.arrival_s // interval_s).astype(np.int64), n_intervals - 1)
    n = np.bincount(idx, minlength=n_intervals).astype(float)
    met = np.bincount(idx, weights=ok.astype(float), minlength=n_intervals)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(n > 0, met / np.maximum(n, 1), 1.0)
    return n, share


def _static_run(trace: Trace, tables: ProfileTables, scenario: Scenario, prefill: int, decode: int) -> RequestResults:
    sim = FleetSim(
        trace, tables, config=scenario.sim, router=make_router(scenario.router),
        initial_prefill=prefill, initial_decode=decode,
    )
    sim.run_to_completion()
    return sim.results()


def _sweep(trace, tables, scenario, *, pool: str, goal: float, max_replicas: int, n_int: int, progress):
    """Per-interval share meeting this pool's target, for k = 1.. workers: list of arrays."""
    slo = scenario.slo
    shares: list[np.ndarray] = []
    for k in range(1, max_replicas + 1):
        if pool == "prefill":
            req = _static_run(trace, tables, scenario, k, max_replicas)
            ok = req.ttft_ms <= slo.ttft_ms
        else:
            req = _static_run(trace, tables, scenario, max_replicas, k)
            itl = req.itl_ms
            ok = np.isnan(itl) | (itl <= slo.itl_ms)
        _, share = _interval_shares(req, ok, interval_s=scenario.interval_s, n_intervals=n_int)
        shares.append(share)
        if progress is not None:
            progress(f"oracle sweep {pool} k={k}")
        if np.all(share >= goal - 1e-12):
            break
        if k >= 2 and np.all(share <= shares[-2] + 1e-12):
            break
    return shares


def _need(shares: list[np.ndarray], goal: float) -> np.ndarray:
    best = np.max(np.stack(shares), axis=0)
    target = np.minimum(goal, best - _SLACK)
    need = np.full(len(best), len(shares), dtype=np.int64)
    for k in range(len(shares), 0, -1):
        need = np.where(shares[k - 1] >= target - 1e-12, k, need)
    return need


def schedule_from_need(need: np.ndarray, *, interval_s: float, startup_s: float) -> tuple[list[int], int]:
    """(target per control step, initial workers) so that need[j] workers serve interval j.

    Control step k runs at the end of interval k; a worker it adds serves from
    (k + 1) * interval_s + startup_s, i.e. from interval k + 1 + m with
    m = ceil(startup_s / interval_s). So interval j's need is requested at step
    j - 1 - m and kept through step j - 1: target(k) = max(need[k+1 .. k+1+m]).
    The initial fleet covers intervals 0 .. m, before any scale-up can land.
    """
    n = len(need)
    m = max(0, math.ceil(startup_s / interval_s - 1e-9))
    targets = [int(max(need[k + 1 : k + 2 + m])) if k + 1 < n else int(need[-1]) for k in range(n)]
    initial = int(max(need[: m + 1]))
    return targets, initial


def oracle_plan(
    trace: Trace,
    tables: ProfileTables,
    *,
    scenario: Scenario,
    goal_frac: float = 0.99,
    max_replicas: int = 16,
    refine_rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> OraclePlan:
    """Compute and verify the oracle schedule for `trace` (see the module docstring)."""
    if not 0 < goal_frac <= 1:
        raise ValueError(f"oracle: goal_frac must be in (0, 1], got {goal_frac}")
    interval = scenario.interval_s
    n_int = max(1, int(math.ceil((trace.duration_s + 1e-9) / interval)))
    sw_p = _sweep(trace, tables, scenario, pool="prefill", goal=goal_frac, max_replicas=max_replicas, n_int=n_int, progress=progress)
    sw_d = _sweep(trace, tables, scenario, pool="decode", goal=goal_frac, max_replicas=max_replicas, n_int=n_int, progress=progress)
    need_p = _need(sw_p, goal_frac)
    need_d = _need(sw_d, goal_frac)
    best_joint = np.minimum(np.max(np.stack(sw_p), axis=0), np.max(np.stack(sw_d), axis=0))
    goal_i = np.minimum(goal_frac, best_joint - 2 * _SLACK)
    slo = scenario.slo
    result = policy = None
    for round_ in range(refine_rounds + 1):
        tp, ip = schedule_from_need(need_p, interval_s=interval, startup_s=scenario.sim.startup_s)
        td, idd = schedule_from_need(need_d, interval_s=interval, startup_s=scenario.sim.startup_s)
        policy = ScheduledPolicy(tp, td, initial=(ip, idd), name="oracle")
        result = replay(trace, tables, policy, scenario=scenario)
        if progress is not None:
            progress(f"oracle verify round {round_}")
        req = result.requests
        _, joint = _interval_shares(req, result.sla_met(), interval_s=interval, n_intervals=n_int)
        short = joint < goal_i - 1e-12
        if not short.any() or round_ == refine_rounds:
            break
        _, sp = _interval_shares(req, req.ttft_ms <= slo.ttft_ms, interval_s=interval, n_intervals=n_int)
        itl = req.itl_ms
        _, sd = _interval_shares(req, np.isnan(itl) | (itl <= slo.itl_ms), interval_s=interval, n_intervals=n_int)
        bump_p = short & (sp <= sd) & (need_p < max_replicas)
        bump_d = short & (sd < sp) & (need_d < max_replicas)
        if not (bump_p.any() or bump_d.any()):
            break
        need_p = need_p + bump_p
        need_d = need_d + bump_d
    return OraclePlan(
        need_prefill=tuple(int(x) for x in need_p),
        need_decode=tuple(int(x) for x in need_d),
        policy=policy,
        result=result,
        sweep_sizes={"prefill": len(sw_p), "decode": len(sw_d)},
        goal_frac=goal_frac,
    )
