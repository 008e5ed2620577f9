"""The fleet what-if: two or three models, each its own trace, profile and SLA, replayed against one GPU budget.

Each model is a what-if scenario (sim.whatif.scenario.WhatIfScenario: its trace, load model, SLA targets,
profile and planner settings) run by its own planner; sim.fleet_replay steps them on one clock and the
fleet's rule (planner.fleet) grants the budget every interval. The summary carries each model's SLA
attainment and GPU-hours, the fleet's (requests pooled, and the mean and worst over models), and how
often the budget held whom.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Literal

from pydantic import Field, field_validator, model_validator

from connectors.profiles import load_profile_dir
from planner.fleet.arbitrate import DEFAULT_GUARANTEED_SHARE_FRAC
from planner.latency.profile_checks import ProfileRangeWarning
from planner.strict import StrictModel
from sim.fleet_replay import FleetMemberReplay, FleetReplayResult, fleet_attainment, replay_fleet
from sim.lookup import ProfileTables
from sim.policies import PlannerPolicy
from sim.whatif.report import summarize
from sim.whatif.scenario import WhatIfScenario, build_replay_settings, load_model, load_scenario_trace, planner_config


class FleetModel(StrictModel):
    """One model of the fleet what-if: a name, its priority and its scenario (policy: the planner)."""

    name: str = Field(min_length=1, max_length=63, description="the model's name in grants and results")
    priority: float = Field(1.0, ge=0, le=1e6, description="weight of its expected SLA loss (planner.fleet)")
    scenario: WhatIfScenario = Field(description="its trace, load, SLA targets, profile and planner settings")

    @field_validator("scenario")
    @classmethod
    def _planner(cls, sc: WhatIfScenario) -> WhatIfScenario:
        if sc.policy != "planner":
            raise ValueError(f"policy must be 'planner' (each model's own planner decides, the fleet arbitrates), "
                             f"got {sc.policy!r}")
        return sc


class FleetWhatIf(StrictModel):
    """What would the fleet's models attain, and at what GPU-hours, sharing this GPU budget under this rule."""

    models: list[FleetModel] = Field(min_length=1, max_length=8, description="the models sharing the budget")
    budget_gpus: int = Field(ge=1, le=100_000, description="GPUs every model may use together")
    rule: Literal["loss", "split", "priority"] = Field(
        "loss", description="loss: by expected SLA loss (planner.fleet.arbitrate); split: equal fixed shares; "
        "priority: wants in full in priority order")
    guaranteed_share_frac: float = Field(
        DEFAULT_GUARANTEED_SHARE_FRAC, ge=0, le=1, description="rule loss: each model keeps its wants up to this share of its priority "
        "share of the budget; only the rest goes by expected loss (0: all by expected loss)")

    @model_validator(mode="after")
    def _names(self) -> "FleetWhatIf":
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"models: name {twice[0]!r} is used twice")
        intervals = {m.scenario.interval_s for m in self.models}
        if len(intervals) > 1:
            raise ValueError(f"models: every scenario needs one interval_s, got {sorted(intervals)}")
        return self


def fleet_members(fw: FleetWhatIf) -> list[FleetMemberReplay]:
    """Each model's trace, profile tables, planner and replay settings, ready to replay (fresh planners)."""
    members = []
    for m in fw.models:
        sc = m.scenario
        if sc.lead_in_trace_path is not None:
            raise ValueError(f"model {m.name!r}: a lead-in trace is not replayed in a fleet what-if (cold starts)")
        profile = load_profile_dir(sc.profile_dir)
        policy = PlannerPolicy(planner_config(sc), profile, name="planner")
        members.append(FleetMemberReplay(m.name, load_scenario_trace(sc), ProfileTables(profile), policy,
                                         build_replay_settings(sc, profile), m.priority))
    return members


