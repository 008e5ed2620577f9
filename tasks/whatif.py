"""What-if tasks: load a scenario's trace, replay it, draw its plots; one core call each."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from sim.replay import ReplayResult
from sim.report import plot_latency, plot_load_vs_replicas
from sim.traces import Trace
from sim.whatif import WhatIfScenario, load_scenario_trace, run_what_if


@task(cache_policy=NO_CACHE)
def load_trace_for(scenario: WhatIfScenario) -> Trace:
    """The scenario's request stream (format detected, ServeGen synthesised, load multiplied)."""
    return load_scenario_trace(scenario)


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
