"""What-if tasks: load a scenario's trace, replay it, draw its plots; one core call each."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from sim.replay import ReplayResult
from sim.whatif.fleet import FleetWhatIf, run_fleet_what_if
from sim.whatif.report import plot_latency, plot_load_vs_replicas, plot_misses_per_minute
from workloads.traces import Trace, time_window
from sim.whatif.scenario import References, WhatIfScenario, load_scenario_trace, reference_fleets, run_what_if


@task(cache_policy=NO_CACHE)
def load_trace_for(scenario: WhatIfScenario) -> Trace:
    """The scenario's request stream (format detected, ServeGen synthesised, load multiplied)."""
    return load_scenario_trace(scenario)


@task(cache_policy=NO_CACHE)
def load_trace_window(scenario: WhatIfScenario, *, start_s: float, duration_s: float | None) -> Trace:
    """The scenario's request stream from start_s for duration_s seconds (None: to the end), re-based to 0."""
    trace = load_scenario_trace(scenario)
    if start_s == 0 and duration_s is None:
        return trace
    end_s = trace.duration_s + 1.0 if duration_s is None else start_s + duration_s
    window = time_window(trace, start_s, end_s)
    if len(window) == 0:
        raise ValueError(f"{scenario.trace}: no requests between {start_s:g} s and {end_s:g} s "
                         f"(the trace lasts {trace.duration_s:.0f} s)")
    return window


@task(cache_policy=NO_CACHE)
def compare_with_oracle(scenario: WhatIfScenario, trace: Trace, *, target_frac: float) -> References:
    """The oracle's replay, and the cheapest static fleet and hindsight-reactive hold reaching target_frac
    attainment (see sim.whatif.scenario.reference_fleets)."""
    return reference_fleets(scenario, trace, target_frac=target_frac)


@task(cache_policy=NO_CACHE)
def render_comparison(results: dict[str, ReplayResult], output_dir: str) -> str:
    """PNG of every replay's workers and SLA misses per minute in output_dir; its path."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return str(plot_misses_per_minute(results, out / "misses-per-minute.png"))


@task(cache_policy=NO_CACHE)
def replay_scenario(scenario: WhatIfScenario, trace: Trace) -> tuple[dict, ReplayResult]:
    """Replay the trace under the scenario's policy: (summary, full replay)."""
    return run_what_if(scenario, trace=trace)


@task(cache_policy=NO_CACHE)
def render_plots(result: ReplayResult, output_dir: str) -> dict[str, str]:
    """PNG plots of a replay in output_dir: {"load_vs_replicas": path, "latency": path}."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{result.policy}".replace(":", "-")
    return {
        "load_vs_replicas": str(plot_load_vs_replicas(result, out / f"{stem}-load-vs-replicas.png")),
        "latency": str(plot_latency(result, out / f"{stem}-latency.png")),
    }


@task(cache_policy=NO_CACHE, task_run_name="simulate {scenario.policy} x{scenario.load_multiplier}")
def simulate_scenario(scenario: WhatIfScenario) -> dict:
    """One sweep cell: load, replay and summarise (returns only the small summary, for Dask)."""
    summary, _ = run_what_if(scenario)
    return summary


@task(cache_policy=NO_CACHE, task_run_name="replay-fleet-{fleet.rule}-{fleet.budget_gpus}-gpus")
def replay_fleet_what_if(fleet: FleetWhatIf) -> dict:
    """Every model of the fleet what-if replayed against its one budget; the summary."""
    summary, _ = run_fleet_what_if(fleet)
    return summary