def run_fleet_what_if(fw: FleetWhatIf, *, members: list[FleetMemberReplay] | None = None) -> tuple[dict, FleetReplayResult]:
    """Replay the fleet; (JSON summary, the fleet's replay). members: built by fleet_members (None: built here),
    their priorities taken from fw's models of the same name."""
    t0 = time.perf_counter()
    if members is None:
        members = fleet_members(fw)
    else:
        priority = {m.name: m.priority for m in fw.models}
        members = [dataclasses.replace(m, priority=priority[m.name]) for m in members]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        result = replay_fleet(members, budget_gpus=fw.budget_gpus, rule=fw.rule,
                              guaranteed_share_frac=fw.guaranteed_share_frac)
    return fleet_summary(fw, result, wall_s=time.perf_counter() - t0), result


def fleet_summary(fw: FleetWhatIf, result: FleetReplayResult, *, wall_s: float) -> dict:
    """The fleet replay's figures as plain JSON-able values."""
    models = {}
    for m in fw.models:
        s = summarize(result.results[m.name])
        models[m.name] = {
            "priority": m.priority, "trace": s["trace"], "requests": s["requests"],
            "load_model": load_model(m.scenario.load_multiplier, m.scenario.jitter_s),
            "ttft_ms": m.scenario.ttft_ms, "itl_ms": m.scenario.itl_ms, "profile_dir": m.scenario.profile_dir,
            "slo_attainment": s["slo_attainment"], "ttft_attainment": s["ttft_attainment"],
            "itl_attainment": s["itl_attainment"], "gpu_hours": s["gpu_hours"], "max_replicas": s["max_replicas"],
            "held_intervals": result.held_intervals[m.name],
        }
    att = [v["slo_attainment"] for v in models.values()]
    return {
        "budget_gpus": fw.budget_gpus, "rule": fw.rule,
        "guaranteed_share_frac": fw.guaranteed_share_frac if fw.rule == "loss" else None,
        "models": models,
        "fleet_attainment": fleet_attainment(result), "mean_model_attainment": sum(att) / len(att),
        "worst_model_attainment": min(att), "gpu_hours": result.gpu_hours,
        "short_intervals": result.short_intervals, "peak_granted_gpus": result.peak_granted_gpus,
        "peak_allocated_gpus": result.peak_allocated_gpus, "replay_wall_s": result.wall_s, "wall_s": wall_s,
        "first_arbitrations": [{"t_s": t, **a} for t, a in result.arbitrations[:5]],
    }


def fleet_markdown(summary: dict) -> str:
    """The fleet what-if's report: one row per model, then the fleet's."""
    rule = summary["rule"] + (f" (guaranteed share {summary['guaranteed_share_frac']:g})"
                              if summary.get("guaranteed_share_frac") is not None else "")
    lines = [f"# Fleet what-if: {len(summary['models'])} models, {summary['budget_gpus']} GPUs, rule {rule}", "",
             "| model | priority | load | SLA (TTFT / ITL ms) | SLA attainment | GPU-hours | max P x D | "
             "intervals held |", "|---|---|---|---|---|---|---|---|"]
    for name, m in summary["models"].items():
        lines.append(f"| {name} ({m['trace']}) | {m['priority']:g} | {m['load_model']} | {m['ttft_ms']:g} / "
                     f"{m['itl_ms']:g} | {m['slo_attainment']:.2%} | {m['gpu_hours']:.2f} | "
                     f"{m['max_replicas']['prefill']} x {m['max_replicas']['decode']} | {m['held_intervals']} |")
    lines += ["", f"Fleet: {summary['fleet_attainment']:.2%} of all requests met their SLA (mean over models "
              f"{summary['mean_model_attainment']:.2%}, worst {summary['worst_model_attainment']:.2%}), "
              f"{summary['gpu_hours']:.2f} GPU-hours; the planners wanted more than the budget in "
              f"{summary['short_intervals']} intervals; at most {summary['peak_granted_gpus']} GPUs granted, "
              f"{summary['peak_allocated_gpus']} allocated (draining and starting workers included)."]
    return "\n".join(lines)
