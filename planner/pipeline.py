"""One planner interval without I/O: its steps (planner.steps) and the order they run in.

correct → predict → warm-up floor → interpolate → analyze saturation → decide, on inputs
already collected. `plan_steps` holds the order; the Prefect flow gives it each
step as its task (`Steps`), the simulator and the benchmarks call `plan_interval`,
which runs the plain functions, so all three share one decision path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from planner.config import PlannerConfig
from planner.latency.profile import EngineProfile
from planner.latency.ttft_view import TtftView
from planner.saturation.guardrail import PoolSaturation
from planner.steps import (
    analyze_fleet_saturation,
    correct_latency,
    decide_targets,
    history_warm_start,
    interpolate_replicas,
    predict_load,
    scale_down_windows,
    size_warmup_floor,
)
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
    Targets,
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
    # How a first run started (planner.steps.history_warm_start): "warm start: ..." or "cold start: ..."; "" for
    # a planner that has run before.
    start_note: str = ""


@dataclass(frozen=True)
class Steps:
    """How each step runs: the plain functions of planner.steps by default; the flow gives each as its Prefect
    task of the same name (tests/flows/test_flow_planner.py checks that it does).

    Each takes the arguments of the function it defaults to; the caller binds what only it has (the flow:
    the predictor's cache; the simulator: that cache and the warm-up's sizing store).
    """

    correct: Callable[..., Corrections] = correct_latency
    predict: Callable[..., Forecast | None] = predict_load
    warmup_floor: Callable[..., StartFloor | None] = size_warmup_floor
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
    warmup: LoadHistory | None = None,
) -> PlanResult:
    """Run the interval's steps in order on already-collected inputs (what-if already applied).

    previous: a plan of this same interval whose forecast and start floor are kept (the flow plans
    again when the fleet changed under it: the replicas moved, the load did not).
    warmup: the warm-up trace's per-interval load (predictor.warmup_trace_path, binned at the interval):
        the predict step puts it before a short collected history, the warm-up floor step sizes its last
        window; None: no warm-up. A fast-path run has no floor (it only adds over what is set).
    ttft_view: prefill's single-request TTFT for correct, the warm-up floor and interpolate alike
        (planner.latency.ttft_view: a published latency model); None: the profile's.
    """
    corrections = steps.correct(obs, fleet=fleet, profile=profile, cfg=cfg, ttft_view=ttft_view)
    if previous is None:
        forecast = steps.predict(obs, cfg=cfg.predictor, warmup=warmup)
        start_floor, start_note = (None, "") if fast_path else _start_floor(
            obs, fleet, cfg, profile, now_s=now_s, steps=steps, warmup=warmup, ttft_view=ttft_view,
            corrections=corrections, sized_on=None if forecast is None else forecast.sized_on)
    else:
        forecast, start_floor, start_note = previous.forecast, previous.start_floor, previous.start_note
    sizing = steps.interpolate(forecast, corrections=corrections, profile=profile, cfg=cfg, ttft_view=ttft_view)
    saturation = steps.analyze_saturation(obs, fleet=fleet, cfg=cfg, now_s=now_s)
    decision = steps.decide(
        sizing=sizing, saturation=saturation, fleet=fleet, obs=obs, cfg=cfg, now_s=now_s, fast_path=fast_path,
        start_floor=start_floor,
    )
    if start_floor is not None and start_floor.source == HISTORY_WARM_START:
        # The first run's window is the history's: recorded as its recommendation, later runs hold it as a
        # running planner holds its own.
        decision = dataclasses.replace(decision, **{
            f"recommended_{p}_replicas": max(start_floor.targets[p], getattr(decision, f"recommended_{p}_replicas")
                                             or 0) for p in ("prefill", "decode")})
    return PlanResult(
        observation=obs,
        fleet=fleet,
        corrections=corrections,
        forecast=forecast,
        sizing=sizing,
        saturation=saturation,
        decision=decision,
        start_floor=start_floor,
        start_note=start_note,
    )


# StartFloor.source of the warm start from the collected history (history_warm_start).
HISTORY_WARM_START = "the collected history"


def _start_floor(
    obs: Observation, fleet: FleetState, cfg: PlannerConfig, profile: EngineProfile, *, now_s: float, steps: Steps,
    warmup: LoadHistory | None, ttft_view: TtftView | None, corrections: Corrections, sized_on: str | None = None,
) -> tuple[StartFloor | None, str]:
    """A first run's floor from the collected history (the normal start), else from the warm-up trace while the
    planner's history is short; (None, note) for a cold start or a planner that has run before.

    The warm-up trace (a brand-new deployment's option) wins over a collected history shorter than the longest
    scale-down window. The history's intervals are sized with this run's latency factors (what a running
    planner's recent runs applied, as near as one reading tells); a trace's, never served here, without.
    sized_on: this run's forecast's basis, for the floor's share (size_warmup_floor)."""
    history, note = history_warm_start(obs, fleet, cfg, now_s=now_s)
    window_n = max(math.ceil(w / cfg.adjustment_interval_s - 1e-9) for w, _ in scale_down_windows(cfg))
    if history is not None and (warmup is None or len(history) >= window_n - 1):
        # sized=None: the simulator's store of sizings is the warm-up trace's, by its intervals.
        return steps.warmup_floor(obs, history, cfg, profile, ttft_view=ttft_view, sized=None, own_intervals=1,
                                  source=HISTORY_WARM_START, corrections=corrections, sized_on=sized_on), note
    if warmup is None:
        return None, note
    floor = steps.warmup_floor(obs, warmup, cfg, profile, ttft_view=ttft_view, sized_on=sized_on)
    return floor, (note and f"warm start from the warm-up trace: the collected history holds fewer than {window_n - 1} "
                            f"intervals before this first run")


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
    warmup_sized: MutableMapping[int, Targets | None] | None = None,
) -> PlanResult:
    """Every step of one planner interval as plain calls (the simulator, the benchmarks).

    predictor_cache: speed-only store of fitted predictor state; losing it never
    changes a decision beyond noise.
    warmup: the warm-up trace's load (predictor.warmup_trace_path, binned), as plan_steps takes it.
    warmup_sized: speed-only store of the warm-up intervals' sizings (size_warmup_floor's `sized`), one
        per warm-up history and configuration.
    fast_path: a run the saturation trigger started between intervals: the
    decision is scale-up only, after cfg.fast_path.cooldown_s.
    ttft_view: prefill's single-request TTFT (planner.latency.ttft_view); None: the profile's.
    """
    steps = Steps(predict=functools.partial(predict_load, cache=predictor_cache),
                  warmup_floor=functools.partial(size_warmup_floor, sized=warmup_sized))
    return plan_steps(
        apply_what_if(obs, what_if), fleet, effective_config(cfg, what_if), profile,
        now_s=now_s, steps=steps, fast_path=fast_path, ttft_view=ttft_view, warmup=warmup,
    )
