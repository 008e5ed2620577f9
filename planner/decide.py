"""Decision step: turn SLA sizing and the saturation guardrail into replica targets.

`decide` is a fixed chain of small rules, each a pure function over the
per-pool targets that returns the new targets and the reasons it changed
them, so every rule is table-testable on its own:

    hold gates       previous decision still in flight; stale observation
    sizing_targets   the SLA sizing, or current replicas where load data is missing
    hold_on_partial_metrics  some frontends or workers not reporting: no target below current
    apply_guardrail  saturation floor: may raise a target, vetoes an unsafe scale-down
    clamp_to_bounds  per-pool min/max                    -> the run's recommendation
    stabilize_scale_down  HPA-style: down only to the highest recent recommendation
    hold_scale_down_in_warmup  no scale-down on too short a load history
    limit_step       at most max_step_replicas per interval
    clamp_to_bounds  again: the two rules above pull toward current, which may be out of bounds
    fit_gpu_budget   both pools cut together, proportionally, never below min

A fast-path run (a saturation signal between intervals) goes through
`decide_fast_path` instead: the same sizing chain, then scale-up only over what
is set or in flight, after a cooldown since the last applied decision.

The order leans toward too many replicas: missing data makes sizing neutral
before anything can shrink; the guardrail floor goes in before the bounds, so
only the configured max can undo it; the stabilization window only ever
raises a scale-down target. Only the hard limits (max replicas, GPU budget)
can take a pool below what the guardrail asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from planner.config import DecisionConfig, FastPathConfig, PoolBounds
from planner.saturation import PoolSaturation
from planner.types import (
    POOLS,
    Decision,
    FleetState,
    Observation,
    Pool,
    PoolSizing,
    Reason,
    ReasonCode,
    is_number,
)

Targets = dict[Pool, int]
Step = tuple[Targets, list[Reason]]


def _bounds(cfg: DecisionConfig, pool: Pool) -> PoolBounds:
    return cfg.prefill if pool == "prefill" else cfg.decode


def current_targets(fleet: FleetState) -> Targets:
    """Replicas each pool has now, as the connector reports them."""
    return {p: getattr(fleet, p).current_replicas for p in POOLS}


# ---------------------------------------------------------------- hold gates


def previous_decision_gate(
    *, fleet: FleetState, cfg: DecisionConfig, now_s: float
) -> tuple[Reason | None, Reason | None]:
    """(hold, note): hold while the previous decision is not done and younger than wait_for_previous_s.

    A decision older than that (seconds, against now_s) no longer holds the
    planner; the note says so.
    """
    last = fleet.last_decision
    if last is None or last.done:
        return None, None
    age_s = now_s - last.decided_at_s
    numbers = {
        "decision_id": float(last.decision_id),
        "age_s": age_s,
        "wait_for_previous_s": cfg.wait_for_previous_s,
        "prefill_in_flight": float(last.prefill_replicas),
        "decode_in_flight": float(last.decode_replicas),
    }
    if age_s < cfg.wait_for_previous_s:
        return (
            Reason(
                ReasonCode.HOLD_PREVIOUS_NOT_DONE,
                None,
                f"decision {last.decision_id} (prefill {last.prefill_replicas}, decode {last.decode_replicas}) "
                f"not done after {age_s:.0f} s (waiting up to {cfg.wait_for_previous_s:.0f} s)",
                numbers,
            ),
            None,
        )
    return None, Reason(
        ReasonCode.PREVIOUS_DECISION_TIMED_OUT,
        None,
        f"decision {last.decision_id} still not done after {age_s:.0f} s >= {cfg.wait_for_previous_s:.0f} s: "
        "deciding again",
        numbers,
    )


def stale_gate(*, obs: Observation, cfg: DecisionConfig, now_s: float) -> Reason | None:
    """Hold when the collect step flagged its data stale or the observation is too old.

    max age: cfg.max_observation_age_s, or two adjustment intervals (seconds).
    """
    max_age_s = cfg.max_observation_age_s if cfg.max_observation_age_s is not None else 2 * obs.interval_s
    age_s = now_s - obs.taken_at_s
    why = list(obs.stale_reasons)
    if age_s > max_age_s:
        why.append(f"observation taken {age_s:.0f} s ago > {max_age_s:.0f} s")
    if not why:
        return None
    return Reason(
        ReasonCode.HOLD_STALE_METRICS,
        None,
        "metrics stale, holding current replicas: " + "; ".join(why),
        {"observation_age_s": age_s, "max_observation_age_s": max_age_s},
    )


def partial_metrics_gate(*, obs: Observation, cfg: DecisionConfig) -> Reason | None:
    """A hold reason when more than cfg.partial_metrics_max_missing_frac of a kind of metric source is missing.

    obs.coverage says, per kind (frontend scrape targets, each pool's
    workers), how many reported of how many should have; a kind with none
    expected was not checked. Sums over the sources that did report understate
    the load, so the data is a lower bound: good for a scale-up, never for a
    scale-down.
    """
    short = [c for c in obs.coverage if c.expected > 0 and c.missing_frac > cfg.partial_metrics_max_missing_frac]
    if not short:
        return None
    numbers: dict[str, float] = {"max_missing_frac": cfg.partial_metrics_max_missing_frac}
    parts = []
    for c in short:
        key = c.source.replace(" ", "_")
        numbers[f"{key}_expected"] = float(c.expected)
        numbers[f"{key}_present"] = float(c.present)
        parts.append(f"{c.missing} of {c.expected} {c.source} missing" + (f" ({c.detail})" if c.detail else ""))
    return Reason(
        ReasonCode.HOLD_PARTIAL_METRICS, None,
        "metrics partial: " + "; ".join(parts) + ": no scale-down on what is left (a scale-up still stands)",
        numbers,
    )


def missing_load_metrics(obs: Observation) -> tuple[str, ...]:
    """Names of the load metrics the interval lacks (None, NaN or inf).

    ISL/OSL are only needed when requests arrived: with zero requests they are
    undefined, not missing.
    """
    if not is_number(obs.num_requests):
        return ("num_requests",)
    if obs.num_requests == 0:
        return ()
    return tuple(n for n in ("avg_isl_tokens", "avg_osl_tokens") if not is_number(getattr(obs, n)))


# ---------------------------------------------------------------- rules


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


def stabilize_scale_down(
    targets: Targets,
    *,
    current: Targets,
    history: Sequence[tuple[float, int, int]],
    window_s: float,
    now_s: float,
) -> Step:
    """Scale down only to the highest recommendation of the last window_s seconds (never above current).

    history: (decided_at_s, prefill, decode) recommendations of earlier runs;
    the caller rebuilds it from stored decisions (Decision.recommended_*). An
    entry stamped after now_s (clock skew) counts as recent. Scale-ups are not
    delayed.
    """
    out = dict(targets)
    reasons: list[Reason] = []
    if window_s <= 0:
        return out, reasons
    recent = [entry for entry in history if entry[0] > now_s - window_s]
    for i, pool in enumerate(POOLS):
        t, c = targets[pool], current[pool]
        if t >= c or not recent:
            continue
        window_max = max(int(entry[1 + i]) for entry in recent)
        stabilized = min(c, max(t, window_max))
        if stabilized != t:
            out[pool] = stabilized
            reasons.append(
                Reason(ReasonCode.STABILIZATION_WINDOW, pool,
                       f"{pool}: scale-down to {t} held at {stabilized}: highest recommendation in the last "
                       f"{window_s:.0f} s was {window_max}",
                       {"recommended_replicas": float(t), "window_max_replicas": float(window_max),
                        "window_s": window_s, "window_entries": float(len(recent))})
            )
    return out, reasons


def hold_scale_down_in_warmup(
    targets: Targets, *, current: Targets, history_intervals: int | None, min_intervals: int
) -> Step:
    """No scale-down while the load history is shorter than min_intervals (a planner just started).

    history_intervals: intervals of load history the forecast was built on; None
    when the observation carries no history (the rule does not apply). With one
    minute of history a forecast can read a rising load as low, and the start
    fleet is the best estimate there is. Scale-ups are not delayed.
    """
    out = dict(targets)
    reasons: list[Reason] = []
    if history_intervals is None or history_intervals >= min_intervals:
        return out, reasons
    for pool in POOLS:
        t, c = targets[pool], current[pool]
        if t < c:
            out[pool] = c
            reasons.append(
                Reason(ReasonCode.WARMUP_NO_SCALE_DOWN, pool,
                       f"{pool}: scale-down to {t} held at {c}: {history_intervals} of {min_intervals} intervals of "
                       "load history, no scale-down until the forecast has enough",
                       {"recommended_replicas": float(t), "history_intervals": float(history_intervals),
                        "min_history_intervals": float(min_intervals)})
            )
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
    mins = {p: min(_bounds(cfg, p).min_replicas, targets[p]) for p in POOLS}
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


def finish(
    targets: Targets, *, baseline: Targets, reasons: Sequence[Reason], recommended: Targets | None,
    based_on: Targets | None = None,
) -> Decision:
    """Wrap targets into a Decision; apply only when they differ from what is already set (baseline).
    based_on: the replicas in effect when deciding (the connector refuses the decision over others)."""
    closing: list[Reason] = []
    for pool in POOLS:
        t, b = targets[pool], baseline[pool]
        if t != b:
            code = ReasonCode.SCALE_UP if t > b else ReasonCode.SCALE_DOWN
            closing.append(Reason(code, pool, f"{pool}: {b} -> {t}",
                                  {"from_replicas": float(b), "to_replicas": float(t)}))
    if not closing:
        closing.append(
            Reason(ReasonCode.UNCHANGED, None,
                   f"targets equal what is set (prefill {targets['prefill']}, decode {targets['decode']})",
                   {f"{p}_replicas": float(targets[p]) for p in POOLS})
        )
    return Decision(
        prefill_replicas=targets["prefill"],
        decode_replicas=targets["decode"],
        apply=any(targets[p] != baseline[p] for p in POOLS),
        reasons=tuple(reasons) + tuple(closing),
        recommended_prefill_replicas=None if recommended is None else recommended["prefill"],
        recommended_decode_replicas=None if recommended is None else recommended["decode"],
        based_on=None if based_on is None else (based_on["prefill"], based_on["decode"]),
    )


def _hard_limits(targets: Targets, *, fleet: FleetState, cfg: DecisionConfig) -> Step:
    """Bounds then GPU budget: the limits that hold even while the planner holds."""
    bounded, r1 = clamp_to_bounds(targets, cfg=cfg)
    fitted, r2 = fit_gpu_budget(bounded, gpus_per_replica=_gpus(fleet), cfg=cfg)
    return fitted, r1 + r2


def _gpus(fleet: FleetState) -> dict[Pool, int]:
    return {p: getattr(fleet, p).gpus_per_replica for p in POOLS}


def _check_fleet(fleet: FleetState) -> None:
    for pool in POOLS:
        n = getattr(fleet, pool).current_replicas
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"decide: fleet {pool}.current_replicas must be an integer >= 0, got {n!r}")


def decide(
    *,
    sizing: Mapping[Pool, PoolSizing],
    saturation: Mapping[Pool, PoolSaturation] | None,
    fleet: FleetState,
    obs: Observation,
    cfg: DecisionConfig,
    now_s: float,
    fast_path: FastPathConfig | None = None,
) -> Decision:
    """One interval's targets for both pools, with every reason and its numbers.

    sizing: replicas each pool needs for the SLA (a pool left out is held).
    saturation: the guardrail's verdict per pool; None when it is disabled.
    now_s: the run's clock, seconds, on the same clock as obs.taken_at_s and
        the decision history in `fleet`.
    fast_path: set for a run the saturation trigger started: scale-up only
        (`decide_fast_path`); None for a scheduled run.
    """
    if fast_path is not None:
        return decide_fast_path(sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg,
                                fast_path=fast_path, now_s=now_s)
    _check_fleet(fleet)
    current = current_targets(fleet)

    hold, note = previous_decision_gate(fleet=fleet, cfg=cfg, now_s=now_s)
    if hold is not None:
        last = fleet.last_decision
        in_flight: Targets = {"prefill": last.prefill_replicas, "decode": last.decode_replicas}
        if hold.numbers["age_s"] >= cfg.scale_up_past_pending_s and stale_gate(obs=obs, cfg=cfg, now_s=now_s) is None:
            targets, reasons, recommended = _sized_targets(
                sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s, current=current)
            up, limits = _hard_limits({p: max(in_flight[p], targets[p]) for p in POOLS}, fleet=fleet, cfg=cfg)
            if up != in_flight and all(up[p] >= in_flight[p] for p in POOLS):
                past = Reason(
                    ReasonCode.SCALE_UP_PAST_PENDING, None,
                    f"decision {last.decision_id} not done after {hold.numbers['age_s']:.0f} s >= "
                    f"{cfg.scale_up_past_pending_s:.0f} s (ready: prefill {fleet.prefill.ready_replicas}, decode "
                    f"{fleet.decode.ready_replicas}): scaling up past it, no scale-down until it is done",
                    {**hold.numbers, "scale_up_past_pending_s": cfg.scale_up_past_pending_s},
                )
                return finish(up, baseline=in_flight, reasons=[past, *reasons, *limits], recommended=recommended,
                              based_on=current)
        held, limits = _hard_limits(in_flight, fleet=fleet, cfg=cfg)
        return finish(held, baseline=in_flight, reasons=[hold, *limits], recommended=held, based_on=current)

    reasons: list[Reason] = [note] if note is not None else []
    stale = stale_gate(obs=obs, cfg=cfg, now_s=now_s)
    if stale is not None:
        held, limits = _hard_limits(current, fleet=fleet, cfg=cfg)
        return finish(held, baseline=current, reasons=[*reasons, stale, *limits], recommended=held,
                      based_on=current)

    targets, sized, recommended = _sized_targets(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s, current=current)
    return finish(targets, baseline=current, reasons=reasons + sized, recommended=recommended, based_on=current)


def in_flight_or_current(fleet: FleetState) -> tuple[Targets, bool]:
    """(targets, pending): the previous decision's while it is not done, else the current replicas."""
    last = fleet.last_decision
    if last is None or last.done:
        return current_targets(fleet), False
    return {"prefill": last.prefill_replicas, "decode": last.decode_replicas}, True


