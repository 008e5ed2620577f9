"""One what-if scenario, end to end: load the trace, build the fleet, replay a policy.

`WhatIfScenario` (the planner's what-if, `planner.whatif.WhatIf`, asked of the
simulator: with the trace, profile and policy it applies to) is the typed input
of the CLI, the what-if flows and each cell of a sweep. `run_what_if` returns
the JSON summary and the full replay.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from connectors.profiles import load_profile_dir
from planner.config import PlannerConfig, SloTarget, format_validation_error
from planner.latency.profile import EngineProfile
from planner.latency.profile_checks import ProfileRangeWarning
from planner.whatif import WhatIf
from sim.config import SimConfig
from sim.lookup import ProfileTables
from sim.policies import check_policy_name, default_planner_config, make_policy
from sim.published_ttft import load_ttft_view
from sim.replay import ReplayResult, ReplaySettings, after_lead_in, replay
from sim.routing import make_router
from sim.whatif.report import summarize
from workloads.servegen import load_servegen, synthesize_servegen
from workloads.traces import Trace, detect_format, detect_tick_s, jitter_within_ticks, load_trace, multiply_load


INDEPENDENT_TENANTS_JITTER_S = 30.0
SYNCHRONISED_JITTER_S = 1.0


def load_model(load_multiplier: float, jitter_s: float) -> str:
    """How a multiplied load was made, in words every figure carries."""
    if load_multiplier == 1.0:
        return "the trace as recorded"
    kind = "synchronised copies (stress case)" if jitter_s <= SYNCHRONISED_JITTER_S else "independent tenants"
    return f"{load_multiplier:g} copies shifted by up to +-{jitter_s:g} s: {kind}"


class WhatIfScenario(WhatIf):
    """A what-if question: this trace, this much load, these SLA targets, this policy.

    The load and the SLA targets are the planner's what-if fields; the targets
    are always given here (there is no configured SLA to keep).
    """

    trace: str = Field(description="trace file: Azure CSV(.gz), Mooncake JSONL(.gz) or ServeGen .tar.gz")
    profile_dir: str = Field(description="profiler output folder (selected_*_interpolation/raw_data.npz)")
    ttft_ms: float = Field(200.0, gt=0, description="TTFT target, ms")
    itl_ms: float = Field(10.0, gt=0, description="ITL target, ms")
    policy: str = Field("planner", description="planner, planner:<predictor>, dynamo, saturation, static:<P>x<D>, oracle")
    startup_s: float = Field(60.0, ge=0, description="time from adding a worker to it serving, s")
    interval_s: float = Field(60.0, gt=0, description="planner adjustment interval, s")
    load_multiplier: float = Field(
        1.0, gt=0, le=1000, description="superpose this many copies of the trace, each a tenant of its own"
    )
    jitter_s: float = Field(
        INDEPENDENT_TENANTS_JITTER_S, ge=0,
        description="shift each copied request by up to +- this, s: 30 models independent tenants (the default), "
        f"{SYNCHRONISED_JITTER_S:g} synchronised copies (every burst K times at once: a stress case)",
    )
    seed: int = Field(0, ge=0, description="seed for load multiplication, tick jitter and ServeGen synthesis")
    router: str = Field(
        "least-loaded", description="least-loaded, round-robin, or picker (the routing service's SLO-aware picker)"
    )
    with_oracle: bool = Field(False, description="also compute the oracle's GPU-hours for comparison")
    skip_malformed: bool = Field(False, description="skip malformed trace lines (counted) instead of failing")
    servegen_start_s: float = Field(86_400.0, ge=0, description="ServeGen: where in the archive to start, s")
    servegen_duration_s: float = Field(3_600.0, gt=0, description="ServeGen: how much to synthesise, s")
    servegen_rate_scale: float = Field(
        0.005, gt=0, description="ServeGen: multiply every client's rate (the archives run ~1,800 req/s)"
    )
    max_replicas: int = Field(16, ge=1, description="most workers per pool (planner bounds, oracle search)")
    fast_path: bool | None = Field(
        None, description="planner policies: poll the saturation signal between intervals and scale up at once "
        "(planner.fast_path.enabled); None: the planner's default"
    )
    engine_model: Literal["profile", "dynamo_mocker"] = Field(
        "profile", description="how simulated engines are timed: profile (batched prefill at the profile's TTFT, "
        "decode steps at its ITL) or dynamo_mocker (as Dynamo 1.6.1's mocker times them from the same profile: "
        "its fitted lines, chunked prefill, the first token from a decode step; sim.mocker_timing)",
    )
    latency_model_path: str | None = Field(
        None, description="a published latency-model document (JSON): planner policies take prefill TTFT from it "
        "(mean and p90 on an idle engine, as the routing service serves it) instead of the profile; None: the profile"
    )
    warmup_trace_path: str | None = Field(
        None, description="planner policies: a trace whose per-interval load is put before the replay's own history "
        "while it is shorter than predictor.history_intervals (predictor.warmup_trace_path, Dynamo's "
        "--load-predictor-warmup-trace); None: none"
    )
    lead_in_trace_path: str | None = Field(
        None, description="a trace of the time before this one (same service and format, multiplied as this one, "
        "seed + 1), replayed through the fleet and the policy first and not scored: a planner started against a "
        "running fleet, with its history and the capacity it holds; None: a cold start"
    )
    planner_settings: dict[str, Any] = Field(
        default_factory=dict,
        description="planner policies: planner configuration fields to set, by dotted name, e.g. "
        "{'decision.scale_down_stabilization_s': 420}; applied last, each checked as the configuration file is",
    )
    recurrence_hold_s: float | None = Field(
        None, gt=0, le=86_400,
        description="planner policies: the recurrence hold's window (decision.independent_stabilization_s, rank 2): "
        "while sizing takes the mean forecast, scale down only to what two of its recommendations reached; "
        "None: the planner's default (off)",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        return check_policy_name(v)

    @field_validator("router")
    @classmethod
    def _known_router(cls, v: str) -> str:
        if v not in ("least-loaded", "round-robin", "picker"):
            raise ValueError(f"router must be least-loaded, round-robin or picker, got {v!r}")
        return v

    def slo(self, base: SloTarget | None = None) -> SloTarget:
        """The scenario's SLA targets (both are always given, so base is never used)."""
        return SloTarget(ttft_ms=self.ttft_ms, itl_ms=self.itl_ms)


