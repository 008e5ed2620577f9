"""The oracle policy: fewest workers per interval that meet the SLA, knowing the future.

Method (hindsight, per interval, per pool; the same simulator and startup delay):

1. Capacity sweeps. Replay the whole trace on static fleets, varying one pool at a
   time with the other pool out of the way: prefill k = 1, 2, ... (outputs cut to one
   token, so decode never interferes) recording for every interval the share of its
   arriving requests whose TTFT meets the target, and decode k = 1, 2, ... (with
   `max_replicas` prefill workers) recording the share whose ITL meets it. A sweep
   stops when every interval reaches the goal, or when one more worker improves no
   interval by 0.1 points (the rest cannot meet the SLA on any fleet, e.g. prompts
   whose prefill alone exceeds the TTFT target).
2. Need. Each pool may miss half of what the goal allows (goal 99% -> 99.5% of
   requests meet TTFT and 99.5% meet ITL, so at least 99% meet both). For each
   interval and pool, the fewest workers whose share reaches
   min(pool goal, best achievable - 0.5 points).
3. Schedule with the startup delay. A worker serves `startup_s` after it is added,
   so the target set at a control step covers every interval until its new workers
   are ready: target(k) = max(need over intervals k+1 .. k+1+ceil(startup/interval)).
   Scale-downs happen as soon as the capacity is no longer needed (drain, nothing
   lost). The initial fleet covers the intervals before the first scale-up lands.
4. Verify and repair. Replay the schedule; in each interval whose joint attainment
   (both targets) falls below the sum of the two pool goals minus one (a queue
   carried over from a leaner interval), add one worker to the pool furthest below
   its own goal and replay again, up to `refine_rounds` times.

The result is a feasible schedule within about one worker per pool per interval of
the cheapest per-interval-feasible one, so its GPU-hours are a tight upper bound on
the true optimum; a policy scoring below it has traded attainment for cost.

The oracle knows the future; no planner does. `reactive_reference` is the bar a
planner can be held to: the same needs, known exactly but only once each
interval has finished. Its control step k sets the largest need of the last `w`
finished intervals (`hindsight_schedule`), so it reacts one startup late and
holds capacity for w intervals; the cheapest w reaching a planner's attainment
says what perfect measurement and perfect sizing, without a forecast, would
have cost. A planner above it loses on sizing or holding; the gap between it
and the oracle is what only a forecast of the next burst can win.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.engine import FleetSim
from sim.lookup import ProfileTables
from sim.policies import ScheduledPolicy, StaticPolicy
from sim.replay import ReplayResult, ReplaySettings, replay
from sim.results import RequestResults
from sim.routing import make_router
from workloads.traces import Trace

_SLACK = 0.005  # an interval's goal is at most its best achievable share minus 0.5 points
_NO_GAIN = 0.001


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's per-interval needs, its schedule and the verified replay."""

    need_prefill: tuple[int, ...]
    need_decode: tuple[int, ...]
    policy: ScheduledPolicy
    result: ReplayResult
    sweep_sizes: dict[str, int]
    goal_frac: float
    prefill_share_by_k: tuple[float, ...] = ()  # static k prefill workers: share of requests meeting TTFT
    decode_share_by_k: tuple[float, ...] = ()  # static k decode workers: share meeting ITL


