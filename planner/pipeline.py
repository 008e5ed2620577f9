"""One planner interval end to end, without I/O: correct, predict, size, saturation, decide.

The Prefect flow runs these same step functions as separate tasks; the
simulator and the benchmarks call `plan_interval`, which chains them in the
same order, so all three share one decision path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from planner.burst import expected_peak_ratio, recent_peaks
from planner.config import DecisionConfig, PlannerConfig, PredictorConfig, SloTarget
from planner.correct import correction_factors
from planner.decide import decide
from planner.predict import forecast_next, prime_history
from planner.profile import EngineProfile
from planner.saturation import PoolSaturation, analyze_fleet
from planner.sizing import resolve_engine_gpus, size_decode, size_prefill
from planner.types import (
    Corrections,
    Decision,
    FleetState,
    Forecast,
    LoadHistory,
    Observation,
    Pool,
    PoolSizing,
)


@dataclass(frozen=True)
class WhatIf:
    """Overrides for a manual "what would the planner do if..." run.

    load_multiplier: scales observed and historical request counts (1.0 = as observed).
    slo: replaces the configured SLA targets when set.
    """

    load_multiplier: float = 1.0
    slo: SloTarget | None = None

    def __post_init__(self) -> None:
        if not self.load_multiplier > 0:
            raise ValueError(f"what-if: load_multiplier must be > 0, got {self.load_multiplier}")


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


def apply_what_if(obs: Observation, what_if: WhatIf | None) -> Observation:
    """Scale the observed load by the what-if multiplier (latencies stay as observed)."""
    if what_if is None or what_if.load_multiplier == 1.0:
        return obs
    k = what_if.load_multiplier
    history = obs.history
    if history is not None:
        history = dataclasses.replace(
            history,
            num_requests=tuple(n * k for n in history.num_requests),
            # peaks scale with the load, so the burst ratio stays as observed
            peak_rps=None if history.peak_rps is None else tuple(p * k for p in history.peak_rps),
        )
    return dataclasses.replace(
        obs,
        num_requests=None if obs.num_requests is None else obs.num_requests * k,
        peak_rps=None if obs.peak_rps is None else obs.peak_rps * k,
        history=history,
    )


def effective_config(cfg: PlannerConfig, what_if: WhatIf | None) -> PlannerConfig:
    """The configuration a run uses after what-if overrides."""
    if what_if is None or what_if.slo is None:
        return cfg
    return cfg.model_copy(update={"slo": what_if.slo})


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
    obs: Observation, *, fleet: FleetState, profile: EngineProfile, cfg: PlannerConfig
) -> Corrections:
    """Observed/expected latency factors, given the replicas that served the interval."""
    return correction_factors(
        obs,
        profile=profile,
        decode_replicas=fleet.decode.current_replicas,
        cfg=cfg.correction,
        # with these two the prefill factor leaves queueing delay out (planner.correct)
        prefill_replicas=fleet.prefill.current_replicas,
        sizing=cfg.sizing,
    )


def has_load_data(history: LoadHistory) -> bool:
    """True when at least one interval has a finite request count."""
    return any(math.isfinite(n) for n in history.num_requests)


def needs_warmup(obs: Observation, cfg: PredictorConfig) -> bool:
    """True when a warm-up trace is configured and the collected history is shorter than history_intervals."""
    return cfg.warmup_trace_path is not None and len(history_for_prediction(obs)) < cfg.history_intervals


def predict_next(
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
    forecast = dataclasses.replace(forecast, notes=warm_note + forecast.notes)
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


def size_pools(
    forecast: Forecast | None,
    *,
    corrections: Corrections,
    profile: EngineProfile,
    cfg: PlannerConfig,
) -> dict[Pool, PoolSizing]:
    """Replicas each pool needs for the SLA at the forecast load (the interpolate step).

    Empty without a forecast: `decide` then holds both pools.
    """
    if forecast is None:
        return {}
    common = dict(
        corrections=corrections,
        slo=cfg.slo,
        cfg=resolve_engine_gpus(
            cfg.sizing, prefill=profile.gpus_per_prefill_engine, decode=profile.gpus_per_decode_engine
        ),
        interval_s=cfg.adjustment_interval_s,
        size_on=cfg.predictor.size_on,
    )
    return {
        "prefill": size_prefill(forecast, profile=profile.prefill, **common),
        "decode": size_decode(forecast, profile=profile.decode, **common),
    }


def analyze_saturation(
    obs: Observation, fleet: FleetState, cfg: PlannerConfig, *, now_s: float
) -> dict[Pool, PoolSaturation] | None:
    """The saturation guardrail per pool, or None when it is switched off."""
    return analyze_fleet(
        obs=obs,
        fleet=fleet,
        saturation_cfg=cfg.saturation,
        decision_cfg=cfg.decision,
        model_id=cfg.model_id,
        namespace=cfg.namespace,
        now_s=now_s,
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
) -> PlanResult:
    """Run every step of one planner interval on already-collected inputs.

    predictor_cache: speed-only store of fitted predictor state; losing it never
    changes a decision beyond noise.
    fast_path: a run the saturation trigger started between intervals: the
    decision is scale-up only, after cfg.fast_path.cooldown_s.
    """
    cfg = effective_config(cfg, what_if)
    obs = apply_what_if(obs, what_if)
    corrections = correct_latency(obs, fleet=fleet, profile=profile, cfg=cfg)
    forecast = predict_next(obs, cfg.predictor, cache=predictor_cache)
    sizing = size_pools(forecast, corrections=corrections, profile=profile, cfg=cfg)
    saturation = analyze_saturation(obs, fleet, cfg, now_s=now_s)
    decision = decide(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=decision_config(cfg), now_s=now_s,
        fast_path=cfg.fast_path if fast_path else None,
    )
    return PlanResult(
        observation=obs,
        fleet=fleet,
        corrections=corrections,
        forecast=forecast,
        sizing=sizing,
        saturation=saturation,
        decision=decision,
    )