def load_scenario_trace(sc: WhatIfScenario) -> Trace:
    """The request stream the scenario replays: loaded or synthesised, de-ticked, multiplied."""
    path = Path(sc.trace)
    fmt = detect_format(path)
    if fmt == "servegen":
        data = load_servegen(path)
        trace = synthesize_servegen(
            data,
            start_s=sc.servegen_start_s,
            duration_s=sc.servegen_duration_s,
            seed=sc.seed,
            rate_scale=sc.servegen_rate_scale,
        )
    else:
        trace = load_trace(path, fmt=fmt, skip_malformed=sc.skip_malformed)
        tick = detect_tick_s(trace)
        if tick is not None:
            trace = jitter_within_ticks(trace, tick_s=tick, seed=sc.seed)
    if len(trace) == 0:
        raise ValueError(f"{path}: the scenario's trace has no requests")
    if sc.load_multiplier != 1.0:
        trace = multiply_load(trace, sc.load_multiplier, seed=sc.seed, jitter_s=sc.jitter_s)
    return trace


def build_replay_settings(sc: WhatIfScenario, profile: EngineProfile | None = None) -> ReplaySettings:
    """What the replay holds fixed; workers are billed the GPUs per engine the profile names (else 1)."""
    return ReplaySettings(
        slo=sc.slo(),
        interval_s=sc.interval_s,
        sim=SimConfig(
            startup_s=sc.startup_s,
            gpus_per_prefill=(profile and profile.gpus_per_prefill_engine) or 1,
            gpus_per_decode=(profile and profile.gpus_per_decode_engine) or 1,
            engine_model=sc.engine_model,
        ),
        router=sc.router,
    )


