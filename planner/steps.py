"""The planner's steps, each a pure function over inputs already collected.

correct → predict → warm-up floor → interpolate → analyze saturation → decide. The pipeline
(planner.pipeline) runs them in that order; the planner flow runs each as its Prefect task of the same
name (tasks/), the simulator and the benchmarks call them as they are. Each step's result carries what
the next ones need: the forecast carries the sizing basis (mean or p90) the predict step chose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping

from planner.config import DecisionConfig, PlannerConfig, PredictorConfig
from planner.decision.decide import decide
from planner.decision.stabilization import floor_share
from planner.latency.correct import correction_factors
from planner.latency.profile import EngineProfile
from planner.latency.served import interval_replicas
from planner.latency.ttft_view import TtftView
from planner.predict import forecast_next, prime_history
from planner.saturation.guardrail import PoolSaturation, analyze_fleet
from planner.signals.burst import expected_peak_ratio, recent_peaks
from planner.signals.clumping import recent_clumping_index, sizing_basis
from planner.signals.length_shape import measure_length_shape
from planner.sizing.pools import resolve_engine_gpus, size_decode, size_prefill
from planner.types import (
    POOLS,
    Corrections,
    Decision,
    FleetState,
    Forecast,
    LoadHistory,
    Observation,
    Pool,
    PoolSizing,
    StartFloor,
    Targets,
)


# -- inputs of the steps --------------------------------------------------------------------------------

def history_for_prediction(obs: Observation) -> LoadHistory:
    """The load series the predictor fits: the range-query history, or just this interval."""
    if obs.history is not None and len(obs.history) > 0:
        return obs.history
    nan = float("nan")
    return LoadHistory(
        t_s=(obs.taken_at_s,),
        num_requests=(obs.num_requests if obs.num_requests is not None else nan,),
        avg_isl_tokens=(obs.avg_isl_tokens if obs.avg_isl_tokens is not None else nan,),
        avg_osl_tokens=(obs.avg_osl_tokens if obs.avg_osl_tokens is not None else nan,),
        interval_s=obs.interval_s,
        peak_rps=None if obs.peak_window_s is None else (obs.peak_rps if obs.peak_rps is not None else nan,),
        peak_window_s=obs.peak_window_s,
    )


def has_load_data(history: LoadHistory) -> bool:
    """True when at least one interval has a finite request count."""
    return any(math.isfinite(n) for n in history.num_requests)


def needs_warmup(obs: Observation, cfg: PredictorConfig) -> bool:
    """True when a warm-up trace is configured and the collected history is shorter than history_intervals."""
    return cfg.warmup_trace_path is not None and len(history_for_prediction(obs)) < cfg.history_intervals


def decision_config(cfg: PlannerConfig) -> DecisionConfig:
    """The decide step's settings: with the fast path on, a larger scale-up never waits for a pending one.

    A fast-path scale-up still starting would otherwise hold the scheduled
    run's larger one for decision.scale_up_past_pending_s (600 s): measured on
    azure_code x8 (copies +-30 s apart), 99.56% -> 97.49% SLA attainment.
    """
    if not cfg.fast_path.enabled:
        return cfg.decision
    return cfg.decision.model_copy(update={"scale_up_past_pending_s": 0.0})


# -- the steps, in the order the pipeline runs them ------------------------------------------------------

def correct_latency(
    obs: Observation, *, fleet: FleetState, profile: EngineProfile, cfg: PlannerConfig,
    ttft_view: TtftView | None = None,
) -> Corrections:
    """Observed/expected latency factors, given the replicas that served the interval.

    correction.replicas "served": the time-weighted ready replicas over the interval, rebuilt from the fleet's
    applied decisions (planner.latency.served); "current": the replicas the fleet has now.
    ttft_view: the single-request TTFT sizing uses (planner.latency.ttft_view); None: the profile's.
    """
    if cfg.correction.replicas == "served":
        replicas, note = interval_replicas(fleet, end_s=obs.taken_at_s, interval_s=obs.interval_s,
                                           startup_s=cfg.sizing.replica_startup_s)
    else:
        replicas, note = {p: float(getattr(fleet, p).current_replicas) for p in POOLS}, None
    corrections = correction_factors(
        obs,
        profile=profile,
        decode_replicas=replicas["decode"],
        cfg=cfg.correction,
        # with these two the prefill factor leaves queueing delay out (planner.latency.correct); the queue
        # model counts whole servers: the time-weighted replicas to the nearest (0: a fleet without prefill
        # workers, whose TTFT holds no prefill queue to leave out)
        prefill_replicas=int(math.floor(replicas["prefill"] + 0.5)),
        sizing=cfg.sizing,
        ttft_view=ttft_view,
        isl_cv=(correction_isl_cv(obs, cfg) if cfg.correction.prefill_expected == "length_mix"
                else 0.0 if cfg.correction.prefill_expected == "mean_prompt_extrapolated" else None),
    )
    if note is None or not corrections.enabled:
        return corrections
    return dataclasses.replace(corrections, notes=corrections.notes + (note,))


def correction_isl_cv(obs: Observation, cfg: PlannerConfig) -> float:
    """The prompt-length CV sizing will use on this run's forecast, for the correction's expectation: the one
    measured from the interval's length histograms under sizing.length_cv "measured" (as predict_load measures
    it), else sizing.isl_cv."""
    if cfg.sizing.length_cv == "measured" and obs.isl_histogram is not None:
        shape, _ = measure_length_shape(obs.isl_histogram, obs.osl_histogram,
                                        min_requests=cfg.predictor.length_shape_min_requests)
        if shape is not None:
            return shape.isl_cv
    return cfg.sizing.isl_cv


def predict_load(
    obs: Observation,
    cfg: PredictorConfig,
    *,
    cache: MutableMapping | None = None,
    warmup: LoadHistory | None = None,
) -> Forecast | None:
    """The next-interval forecast, or None when there is no load data to forecast from.

    With no data the sizing step is skipped and the decision holds (it never
    shrinks the fleet because metrics are absent); a warm-up history never
    stands in for absent metrics. warmup: per-interval load of a trace (same
    interval), put before a collected history shorter than
    cfg.history_intervals, the total kept to that many intervals.
    """
    history = history_for_prediction(obs)
    if not has_load_data(history):
        return None
    warm_note = ()
    if warmup is not None and len(warmup) > 0 and len(history) < cfg.history_intervals:
        collected = len(history)
        history = prime_history(warmup, history, max_intervals=cfg.history_intervals)
        warm_note = (f"warm-up trace: {len(history) - collected} intervals before the {collected} collected",)
    forecast = forecast_next(history, cfg, cache=cache)
    shape, shape_note = None, ()
    if obs.isl_histogram is not None:
        shape, note = measure_length_shape(obs.isl_histogram, obs.osl_histogram,
                                           min_requests=cfg.length_shape_min_requests)
        shape_note = (note,)
    forecast = dataclasses.replace(forecast, notes=warm_note + forecast.notes + shape_note, length_shape=shape)
    # The sizing basis is decided here, once, and travels on the forecast (interpolate and the run's record read it).
    if cfg.size_on == "auto":
        index, index_note = recent_clumping_index(
            history, runs=cfg.clumping_runs, lookback_intervals=cfg.clumping_lookback_intervals,
            min_intervals=cfg.clumping_min_intervals, quantile=cfg.clumping_quantile)
        sized_on, basis_note = sizing_basis(cfg.size_on, index, max_index=cfg.clumping_max_index)
        forecast = dataclasses.replace(forecast, clumping_index=index, sized_on=sized_on,
                                       notes=forecast.notes + (index_note, basis_note))
    else:
        forecast = dataclasses.replace(forecast, sized_on=cfg.size_on)
    if cfg.burst_lookback_intervals < 1:
        return forecast
    ratio, note = expected_peak_ratio(history, lookback_intervals=cfg.burst_lookback_intervals)
    return dataclasses.replace(
        forecast,
        peak_ratio=ratio,
        peak_window_s=history.peak_window_s if ratio is not None else None,
        recent_peaks=recent_peaks(history, lookback_intervals=cfg.burst_lookback_intervals),
        notes=forecast.notes + (note,),
    )


def size_warmup_floor(
    obs: Observation,
    warmup: LoadHistory | None,
    cfg: PlannerConfig,
    profile: EngineProfile,
    *,
    ttft_view: TtftView | None = None,
    sized: MutableMapping[int, Targets | None] | None = None,
    own_intervals: int | None = None,
    source: str = "the warm-up trace",
    corrections: Corrections | None = None,
    sized_on: str | None = None,
) -> StartFloor | None:
    """The warm-up floor step: the most replicas the warm-up's intervals in the stabilization window needed, per pool.

    A planner that has been running holds, through HPA's window, the largest of its recent recommendations;
    one just started has none, and sized on one quiet minute it meets the next burst with the fleet it found
    (code tenants x8: 93.9% against 99.2% from a running start, docs/control.md). The warm-up's last
    intervals stand in for the runs before the first: each sized for its own load as the planner sizes a
    forecast equal to it, the window's share of them, the largest per pool. `decide` raises a target below
    it (planner.decision.stabilization.start_from_warmup), and the floor fades as the planner's own
    recommendations fill the window.

    warmup: the warm-up trace's per-interval load (predictor.warmup_trace_path, binned at the interval);
    None: no floor. The windows are the scale-down rules': the stabilization window (the longer of
    decision.scale_down_stabilization_s and independent_stabilization_s), and decision.scale_down_floor_s at
    scale_down_floor_frac of its highest; of each, the warm-up's last (its intervals less those obs's history
    holds) count. None once the collected history fills them, or when it holds no load data (a warm-up never
    stands in for absent metrics). sized: each warm-up interval's sizing by its index, one store per warm-up
    history and configuration (speed only: they size the same each run). own_intervals: how many of each
    window's intervals the planner's own runs fill, this one included (history_warm_start); None: those the
    collected history holds (a warm-up trace before a history that began with the planner). source: what the
    warm-up is, for the decision's reason. corrections: the latency factors the intervals are sized with (the
    deployment's own history: this run's, what a running planner applied lately); None: none (a trace's load
    was never served by this fleet). sized_on: this run's forecast's basis (Forecast.sized_on, the predict step's):
    with the warm-up's quiet spells over the floor's window it picks the floor's share as a running planner's
    floor does (planner.decision.stabilization.floor_share: all of the highest while arrivals come in
    synchronised bursts); None: no forecast, the flat scale_down_floor_frac.
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
    own = len(live) if own_intervals is None else own_intervals
    windows = [(window_s, share, math.ceil(window_s / cfg.adjustment_interval_s - 1e-9) - own)
               for window_s, share in scale_down_windows(cfg)]
    floor_why = ""
    if cfg.decision.scale_down_floor_s:
        # The floor's window (scale_down_windows' last): its share by the running floor's rule, on the warm-up
        # intervals standing in for it.
        window_s, _, n = windows[-1]
        since_s = warmup.t_s[-1] - max(n, 0) * warmup.interval_s
        share, floor_why = floor_share(cfg.decision, clumping=sized_on is not None and sized_on != "mean",
                                       history=warmup, since_s=since_s)
        windows[-1] = (window_s, share, n)
    longest_n = max(n for _, _, n in windows)
    # The longest window's intervals, each sized once: the shorter windows are their newest.
    tail = [_sized(j, warmup, cfg, profile, ttft_view, sized, corrections)
            for j in range(max(0, len(warmup) - longest_n), len(warmup))] if longest_n > 0 else []
    floor: Targets = {p: 0 for p in POOLS}
    counted, longest, frac, why = 0, 0.0, None, ""
    for i, (window_s, share, n) in enumerate(windows):
        sized_n = [t for t in tail[max(0, len(tail) - n):] if t is not None] if n > 0 else []
        if not sized_n:
            continue
        floor = {p: max(floor[p], math.ceil(share * max(t[p] for t in sized_n) - 1e-9)) for p in POOLS}
        if window_s > longest:
            counted, longest = len(sized_n), window_s
        if i > 0:  # the scale-down floor's window
            frac, why = share, floor_why
    if counted == 0:
        return None
    return StartFloor(targets=floor, intervals=counted, window_s=longest, floor_frac=frac, source=source,
                      floor_why=why)


def history_warm_start(
    obs: Observation, fleet: FleetState, cfg: PlannerConfig, *, now_s: float,
) -> tuple[LoadHistory | None, str]:
    """The warm start from the collected history: a planner's first run reads the hour before from Prometheus.

    A planner that has been running holds, through its scale-down windows, what its recent runs recommended; one
    just started has no runs, but Prometheus holds the deployment's load over those minutes. Their intervals
    stand in for the runs it has not made, as a warm-up trace's do (size_warmup_floor, with this run as its only
    own), so the first run decides as a running planner would; the first run records the floored targets as its
    recommendation (plan_steps), which the scale-down windows then hold as they hold any run's.

    Returns (the collected intervals before this run's, or None; a note for the run). None when the fleet has a
    recorded recommendation or decision (not a first run; the note is empty) or the history holds no load before
    this run (a cold start, said in the note). now_s: this run's time, s.
    """
    if fleet.recent_targets or fleet.last_decision is not None:
        return None, ""
    history = history_for_prediction(obs)
    # The interval ending at this run is its own; those before stand in for runs it has not made.
    before = history.upto(sum(1 for t in history.t_s if t < now_s - cfg.adjustment_interval_s / 2))
    if not has_load_data(before):
        return None, ("cold start: the collected history holds no load before this first run (nothing stands in "
                      "for the scale-down window of a planner that had been running)")
    return before, (f"warm start: first run; the collected history's {len(before)} intervals before it stand in "
                    f"for the runs of a planner that had been running")


def interpolate_replicas(
    forecast: Forecast | None,
    *,
    corrections: Corrections,
    profile: EngineProfile,
    cfg: PlannerConfig,
    ttft_view: TtftView | None = None,
) -> dict[Pool, PoolSizing]:
    """Replicas each pool needs for the SLA at the forecast load, from the profile's interpolation.

    Empty without a forecast: `decide` then holds both pools.
    ttft_view: prefill's single-request TTFT (planner.latency.ttft_view); None: the profile's.
    """
    if forecast is None:
        return {}
    size_on = forecast.sized_on  # decided by the predict step
    sizing_cfg = cfg.sizing
    if size_on == "mean" and sizing_cfg.independent_burst_basis is not None:
        sizing_cfg = sizing_cfg.model_copy(update={"burst_basis": sizing_cfg.independent_burst_basis})
    common = dict(
        corrections=corrections,
        slo=cfg.slo,
        cfg=resolve_engine_gpus(
            sizing_cfg, prefill=profile.gpus_per_prefill_engine, decode=profile.gpus_per_decode_engine
        ),
        interval_s=cfg.adjustment_interval_s,
        size_on=size_on,
    )
    return {
        "prefill": size_prefill(forecast, profile=profile.prefill, ttft_view=ttft_view, **common),
        "decode": size_decode(forecast, profile=profile.decode, **common),
    }


def analyze_fleet_saturation(
    obs: Observation, *, fleet: FleetState, cfg: PlannerConfig, now_s: float
) -> dict[Pool, PoolSaturation] | None:
    """The saturation guardrail per pool, or None when it is switched off (planner.saturation.guardrail analyzes one pool)."""
    return analyze_fleet(
        obs=obs,
        fleet=fleet,
        saturation_cfg=cfg.saturation,
        decision_cfg=cfg.decision,
        model_id=cfg.model_id,
        namespace=cfg.namespace,
        now_s=now_s,
    )


def decide_targets(
    *,
    sizing: Mapping[Pool, PoolSizing],
    saturation: Mapping[Pool, PoolSaturation] | None,
    fleet: FleetState,
    obs: Observation,
    cfg: PlannerConfig,
    now_s: float,
    fast_path: bool = False,
    start_floor: StartFloor | None = None,
) -> Decision:
    """Targets per pool: bounds, GPU budget, stabilization and transitions (planner.decision.decide).

    fast_path: a run the saturation trigger started between intervals: the
    decision is scale-up only, after cfg.fast_path.cooldown_s.
    start_floor: what the warm-up trace's last window needed (size_warmup_floor); None: none.
    """
    return decide(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=decision_config(cfg), now_s=now_s,
        fast_path=cfg.fast_path if fast_path else None, start_floor=start_floor,
    )


# -- the warm-up floor's sizing --------------------------------------------------------------------------

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
    obs: Observation, cfg: PlannerConfig, profile: EngineProfile, *, ttft_view: TtftView | None = None,
    corrections: Corrections | None = None,
) -> Targets | None:
    """Replicas per pool the SLA sizing gives for a forecast equal to obs's own load, within the bounds.

    corrections: latency factors to size with; None: none (nothing measured them). None when obs has no load
    data."""
    constant = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"name": "constant"})})
    forecast = predict_load(obs, constant.predictor)
    sizing = interpolate_replicas(forecast, corrections=corrections or Corrections(), profile=profile, cfg=constant,
                                  ttft_view=ttft_view)
    if not sizing:
        return None
    bounds = {"prefill": cfg.decision.prefill, "decode": cfg.decision.decode}
    return {p: max(bounds[p].min_replicas, min(bounds[p].max_replicas, sizing[p].replicas)) for p in POOLS}


def scale_down_windows(cfg: PlannerConfig) -> list[tuple[float, float]]:
    """(window, s; share of its highest recommendation a scale-down keeps) of the scale-down rules that hold
    at a recent recommendation: the stabilization window in force, and the scale-down floor if set."""
    d = cfg.decision
    windows = [(max(d.scale_down_stabilization_s, d.independent_stabilization_s or 0.0), 1.0)]
    if d.scale_down_floor_s:
        windows.append((d.scale_down_floor_s, d.scale_down_floor_frac))
    return windows


def _sized(j: int, warmup: LoadHistory, cfg: PlannerConfig, profile: EngineProfile, ttft_view: TtftView | None,
           sized: MutableMapping[int, Targets | None] | None, corrections: Corrections | None) -> Targets | None:
    if sized is not None and j in sized:
        return sized[j]
    sized_j = size_for_load(interval_load(warmup, j), cfg, profile, ttft_view=ttft_view, corrections=corrections)
    if sized is not None:
        sized[j] = sized_j
    return sized_j
