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
    floor_scale_down  never below a share of a longer window's highest recommendation (optionally a larger
                     share for synchronised bursts: quiet spells and clumping arrivals)
    hold_scale_down_in_warmup  no scale-down on too short a load history
    start_from_warmup  no pool below what the warm-up trace's last window needed
    scale_to_zero    pools with min 0: to zero after a quiet period when a cold start costs less than it saves
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.config import DecisionConfig, FastPathConfig
from planner.decision.gates import (
    fast_path_cooldown_gate,
    missing_load_metrics,
    partial_metrics_gate,
    previous_decision_gate,
    stale_gate,
)
from planner.decision.rules import apply_guardrail, clamp_to_bounds, hold_on_partial_metrics, limit_step, sizing_targets
from planner.decision.gpu_budget import fit_gpu_budget
from planner.decision.scale_to_zero import ZeroCase, quiet_for_s, scale_to_zero, zero_pools
from planner.saturation.guardrail import PoolSaturation
from planner.signals.startup_time import startup_times
from planner.decision.stabilization import (
    floor_scale_down, floor_share, hold_scale_down_in_warmup, stabilize_scale_down, start_from_warmup,
)
from planner.types import (
    POOLS, Decision, FleetState, Observation, Pool, PoolSizing, Reason, ReasonCode, StartFloor, Step, Targets,
)


@dataclass(frozen=True)
class DecisionInputs:
    """What one decision reads; see `decide` for each field."""

    sizing: Mapping[Pool, PoolSizing]
    saturation: Mapping[Pool, PoolSaturation] | None
    fleet: FleetState
    obs: Observation
    cfg: DecisionConfig
    now_s: float


def current_targets(fleet: FleetState) -> Targets:
    """Replicas each pool has now, as the connector reports them."""
    return {p: getattr(fleet, p).current_replicas for p in POOLS}


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
    start_floor: StartFloor | None = None,
) -> Decision:
    """One interval's targets for both pools, with every reason and its numbers.

    sizing: replicas each pool needs for the SLA (a pool left out is held).
    saturation: the guardrail's verdict per pool; None when it is disabled.
    now_s: the run's clock, seconds, on the same clock as obs.taken_at_s and
        the decision history in `fleet`.
    fast_path: set for a run the saturation trigger started: scale-up only
        (`decide_fast_path`); None for a scheduled run.
    start_floor: what the warm-up trace's last window needed (planner.steps.size_warmup_floor), for a scheduled run of a
        planner that has not yet filled its own window; None: none.
    """
    read = DecisionInputs(sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s)
    if fast_path is not None:
        return decide_fast_path(read, fast_path=fast_path)
    _check_fleet(fleet)
    current = current_targets(fleet)

    hold, note = previous_decision_gate(fleet=fleet, cfg=cfg, now_s=now_s)
    if hold is not None:
        last = fleet.last_decision
        in_flight: Targets = {"prefill": last.prefill_replicas, "decode": last.decode_replicas}
        if hold.numbers["age_s"] >= cfg.scale_up_past_pending_s and stale_gate(obs=obs, cfg=cfg, now_s=now_s) is None:
            targets, reasons, recommended = _sized_targets(read, current=current)
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

    targets, sized, recommended = _sized_targets(read, current=current, start_floor=start_floor)
    return finish(targets, baseline=current, reasons=reasons + sized, recommended=recommended, based_on=current)


def in_flight_or_current(fleet: FleetState) -> tuple[Targets, bool]:
    """(targets, pending): the previous decision's while it is not done, else the current replicas."""
    last = fleet.last_decision
    if last is None or last.done:
        return current_targets(fleet), False
    return {"prefill": last.prefill_replicas, "decode": last.decode_replicas}, True