def run_what_if(
    sc: WhatIfScenario,
    *,
    trace: Trace | None = None,
    progress: Callable[[int, int], None] | None = None,
    oracle_progress: Callable[[str], None] | None = None,
) -> tuple[dict, ReplayResult]:
    """Replay the scenario; (JSON summary, replay). Oracle GPU-hours when asked or when it is the policy.

    progress: called with (requests done, total) during the policy's replay.
    oracle_progress: called with a line after each of the oracle's replays (dozens of them).
    """
    import time

    from sim.oracle import oracle_plan, reactive_reference

    t0 = time.perf_counter()
    trace = trace if trace is not None else load_scenario_trace(sc)
    profile = load_profile_dir(sc.profile_dir)
    tables = ProfileTables(profile)
    scenario = build_replay_settings(sc, profile)
    cfg = planner_config(sc)
    router = make_router(sc.router, profile=profile, slo=sc.slo(), seed=sc.seed)
    if sc.router == "picker" and (sc.policy == "oracle" or sc.with_oracle):
        raise ValueError("the oracle replays the trace dozens of times: use router least-loaded or round-robin with it")
    oracle_gpu_hours, reactive_tried, policy = None, None, None
    ttft_view = load_ttft_view(sc.latency_model_path, profile) if sc.latency_model_path else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        if sc.policy == "oracle":
            plan = oracle_plan(trace, tables, scenario=scenario, max_replicas=sc.max_replicas, progress=oracle_progress)
            result = plan.result
            oracle_gpu_hours = result.gpu_hours
        else:
            policy = make_policy(sc.policy, cfg=cfg, profile=profile, ttft_view=ttft_view)
            result = _replay_policy(sc, trace, tables, policy, scenario=scenario, router=router, progress=progress)
            if sc.with_oracle:
                plan = oracle_plan(trace, tables, scenario=scenario, max_replicas=sc.max_replicas,
                                   progress=oracle_progress)
                oracle_gpu_hours = plan.result.gpu_hours
                _, reactive_tried = reactive_reference(trace, tables, scenario, plan, float(result.sla_met().mean()))
    summary = summarize(
        result,
        oracle_gpu_hours=oracle_gpu_hours,
        extra={
            "load_multiplier": sc.load_multiplier,
            "jitter_s": sc.jitter_s,
            "load_model": load_model(sc.load_multiplier, sc.jitter_s),
            # with the oracle: the hindsight-reactive holds tried, shortest first, up to the first reaching
            # the policy's attainment (window, attainment, GPU-hours; sim.oracle.reactive_reference)
            "hindsight_reactive_tried": reactive_tried,
            "profile": profile.name,
            # the planner policies' prefill TTFT (the oracle and the static fleets size nothing)
            "ttft_source": ttft_view.source if ttft_view is not None else "profile",
            "warmup_trace_path": sc.warmup_trace_path,  # the planner's warm-up trace (None: a cold start)
            # runs whose targets the warm-up's floor raised and the most it asked per pool (None: no warm-up)
            "warmup_floor": dict(policy.floor_raised) if sc.warmup_trace_path and hasattr(policy, "floor_raised")
            else None,
            "lead_in_trace_path": sc.lead_in_trace_path,  # replayed first, unscored (None: a cold start)
            "recurrence_hold_s": sc.recurrence_hold_s,  # the planner's recurrence hold window (None: off)
            "planner_settings": dict(sc.planner_settings),  # planner configuration fields the scenario set
            "trace_path": str(sc.trace),
            "skipped_lines": trace.skipped_lines,
            # the whole what-if (oracle computation included); the policy's replay alone is replay_wall_s
            "replay_wall_s": result.wall_s,
            "wall_s": time.perf_counter() - t0,
        },
    )
    return summary, result


