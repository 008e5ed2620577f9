"""One planner interval without I/O: its steps and the order they run in.

correct → predict → interpolate → analyze saturation → decide, on inputs
already collected. `plan_steps` holds the order; the Prefect flow gives it each
step as a task (`Steps`), the simulator and the benchmarks call `plan_interval`,
which runs the plain functions, so all three share one decision path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from planner.signals.burst import expected_peak_ratio, recent_peaks
from planner.signals.clumping import recent_clumping_index, sizing_basis
from planner.config import DecisionConfig, PlannerConfig, PredictorConfig
from planner.latency.correct import correction_factors
from planner.decision.decide import decide
from planner.signals.length_shape import measure_length_shape
from planner.predict import forecast_next, prime_history
from planner.latency.profile import EngineProfile
from planner.saturation.guardrail import PoolSaturation, analyze_fleet
from planner.sizing.pools import resolve_engine_gpus, size_decode, size_prefill
from planner.latency.ttft_view import TtftView
from planner.types import (
    Corrections,
    Decision,
    FleetState,
    Forecast,
    LoadHistory,
    Observation,
    Pool,
    PoolSizing,
    StartFloor,
)
from planner.whatif import WhatIf, apply_what_if, effective_config


@dataclass(frozen=True)
class PlanResult:
    """Every intermediate value of one interval, for artifacts, metrics and tests."""

    observation: Observation
    fleet: FleetState
    corrections: Corrections
    forecast: Forecast | None
    sizing: Mapping[Pool, PoolSizing]
    saturation: Mapping[Pool, PoolSaturation] | None
    decision: Decision
    start_floor: StartFloor | None = None


def decision_config(cfg: PlannerConfig) -> DecisionConfig:
    """The decide step's settings: with the fast path on, a larger scale-up never waits for a pending one.

    A fast-path scale-up still starting would otherwise hold the scheduled
    run's larger one for decision.scale_up_past_pending_s (600 s): measured on
    azure_code x8 (copies +-30 s apart), 99.56% -> 97.49% SLA attainment.
    """
    if not cfg.fast_path.enabled:
        return cfg.decision
    return cfg.decision.model_copy(update={"scale_up_past_pending_s": 0.0})


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


def correct_latency(
    obs: Observation, *, fleet: FleetState, profile: EngineProfile, cfg: PlannerConfig,
    ttft_view: TtftView | None = None,
) -> Corrections:
    """Observed/expected latency factors, given the replicas that served the interval.

    ttft_view: the single-request TTFT sizing uses (planner.latency.ttft_view); None: the profile's.
    """
    return correction_factors(
        obs,
        profile=profile,
        decode_replicas=fleet.decode.current_replicas,
        cfg=cfg.correction,
        # with these two the prefill factor leaves queueing delay out (planner.latency.correct)
        prefill_replicas=fleet.prefill.current_replicas,
        sizing=cfg.sizing,
        ttft_view=ttft_view,
    )


def has_load_data(history: LoadHistory) -> bool:
    """True when at least one interval has a finite request count."""
    return any(math.isfinite(n) for n in history.num_requests)


def needs_warmup(obs: Observation, cfg: PredictorConfig) -> bool:
    """True when a warm-up trace is configured and the collected history is shorter than history_intervals."""
    return cfg.warmup_trace_path is not None and len(history_for_prediction(obs)) < cfg.history_intervals


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
    if cfg.size_on == "auto":
        index, index_note = recent_clumping_index(
            history, runs=cfg.clumping_runs, lookback_intervals=cfg.clumping_lookback_intervals,
            min_intervals=cfg.clumping_min_intervals, quantile=cfg.clumping_quantile)
        _, basis_note = sizing_basis(cfg.size_on, index, max_index=cfg.clumping_max_index)
        forecast = dataclasses.replace(forecast, clumping_index=index,
                                       notes=forecast.notes + (index_note, basis_note))
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
    size_on = sizing_basis(cfg.predictor.size_on, forecast.clumping_index,
                           max_index=cfg.predictor.clumping_max_index)[0]
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
    start_floor: what the warm-up trace's last window needed (planner.warmup_floor); None: none.
    """
    return decide(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=decision_config(cfg), now_s=now_s,
        fast_path=cfg.fast_path if fast_path else None, start_floor=start_floor,
    )