def decide_fast_path(read: DecisionInputs, *, fast_path: FastPathConfig) -> Decision:
    """Scale-up-only targets for a run the saturation trigger started between intervals.

    Each pool goes to max(set-or-in-flight, the interval rules' target): the
    previous decision's targets while it is not done (a scale-up still starting
    never blocks a larger one, and is never undone), else the current replicas.
    Nothing is written when the last applied decision is younger than
    fast_path.cooldown_s, on stale metrics, or when the bounds or the GPU budget
    would take a pool below what is set (the next scheduled run handles that).
    read.now_s: seconds, on the clock of obs and the decision history.
    """
    fleet, obs, cfg, now_s = read.fleet, read.obs, read.cfg, read.now_s
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
    targets, reasons, recommended = _sized_targets(read, current=current)
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
    read: DecisionInputs, *, current: Targets, start_floor: StartFloor | None = None,
) -> tuple[Targets, list[Reason], Targets]:
    """(targets, reasons, recommendation before stabilization) from the sizing, relative to `current`."""
    sizing, saturation, fleet, obs = read.sizing, read.saturation, read.fleet, read.obs
    cfg, now_s = read.cfg, read.now_s
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
    targets, r = stabilize_scale_down(targets, current=current, history=fleet.recent_targets, now_s=now_s,
                                      **_hold(sizing, cfg))
    reasons += r
    floor_s, floor_frac, why = _floor(sizing, obs, cfg, now_s=now_s)
    targets, r = floor_scale_down(targets, current=current, history=fleet.recent_targets, now_s=now_s,
                                  window_s=floor_s, frac=floor_frac, why=why)
    reasons += r
    targets, r = hold_scale_down_in_warmup(
        targets, current=current, history_intervals=None if obs.history is None else len(obs.history),
        min_intervals=cfg.scale_down_min_history_intervals,
    )
    reasons += r
    targets, r = start_from_warmup(targets, floor=start_floor)
    reasons += r
    targets, r = scale_to_zero(
        targets, current=current,
        zero_pools=zero_pools(allow=cfg.allow_scale_to_zero, min_replicas={p: getattr(cfg, p).min_replicas
                                                                          for p in POOLS}),
        case=None if missing or partial is not None else _zero_case(sizing, fleet=fleet, obs=obs),
        quiet_needed_s=cfg.scale_to_zero.quiet_s, late_request_cost_gpu_h=cfg.scale_to_zero.late_request_cost_gpu_h)
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


def _zero_case(sizing: Mapping[Pool, PoolSizing], *, fleet: FleetState, obs: Observation) -> ZeroCase | None:
    """The scale-to-zero rule's numbers from the sizing (upper forecast, TTFT target, configured startup) and the
    fleet's history (measured startup); None when a pool has no sizing."""
    if any(p not in sizing for p in POOLS) or "ttft_target_ms" not in sizing["prefill"].numbers:
        return None
    numbers = sizing["prefill"].numbers
    return ZeroCase(
        quiet_s=quiet_for_s(obs.history, num_requests=obs.num_requests),
        upper_rps=float(numbers["forecast_upper_rps"]),
        ttft_target_s=float(numbers["ttft_target_ms"]) / 1000.0,
        interval_s=obs.interval_s,
        startup=startup_times(applied=fleet.applied_targets, ready=fleet.ready_history,
                              configured_s=float(numbers["replica_startup_s"])),
        gpus_per_replica=_gpus(fleet),
    )


def _floor(sizing: Mapping[Pool, PoolSizing], obs: Observation, cfg: DecisionConfig, *,
           now_s: float) -> tuple[float | None, float, str]:
    """The scale-down floor's (window s or None: off, share kept, why that share), by floor_share's rule on this
    run's sizing (sized on the upper forecast: arrivals clump) and the window's collected arrivals."""
    window_s = cfg.scale_down_floor_s
    if not window_s:
        return window_s, cfg.scale_down_floor_frac, ""
    clumping = bool(sizing) and any(s.numbers.get("sized_on_mean") == 0.0 for s in sizing.values())
    frac, why = floor_share(cfg, clumping=clumping, history=obs.history, since_s=now_s - window_s)
    return window_s, frac, why


def _hold(sizing: Mapping[Pool, PoolSizing], cfg: DecisionConfig) -> dict:
    """The stabilization window and rank: the recurrence hold when both pools were sized on the mean forecast
    (arrivals look independent) and it is configured, else HPA's highest over scale_down_stabilization_s."""
    independent = bool(sizing) and all(s.numbers.get("sized_on_mean") == 1.0 for s in sizing.values())
    if independent and cfg.independent_stabilization_s is not None:
        return dict(window_s=cfg.independent_stabilization_s, rank=cfg.independent_stabilization_rank,
                    why=" (sized on the mean forecast: arrivals look independent)")
    return dict(window_s=cfg.scale_down_stabilization_s)


__all__ = ["DecisionInputs", "current_targets", "decide", "decide_fast_path", "finish", "in_flight_or_current"]
