"""The fleet a planner started with a warm-up trace keeps until it has filled its own stabilization window.

A planner that has been running holds, through HPA's window, the largest of its
recent recommendations; one just started has none, and sized on one quiet
minute it meets the next burst with the fleet it found (code tenants x8: 93.9%
against 99.2% from a running start, docs/control.md). With
`predictor.warmup_trace_path` the warm-up's last intervals stand in for the
runs before the first: each sized for its own load as the planner sizes a
forecast equal to it (with the burst basis, sizing.burst_basis, whatever
sizing.independent_burst_basis says), the window's share of them (its length
less the intervals already collected), the largest per pool; with a scale-down
floor (decision.scale_down_floor_s), its share of the largest over that longer
window too. `decide` raises a target below it
(`planner.decision.stabilization.start_from_warmup`), so a fresh fleet scales up to
where a running planner would have held it, and the floor fades as the
planner's own recommendations fill the window.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping

from planner.config import PlannerConfig
from planner.pipeline import has_load_data, history_for_prediction, interpolate_replicas, predict_load
from planner.latency.profile import EngineProfile
from planner.latency.ttft_view import TtftView
from planner.types import POOLS, Corrections, LoadHistory, Observation, StartFloor, Targets


def interval_load(history: LoadHistory, j: int) -> Observation:
    """Interval j of a load history as the collect step would have seen it, with the history up to it."""
    upto = history.upto(j + 1)

    def known(x: float) -> float | None:
        return None if math.isnan(x) else x

    return Observation(
        taken_at_s=history.t_s[j], interval_s=history.interval_s, num_requests=known(history.num_requests[j]),
        avg_isl_tokens=known(history.avg_isl_tokens[j]), avg_osl_tokens=known(history.avg_osl_tokens[j]),
        avg_ttft_ms=None, avg_itl_ms=None, history=upto,
        peak_rps=None if history.peak_rps is None else known(history.peak_rps[j]),
        peak_window_s=history.peak_window_s,
    )


def size_for_load(
    obs: Observation, cfg: PlannerConfig, profile: EngineProfile, *, ttft_view: TtftView | None = None
) -> Targets | None:
    """Replicas per pool the SLA sizing gives for a forecast equal to obs's own load, within the bounds.

    No latency correction (nothing measured it); None when obs has no load data."""
    constant = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"name": "constant"})})
    forecast = predict_load(obs, constant.predictor)
    sizing = interpolate_replicas(forecast, corrections=Corrections(), profile=profile, cfg=constant,
                                  ttft_view=ttft_view)
    if not sizing:
        return None
    bounds = {"prefill": cfg.decision.prefill, "decode": cfg.decision.decode}
    return {p: max(bounds[p].min_replicas, min(bounds[p].max_replicas, sizing[p].replicas)) for p in POOLS}


def warmup_floor(
    obs: Observation,
    warmup: LoadHistory | None,
    cfg: PlannerConfig,
    profile: EngineProfile,
    *,
    ttft_view: TtftView | None = None,
    sized: MutableMapping[int, Targets | None] | None = None,
) -> StartFloor | None:
    """The most replicas the warm-up's intervals in the stabilization window needed, per pool.

    warmup: the warm-up trace's per-interval load (predictor.warmup_trace_path, binned at the interval);
    None: no floor. The windows are the scale-down rules': the stabilization window (the longer of
    decision.scale_down_stabilization_s and independent_stabilization_s), and decision.scale_down_floor_s at
    scale_down_floor_frac of its highest; of each, the warm-up's last (its intervals less those obs's history
    holds) count. None once the collected history fills them, or when it holds no load data (a warm-up never
    stands in for absent metrics). sized: each warm-up interval's sizing by its index, one store per warm-up
    history and configuration (speed only: they size the same each run).
    """
    if warmup is None or len(warmup) == 0:
        return None
    live = history_for_prediction(obs)
    if not has_load_data(live):
        return None
    if cfg.sizing.independent_burst_basis is not None:
        # Sized at their busiest 15 s whatever the basis for independent arrivals: no correction factor
        # measured them, and a running planner's recommendation for a bursty interval carries the queueing
        # its correction read there (code tenants: flat sizing puts the warm-up hour's highest at 5-6 prefill
        # replicas where the running planner's reached 7-8).
        cfg = cfg.model_copy(update={"sizing": cfg.sizing.model_copy(update={"independent_burst_basis": None})})
    # Each window's share of the warm-up: its intervals less those collected, the newest last.
    windows = [(window_s, share, math.ceil(window_s / cfg.adjustment_interval_s - 1e-9) - len(live))
               for window_s, share in scale_down_windows(cfg)]
    longest_n = max(n for _, _, n in windows)
    # The longest window's intervals, each sized once: the shorter windows are their newest.
    tail = [_sized(j, warmup, cfg, profile, ttft_view, sized)
            for j in range(max(0, len(warmup) - longest_n), len(warmup))] if longest_n > 0 else []
    floor: Targets = {p: 0 for p in POOLS}
    counted, longest, frac = 0, 0.0, None
    for window_s, share, n in windows:
        sized_n = [t for t in tail[max(0, len(tail) - n):] if t is not None] if n > 0 else []
        if not sized_n:
            continue
        floor = {p: max(floor[p], math.ceil(share * max(t[p] for t in sized_n) - 1e-9)) for p in POOLS}
        if window_s > longest:
            counted, longest = len(sized_n), window_s
        if share < 1.0:
            frac = share
    if counted == 0:
        return None
    return StartFloor(targets=floor, intervals=counted, window_s=longest, floor_frac=frac)


def scale_down_windows(cfg: PlannerConfig) -> list[tuple[float, float]]:
    """(window, s; share of its highest recommendation a scale-down keeps) of the scale-down rules that hold
    at a recent recommendation: the stabilization window in force, and the scale-down floor if set."""
    d = cfg.decision
    windows = [(max(d.scale_down_stabilization_s, d.independent_stabilization_s or 0.0), 1.0)]
    if d.scale_down_floor_s:
        windows.append((d.scale_down_floor_s, d.scale_down_floor_frac))
    return windows


def _sized(j: int, warmup: LoadHistory, cfg: PlannerConfig, profile: EngineProfile, ttft_view: TtftView | None,
           sized: MutableMapping[int, Targets | None] | None) -> Targets | None:
    if sized is not None and j in sized:
        return sized[j]
    sized_j = size_for_load(interval_load(warmup, j), cfg, profile, ttft_view=ttft_view)
    if sized is not None:
        sized[j] = sized_j
    return sized_j


__all__ = ["interval_load", "scale_down_windows", "size_for_load", "warmup_floor"]