@dataclass(frozen=True)
class Steps:
    """How each step runs: the plain functions by default; the flow gives each as its Prefect task.

    Each takes the arguments of the function it defaults to (predict: obs and cfg;
    the caller binds the predictor's cache and warm-up history).
    """

    correct: Callable[..., Corrections] = correct_latency
    predict: Callable[..., Forecast | None] = predict_load
    interpolate: Callable[..., dict[Pool, PoolSizing]] = interpolate_replicas
    analyze_saturation: Callable[..., dict[Pool, PoolSaturation] | None] = analyze_fleet_saturation
    decide: Callable[..., Decision] = decide_targets


def plan_steps(
    obs: Observation,
    fleet: FleetState,
    cfg: PlannerConfig,
    profile: EngineProfile,
    *,
    now_s: float,
    steps: Steps = Steps(),
    fast_path: bool = False,
    previous: PlanResult | None = None,
    ttft_view: TtftView | None = None,
    start_floor: StartFloor | None = None,
) -> PlanResult:
    """Run the interval's steps in order on already-collected inputs (what-if already applied).

    previous: a plan of this same interval whose forecast and start floor are kept (the flow plans
    again when the fleet changed under it: the replicas moved, the load did not).
    start_floor: what the warm-up trace's last window needed (planner.warmup_floor); None: none.
    ttft_view: prefill's single-request TTFT for correct and interpolate alike
        (planner.latency.ttft_view: a published latency model); None: the profile's.
    """
    corrections = steps.correct(obs, fleet=fleet, profile=profile, cfg=cfg, ttft_view=ttft_view)
    forecast = steps.predict(obs, cfg=cfg.predictor) if previous is None else previous.forecast
    start_floor = start_floor if previous is None else previous.start_floor
    sizing = steps.interpolate(forecast, corrections=corrections, profile=profile, cfg=cfg, ttft_view=ttft_view)
    saturation = steps.analyze_saturation(obs, fleet=fleet, cfg=cfg, now_s=now_s)
    decision = steps.decide(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s, fast_path=fast_path,
        start_floor=start_floor,
    )
    return PlanResult(
        observation=obs,
        fleet=fleet,
        corrections=corrections,
        forecast=forecast,
        sizing=sizing,
        saturation=saturation,
        decision=decision,
        start_floor=start_floor,
    )


def plan_interval(
    obs: Observation,
    fleet: FleetState,
    cfg: PlannerConfig,
    profile: EngineProfile,
    *,
    now_s: float,
    what_if: WhatIf | None = None,
    predictor_cache: MutableMapping | None = None,
    fast_path: bool = False,
    ttft_view: TtftView | None = None,
    warmup: LoadHistory | None = None,
    start_floor: StartFloor | None = None,
) -> PlanResult:
    """Every step of one planner interval as plain calls (the simulator, the benchmarks).

    predictor_cache: speed-only store of fitted predictor state; losing it never
    changes a decision beyond noise.
    warmup: the warm-up trace's load (predictor.warmup_trace_path, binned), put
    before a collected history shorter than predictor.history_intervals, as the
    flow does.
    fast_path: a run the saturation trigger started between intervals: the
    decision is scale-up only, after cfg.fast_path.cooldown_s.
    ttft_view: prefill's single-request TTFT (planner.latency.ttft_view); None: the profile's.
    start_floor: what the warm-up's last window needed (planner.warmup_floor), as the flow passes it.
    """
    steps = Steps(predict=functools.partial(predict_load, cache=predictor_cache, warmup=warmup))
    return plan_steps(
        apply_what_if(obs, what_if), fleet, effective_config(cfg, what_if), profile,
        now_s=now_s, steps=steps, fast_path=fast_path, ttft_view=ttft_view, start_floor=start_floor,
    )