def fast_path_cooldown_gate(*, fleet: FleetState, cooldown_s: float, now_s: float) -> Reason | None:
    """Skip the fast path while the last applied decision (of either kind) is younger than cooldown_s.

    Stateless: the age comes from the decision history the connector returns.
    A decision stamped after now_s (clock skew) counts as recent.
    """
    last = fleet.last_decision
    if last is None:
        return None
    age_s = now_s - last.decided_at_s
    if age_s >= cooldown_s:
        return None
    return Reason(
        ReasonCode.FAST_PATH_COOLDOWN, None,
        f"fast path skipped: decision {last.decision_id} (prefill {last.prefill_replicas}, decode "
        f"{last.decode_replicas}) applied {age_s:.0f} s ago < cooldown {cooldown_s:.0f} s",
        {"decision_id": float(last.decision_id), "age_s": age_s, "cooldown_s": cooldown_s},
    )


def decide_fast_path(
    *,
    sizing: Mapping[Pool, PoolSizing],
    saturation: Mapping[Pool, PoolSaturation] | None,
    fleet: FleetState,
    obs: Observation,
    cfg: DecisionConfig,
    fast_path: FastPathConfig,
    now_s: float,
) -> Decision:
    """Scale-up-only targets for a run the saturation trigger started between intervals.

    Each pool goes to max(set-or-in-flight, the interval rules' target): the
    previous decision's targets while it is not done (a scale-up still starting
    never blocks a larger one, and is never undone), else the current replicas.
    Nothing is written when the last applied decision is younger than
    fast_path.cooldown_s, on stale metrics, or when the bounds or the GPU budget
    would take a pool below what is set (the next scheduled run handles that).
    now_s: seconds, on the clock of obs and the decision history.
    """
    _check_fleet(fleet)
    current = current_targets(fleet)
    baseline, pending = in_flight_or_current(fleet)
    numbers = {f"{p}_{'in_flight' if pending else 'current'}_replicas": float(baseline[p]) for p in POOLS}
    numbers["cooldown_s"] = fast_path.cooldown_s

    def hold(reasons: list[Reason]) -> Decision:
        return finish(baseline, baseline=baseline, reasons=reasons, recommended=baseline, based_on=current)

    stale = stale_gate(obs=obs, cfg=cfg, now_s=now_s)
    if stale is not None:
        return hold([stale])
    cooldown = fast_path_cooldown_gate(fleet=fleet, cooldown_s=fast_path.cooldown_s, now_s=now_s)
    if cooldown is not None:
        return hold([cooldown])
    targets, reasons, recommended = _sized_targets(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s, current=current)
    up, limits = _hard_limits({p: max(baseline[p], targets[p]) for p in POOLS}, fleet=fleet, cfg=cfg)
    numbers.update({f"{p}_rules_replicas": float(targets[p]) for p in POOLS})
    what = "in-flight decision" if pending else "current replicas"
    if any(up[p] < baseline[p] for p in POOLS):
        cut = Reason(
            ReasonCode.FAST_PATH_NOTHING_TO_ADD, None,
            f"fast path: bounds or GPU budget put prefill {up['prefill']}, decode {up['decode']} below the {what} "
            f"(prefill {baseline['prefill']}, decode {baseline['decode']}): left to the next scheduled run",
            numbers,
        )
        return hold([cut, *reasons, *limits])
    if up == baseline:
        none = Reason(
            ReasonCode.FAST_PATH_NOTHING_TO_ADD, None,
            f"fast path: the rules ask no more than the {what} (prefill {baseline['prefill']}, "
            f"decode {baseline['decode']})",
            numbers,
        )
        return finish(up, baseline=baseline, reasons=[none, *reasons, *limits], recommended=recommended,
                      based_on=current)
    scale = Reason(
        ReasonCode.FAST_PATH_SCALE_UP, None,
        f"fast path: scale-up only over the {what}: prefill {baseline['prefill']} -> {up['prefill']}, "
        f"decode {baseline['decode']} -> {up['decode']}",
        {**numbers, **{f"{p}_to_replicas": float(up[p]) for p in POOLS}},
    )
    return finish(up, baseline=baseline, reasons=[scale, *reasons, *limits], recommended=recommended,
                  based_on=current)