def planner_config(sc: WhatIfScenario) -> PlannerConfig:
    """The planner configuration the scenario's planner policies run: the default for its SLA and interval,
    its bounds, fast path, recurrence hold and warm-up trace, then its planner_settings (checked as a
    configuration file is: an unknown field or bad value is one line naming it)."""
    cfg = default_planner_config(
        profile_dir=sc.profile_dir, ttft_ms=sc.ttft_ms, itl_ms=sc.itl_ms, interval_s=sc.interval_s
    )
    own = {"decision.prefill.max_replicas": sc.max_replicas, "decision.decode.max_replicas": sc.max_replicas}
    if sc.fast_path is not None:
        own["fast_path.enabled"] = sc.fast_path
    if sc.recurrence_hold_s is not None:
        own["decision.independent_stabilization_s"] = sc.recurrence_hold_s
    if sc.warmup_trace_path is not None:
        own["predictor.warmup_trace_path"] = sc.warmup_trace_path
    return with_settings(cfg, {**own, **sc.planner_settings})


def with_settings(cfg: PlannerConfig, settings: Mapping[str, Any]) -> PlannerConfig:
    """cfg with the fields named in settings (dotted names, e.g. "decision.scale_down_stabilization_s") set,
    checked as a configuration file is: an unknown field or a bad value raises one line naming it."""
    data = cfg.model_dump()
    for key, value in settings.items():
        node, *path = data, *key.split(".")
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or path[-1] not in node:
            raise ValueError(f"planner setting {key!r}: the planner configuration has no such field")
        node[path[-1]] = value
    try:
        return PlannerConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, source="planner settings").replace("\n", "; ")) from None


def _replay_policy(sc: WhatIfScenario, trace: Trace, tables: ProfileTables, policy, *, scenario: ReplaySettings,
                   router, progress) -> ReplayResult:
    """The policy's replay; with a lead-in trace, run through it first (ReplaySettings.lead_in_s)."""
    if sc.lead_in_trace_path is None:
        return replay(trace, tables, policy, scenario=scenario, router=router, progress=progress)
    lead = load_scenario_trace(sc.model_copy(update={"trace": sc.lead_in_trace_path, "seed": sc.seed + 1}))
    led, settings = after_lead_in(lead, trace, scenario)
    return replay(led, tables, policy, scenario=settings, router=router, progress=progress)


@dataclass(frozen=True)
class References:
    """What a policy's replay is compared with (sim.oracle): the oracle, the cheapest static fleet and the
    cheapest hindsight-reactive hold reaching the policy's attainment (None: none tried did), with every
    static (P, D, attainment, GPU-hours) and hold (window, attainment, GPU-hours) tried."""

    oracle: ReplayResult
    static: ReplayResult | None
    static_tried: list[tuple[int, int, float, float]]
    reactive: ReplayResult | None
    reactive_tried: list[tuple[int, float, float]]


def reference_fleets(
    sc: WhatIfScenario, trace: Trace, *, target_frac: float, progress: Callable[[str], None] | None = None,
) -> References:
    """The oracle's replay of the scenario's trace, and the cheapest static fleet and hindsight-reactive hold
    reaching target_frac (0..1) SLA attainment."""
    from sim.oracle import best_static, oracle_plan, reactive_reference

    if sc.router == "picker":
        raise ValueError("the oracle replays the trace dozens of times: use router least-loaded or round-robin with it")
    profile = load_profile_dir(sc.profile_dir)
    tables = ProfileTables(profile)
    scenario = build_replay_settings(sc, profile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        plan = oracle_plan(trace, tables, scenario=scenario, max_replicas=sc.max_replicas, progress=progress)
        static, tried = best_static(trace, tables, scenario, plan, target_frac)
        reactive, reactive_tried = reactive_reference(trace, tables, scenario, plan, target_frac)
    return References(plan.result, static, tried, reactive, reactive_tried)
