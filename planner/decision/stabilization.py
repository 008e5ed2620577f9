"""Scale-down damping: rules that hold a scale-down the evidence does not yet support.

HPA's stabilization window (down only to the highest recent recommendation),
the scale-down floor (never below a share of a longer window's highest), the
warm-up hold (no scale-down on too short a load history) and the warm-up
trace's start floor (no pool below what its last window needed, while it stands
in for the planner's own). Scale-ups are never delayed. Each rule returns the
new targets and its reasons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from planner.config import DecisionConfig
from planner.signals.quiet_spells import had_quiet_spell
from planner.types import POOLS, LoadHistory, Reason, ReasonCode, StartFloor, Step, Targets


def stabilize_scale_down(
    targets: Targets,
    *,
    current: Targets,
    history: Sequence[tuple[float, int, int]],
    window_s: float,
    now_s: float,
    rank: int = 1,
    why: str = "",
) -> Step:
    """Scale down only to the highest recommendation of the last window_s seconds (never above current).

    history: (decided_at_s, prefill, decode) recommendations of earlier runs;
    the caller rebuilds it from stored decisions (Decision.recommended_*). An
    entry stamped after now_s (clock skew) counts as recent. Scale-ups are not
    delayed. rank k > 1: only to the k-th highest, the largest target that k of
    the window's recommendations reached (fewer entries: the lowest of them);
    why: said in the reason after the window.
    """
    if window_s <= 0:
        return dict(targets), []
    if rank < 1:
        raise ValueError(f"stabilize_scale_down: rank must be >= 1, got {rank!r}")
    which = "highest recommendation" if rank == 1 else f"largest target {rank} recommendations reached"

    def reason(pool: str, t: int, held: int, level: int, ranked: list[int], entries: int) -> Reason:
        return Reason(ReasonCode.STABILIZATION_WINDOW, pool,
                      f"{pool}: scale-down to {t} held at {held}: {which} in the last {window_s:.0f} s{why} was "
                      f"{level}",
                      {"recommended_replicas": float(t), "window_max_replicas": float(ranked[0]),
                       "window_held_replicas": float(level), "window_rank": float(rank),
                       "window_s": window_s, "window_entries": float(entries)})

    return _hold_scale_downs(targets, current=current, history=history, window_s=window_s, now_s=now_s,
                             level=lambda ranked: ranked[min(rank, len(ranked)) - 1], reason=reason)


def _hold_scale_downs(targets: Targets, *, current: Targets, history: Sequence[tuple[float, int, int]],
                      window_s: float, now_s: float, level: Callable[[list[int]], int],
                      reason: Callable[..., Reason]) -> Step:
    """Each pool's scale-down held at level(its recommendations of the last window_s seconds, highest first),
    never above current; reason(pool, target, held, level, ranked, entries) explains a held one."""
    out = dict(targets)
    reasons: list[Reason] = []
    recent = [entry for entry in history if entry[0] > now_s - window_s]
    for i, pool in enumerate(POOLS):
        t, c = targets[pool], current[pool]
        if t >= c or not recent:
            continue
        ranked = sorted((int(entry[1 + i]) for entry in recent), reverse=True)
        at = level(ranked)
        held = min(c, max(t, at))
        if held != t:
            out[pool] = held
            reasons.append(reason(pool, t, held, at, ranked, len(recent)))
    return out, reasons


def floor_scale_down(
    targets: Targets,
    *,
    current: Targets,
    history: Sequence[tuple[float, int, int]],
    window_s: float | None,
    frac: float,
    now_s: float,
    why: str = "",
) -> Step:
    """Scale down no lower than frac of the highest recommendation of the last window_s seconds (never above
    current). None: off. why: said in the reason after the window (why this share).

    The stabilization window holds a burst's size for minutes; bursty tenants come back after longer quiet
    spells, and a pool that fell to the quiet minutes' size meets them with a fraction of what they need (code
    tenants x8: 3 prefill replicas for a burst that needs 6 lose 1,300 of its 3,300 requests, 4 lose 250).
    history: (decided_at_s, prefill, decode) recommendations, as for stabilize_scale_down.
    """
    if not window_s:
        return dict(targets), []

    def reason(pool: str, t: int, held: int, level: int, ranked: list[int], entries: int) -> Reason:
        return Reason(ReasonCode.SCALE_DOWN_FLOOR, pool,
                      f"{pool}: scale-down to {t} held at {held}: {frac:.0%} of the highest recommendation in the "
                      f"last {window_s:.0f} s ({ranked[0]}){why}",
                      {"recommended_replicas": float(t), "window_max_replicas": float(ranked[0]),
                       "floor_frac": frac, "window_s": window_s, "window_entries": float(entries)})

    return _hold_scale_downs(targets, current=current, history=history, window_s=window_s, now_s=now_s,
                             level=lambda ranked: math.ceil(frac * ranked[0] - 1e-9), reason=reason)


def floor_share(cfg: DecisionConfig, *, clumping: bool, history: LoadHistory | None,
                since_s: float) -> tuple[float, str]:
    """The scale-down floor's share of its window's highest and why (said after the window in the reason; "" when
    the burst share is not configured): decision.scale_down_floor_burst_frac while arrivals come in synchronised
    bursts (sizing took the upper forecast, clumping, and the window's arrivals had quiet spells,
    planner.signals.quiet_spells), else scale_down_floor_frac. The running planner's floor (decide) and a first
    run's warm start (planner.steps.size_warmup_floor) both take it from here.

    history: the per-interval load the quiet spells are read from, those intervals ending after since_s."""
    frac = cfg.scale_down_floor_frac
    if cfg.scale_down_floor_burst_frac is None or cfg.scale_down_floor_quiet_share is None:
        return frac, ""
    if not clumping:
        return frac, " (arrivals look independent: sized on the mean forecast)"
    quiet, share = had_quiet_spell(history, since_s=since_s, max_share=cfg.scale_down_floor_quiet_share)
    if not quiet:
        return frac, (f" (arrivals clump but no quiet spells: its 10th-percentile interval {share:.0%} of its "
                      f"busiest, > {cfg.scale_down_floor_quiet_share:.0%})")
    seen = "too little history to tell" if share is None else (
        f"its 10th-percentile interval {share:.0%} of its busiest, <= {cfg.scale_down_floor_quiet_share:.0%}")
    return cfg.scale_down_floor_burst_frac, f" (synchronised bursts: arrivals clump, quiet spells: {seen})"


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


def start_from_warmup(targets: Targets, *, floor: StartFloor | None) -> Step:
    """No pool below what the warm-up trace's last intervals needed, while they stand in for the planner's own
    window (a planner just started with predictor.warmup_trace_path). May scale up: a fresh fleet starts
    where a planner that had been running would have held it. None: the rule does not apply."""
    out = dict(targets)
    reasons: list[Reason] = []
    if floor is None:
        return out, reasons
    for pool in POOLS:
        t, f = targets[pool], floor.targets[pool]
        if t < f:
            out[pool] = f
            reasons.append(
                Reason(ReasonCode.WARMUP_START_FLOOR, pool,
                       f"{pool}: {t} raised to {f}: {floor.source}'s last {floor.intervals} intervals, standing in "
                       f"for the {floor.window_s:.0f} s window the planner has not yet filled, needed up to {f}"
                       + ("" if floor.floor_frac is None else
                          f" (the scale-down floor's {floor.floor_frac:.0%} of their highest counted"
                          f"{floor.floor_why.replace(' (', ': ', 1).rstrip(')') if floor.floor_why else ''})"),
                       {"recommended_replicas": float(t), "warmup_floor_replicas": float(f),
                        "warmup_intervals": float(floor.intervals), "window_s": floor.window_s})
            )
    return out, reasons


__all__ = ["floor_scale_down", "floor_share", "hold_scale_down_in_warmup", "stabilize_scale_down", "start_from_warmup"]