def _sized_targets(
    *,
    sizing: Mapping[Pool, PoolSizing],
    saturation: Mapping[Pool, PoolSaturation] | None,
    fleet: FleetState,
    obs: Observation,
    cfg: DecisionConfig,
    now_s: float,
    current: Targets,
) -> tuple[Targets, list[Reason], Targets]:
    """(targets, reasons, recommendation before stabilization) from the sizing, relative to `current`."""
    reasons: list[Reason] = []
    missing = missing_load_metrics(obs)
    targets, r = sizing_targets(sizing=sizing, current=current, missing=missing)
    reasons += r
    partial = partial_metrics_gate(obs=obs, cfg=cfg)
    targets, r = hold_on_partial_metrics(targets, current=current, partial=partial)
    reasons += r
    idle = cfg.allow_scale_to_zero and not missing and partial is None and obs.num_requests == 0
    targets, r = apply_guardrail(targets, saturation=saturation, current=current, idle_scale_to_zero=idle)
    reasons += r
    targets, r = clamp_to_bounds(targets, cfg=cfg)
    reasons += r
    recommended = dict(targets)
    targets, r = stabilize_scale_down(
        targets, current=current, history=fleet.recent_targets, window_s=cfg.scale_down_stabilization_s, now_s=now_s
    )
    reasons += r
    targets, r = hold_scale_down_in_warmup(
        targets, current=current, history_intervals=None if obs.history is None else len(obs.history),
        min_intervals=cfg.scale_down_min_history_intervals,
    )
    reasons += r
    targets, r = limit_step(targets, current=current, max_step=cfg.max_step_replicas)
    reasons += r
    # Both rules above move toward current, which may itself sit outside bounds
    # changed since it was set: the bounds win.
    targets, r = clamp_to_bounds(targets, cfg=cfg)
    reasons += r
    targets, r = fit_gpu_budget(targets, gpus_per_replica=_gpus(fleet), cfg=cfg)
    reasons += r
    return targets, reasons, recommended


__all__ = [
    "apply_guardrail",
    "clamp_to_bounds",
    "current_targets",
    "decide",
    "decide_fast_path",
    "fast_path_cooldown_gate",
    "finish",
    "fit_gpu_budget",
    "hold_on_partial_metrics",
    "hold_scale_down_in_warmup",
    "in_flight_or_current",
    "limit_step",
    "missing_load_metrics",
    "partial_metrics_gate",
    "previous_decision_gate",
    "sizing_targets",
    "stabilize_scale_down",
    "stale_gate",
]