def _interval_shares(req: RequestResults, ok: np.ndarray, *, interval_s: float, n_intervals: int):
    """Per arrival interval: (requests, share meeting `ok`); share 1 where empty."""
    idx = np.minimum((req.arrival_s // interval_s).astype(np.int64), n_intervals - 1)
    n = np.bincount(idx, minlength=n_intervals).astype(float)
    met = np.bincount(idx, weights=ok.astype(float), minlength=n_intervals)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(n > 0, met / np.maximum(n, 1), 1.0)
    return n, share


def _static_run(
    trace: Trace, tables: ProfileTables, scenario: ReplaySettings, prefill: int, decode: int,
) -> RequestResults:
    sim = FleetSim(
        trace, tables, config=scenario.sim, router=make_router(scenario.router),
        initial_prefill=prefill, initial_decode=decode,
    )
    sim.run_to_completion()
    return sim.results()


def _sweep(trace, tables, scenario, *, pool: str, goal: float, max_replicas: int, n_int: int, progress):
    """Per-interval share meeting this pool's target, for k = 1.. workers: list of arrays.

    The prefill sweep replays the trace with every output cut to one token: requests
    end at their prefill, so TTFT is what k prefill workers give with unlimited decode
    capacity, at half the cost. The decode sweep keeps `max_replicas` prefill workers.
    """
    slo = scenario.slo
    if pool == "prefill":
        trace = Trace(trace.name, trace.arrival_s, trace.isl_tokens, np.ones_like(trace.osl_tokens))
    shares: list[np.ndarray] = []
    for k in range(1, max_replicas + 1):
        if pool == "prefill":
            req = _static_run(trace, tables, scenario, k, 1)
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
        # One more worker helps no interval by a tenth of a point: the rest is unreachable.
        if k >= 2 and np.max(share - shares[-2]) < _NO_GAIN:
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


HINDSIGHT_WINDOWS = (1, 2, 3, 5, 8, 12, 20)


def hindsight_schedule(need: np.ndarray, *, window: int) -> list[int]:
    """Target per control step of the reactive reference: step k sets max(need[k-window+1 .. k]).

    Control step k runs at the end of interval k, so intervals 0 .. k are the ones
    whose need is known then; nothing later is read.
    """
    if window < 1:
        raise ValueError(f"hindsight schedule: window must be >= 1 interval, got {window}")
    need = np.asarray(need)
    return [int(need[max(0, k - window + 1) : k + 1].max()) for k in range(len(need))]


def reactive_reference(
    trace: Trace, tables: ProfileTables, scenario: ReplaySettings, plan: OraclePlan, target: float, *,
    windows: tuple[int, ...] = HINDSIGHT_WINDOWS,
) -> tuple[ReplayResult | None, list[tuple[int, float, float]]]:
    """Cheapest hindsight window whose replay reaches `target` SLA attainment (0..1); see the module docstring.

    Windows are tried shortest first (holding longer costs more); each replay starts
    from the oracle's initial fleet, the same for every window. Returns (the first
    replay reaching target or None, every (window, attainment, GPU-hours) tried).
    """
    initial = plan.policy.initial
    tried = []
    for w in windows:
        policy = ScheduledPolicy(hindsight_schedule(np.array(plan.need_prefill), window=w),
                                 hindsight_schedule(np.array(plan.need_decode), window=w), initial=initial,
                                 name=f"hindsight-reactive:{w}")
        r = replay(trace, tables, policy, scenario=scenario)
        att = float(r.sla_met().mean())
        tried.append((w, att, r.gpu_hours))
        if att >= target:
            return r, tried
    return None, tried


def oracle_plan(
    trace: Trace,
    tables: ProfileTables,
    *,
    scenario: ReplaySettings,
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
    # Each pool gets half the allowed misses, so both together meet the goal:
    # joint share >= ttft share + itl share - 1.
    pool_goal = 1.0 - (1.0 - goal_frac) / 2.0
    counts, _ = _interval_shares(
        RequestResults(trace.arrival_s, trace.arrival_s, trace.arrival_s, trace.isl_tokens, trace.osl_tokens),
        np.ones(len(trace), dtype=bool), interval_s=interval, n_intervals=n_int,
    )
    weights = counts if counts.sum() > 0 else np.ones(n_int)
    sw_p = _sweep(trace, tables, scenario, pool="prefill", goal=pool_goal, max_replicas=max_replicas, n_int=n_int, progress=progress)
    sw_d = _sweep(trace, tables, scenario, pool="decode", goal=pool_goal, max_replicas=max_replicas, n_int=n_int, progress=progress)
    need_p = _need(sw_p, pool_goal)
    need_d = _need(sw_d, pool_goal)
    goal_p = np.minimum(pool_goal, np.max(np.stack(sw_p), axis=0) - _SLACK)
    goal_d = np.minimum(pool_goal, np.max(np.stack(sw_d), axis=0) - _SLACK)
    goal_joint = goal_p + goal_d - 1.0
    slo = scenario.slo
    result = policy = None
    for round_ in range(refine_rounds + 1):
        tp, ip = schedule_from_need(need_p, interval_s=interval, startup_s=scenario.sim.startup_s)
        td, idd = schedule_from_need(need_d, interval_s=interval, startup_s=scenario.sim.startup_s)
        policy = ScheduledPolicy(tp, td, initial=(ip, idd), name="oracle")
        result = replay(trace, tables, policy, scenario=scenario)
        req = result.requests
        _, joint = _interval_shares(req, result.sla_met(), interval_s=interval, n_intervals=n_int)
        short = joint < goal_joint - 1e-12
        if progress is not None:
            progress(
                f"oracle verify round {round_}: {int(short.sum())} of {n_int} intervals short, "
                f"{result.gpu_hours:.2f} GPU-hours"
            )
        if not short.any() or round_ == refine_rounds:
            break
        _, sp = _interval_shares(req, req.ttft_ms <= slo.ttft_ms, interval_s=interval, n_intervals=n_int)
        itl = req.itl_ms
        _, sd = _interval_shares(req, np.isnan(itl) | (itl <= slo.itl_ms), interval_s=interval, n_intervals=n_int)
        # Add a worker to the pool furthest below its own goal in each short interval.
        p_gap, d_gap = goal_p - sp, goal_d - sd
        bump_p = short & (p_gap >= d_gap) & (need_p < max_replicas)
        bump_d = short & (d_gap > p_gap) & (need_d < max_replicas)
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
        prefill_share_by_k=tuple(float(np.average(x, weights=weights)) for x in sw_p),
        decode_share_by_k=tuple(float(np.average(x, weights=weights)) for x in sw_d),
    )


def best_static(
    trace: Trace, tables: ProfileTables, scenario: ReplaySettings, plan: OraclePlan, target: float, *,
    max_runs: int = 8,
) -> tuple[ReplayResult | None, list[tuple[int, int, float, float]]]:
    """Cheapest static P x D fleet whose replay reaches `target` SLA attainment (0..1).

    Candidates are ranked by GPUs, then by the attainment the oracle's capacity
    sweeps estimate for them (prefill share x decode share); those estimated
    more than 1 point below target are skipped. Returns (its replay or None,
    every (prefill, decode, attainment, GPU-hours) tried), at most max_runs replays.
    """
    ps, ds = plan.prefill_share_by_k, plan.decode_share_by_k
    cands = []
    for p in range(1, len(ps) + 3):
        for d in range(1, len(ds) + 3):
            est = ps[min(p, len(ps)) - 1] * ds[min(d, len(ds)) - 1]
            cands.append((p + d, -est, p, d))
    cands.sort()
    tried = []
    for _gpus, neg_est, p, d in cands:
        if -neg_est < target - 0.01:
            continue
        r = replay(trace, tables, StaticPolicy(p, d), scenario=scenario)
        att = float(r.sla_met().mean())
        tried.append((p, d, att, r.gpu_hours))
        if att >= target:
            return r, tried
        if len(tried) >= max_runs:
            break
    return None, tried
