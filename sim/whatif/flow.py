"""What-if flows: replay a scenario through the fleet simulator; sweep a grid of scenarios.

`what_if_flow` answers one question (this trace, this load, these SLA targets, this
policy) and publishes a report artifact (attainment, latency percentiles, GPU-hours,
scale events) with PNG plots (load vs workers, latency over time). `sweep_flow` maps
scenarios as tasks; `run_sweep(..., dask_address=...)` runs the same sweep on a Dask
cluster through prefect-dask.
"""

from __future__ import annotations

import tempfile

from prefect import flow
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.states import Completed, State

from flows.charts import png_data_url
from sim.whatif.fleet import FleetWhatIf, fleet_markdown
from sim.whatif.report import markdown_report, misses_per_minute
from sim.whatif.scenario import INDEPENDENT_TENANTS_JITTER_S, WhatIfScenario
from sim.whatif.tasks import (
    compare_with_oracle,
    load_trace_for,
    load_trace_window,
    render_comparison,
    render_plots,
    replay_fleet_what_if,
    replay_scenario,
    simulate_scenario,
)


def _key(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:60] or "what-if"


@flow(name="sla-planner-what-if")
def what_if_flow(scenario: WhatIfScenario, output_dir: str | None = None) -> dict:
    """Replay one scenario; return its summary and publish the report and plots."""
    trace = load_trace_for(scenario)
    summary, result = replay_scenario(scenario, trace)
    out = output_dir or tempfile.mkdtemp(prefix="sla-planner-what-if-")
    plots = render_plots(result, out)
    key = _key(f"what-if-{scenario.policy}")
    body = markdown_report(summary)
    body += "\n\n" + "\n".join(f"- {name}: `{path}`" for name, path in plots.items())
    create_markdown_artifact(markdown=body, key=key, description=f"what-if {summary['trace']} / {summary['policy']}")
    for name, path in plots.items():
        create_image_artifact(image_url=png_data_url(path), key=_key(f"{key}-{name}"), description=name)
    summary = dict(summary, plots=plots)
    return summary


@flow(name="sla-planner-what-if-compare",
      flow_run_name="what-if {policies} x{load_multiplier} jitter {jitter_s} s, TTFT {ttft_ms} ms ITL {itl_ms} ms")
def what_if_compare_flow(
    trace: str = "data/traces/azure2023_conv.csv.gz",
    profile_dir: str = "data/profiles/h200_llama8b_fp8_tp1",
    ttft_ms: float = 200.0,
    itl_ms: float = 10.0,
    load_multiplier: float = 1.0,
    jitter_s: float = INDEPENDENT_TENANTS_JITTER_S,
    policies: tuple[str, ...] = ("planner",),
    start_min: float = 0.0,
    duration_min: float | None = 30.0,
    output_dir: str | None = None,
) -> State:
    """Replay a trace under each policy, the oracle, the best static fleet and the hindsight-reactive reference;
    publish workers and misses per minute.

    Args:
        trace: trace file on the worker (Azure CSV(.gz), Mooncake JSONL(.gz) or ServeGen .tar.gz), relative to the
            project folder or absolute.
        profile_dir: profiler output folder of the engine to simulate (selected_*_interpolation/raw_data.npz).
        ttft_ms: SLA target: time to first token, ms.
        itl_ms: SLA target: inter-token latency, ms.
        load_multiplier: superpose this many copies of the trace, each a tenant of its own (1: as recorded).
        jitter_s: shift each copied request by up to +- this, s: 30 models independent tenants, 1 synchronised
            copies (every burst K times at once: a stress case).
        policies: policies to compare: planner, planner:<predictor>, dynamo, saturation, static:<P>x<D>.
        start_min: replay the trace from this minute.
        duration_min: replay this many minutes (empty: to the end); the oracle replays them dozens of times.
        output_dir: folder for the PNG files on the worker (empty: a temporary folder).
    """
    if not policies:
        raise ValueError("what-if compare: policies is empty: name at least one, e.g. planner")
    scenarios = [WhatIfScenario(trace=trace, profile_dir=profile_dir, ttft_ms=ttft_ms, itl_ms=itl_ms, policy=p,
                                load_multiplier=load_multiplier, jitter_s=jitter_s) for p in policies]
    requests = load_trace_window(scenarios[0], start_s=60.0 * start_min,
                                 duration_s=None if duration_min is None else 60.0 * duration_min)
    summaries, results = {}, {}
    for sc in scenarios:
        summaries[sc.policy], results[sc.policy] = replay_scenario(sc, requests)
    first = summaries[scenarios[0].policy]
    refs = compare_with_oracle(scenarios[0], requests, target_frac=first["slo_attainment"])
    oracle, static = refs.oracle, refs.static
    results["oracle"] = oracle
    if static is not None:
        results[f"best static {static.policy.split(':')[-1]}"] = static
    if refs.reactive is not None:
        results[f"hindsight-reactive {refs.reactive.policy.split(':')[-1]} intervals"] = refs.reactive
    out = output_dir or tempfile.mkdtemp(prefix="sla-planner-what-if-")
    figure = render_comparison(results, out)

    rows = []
    for label, r in results.items():
        _, missed = misses_per_minute(r)
        rows.append(f"| {label} | {100 * float(r.sla_met().mean()):.2f}% | {int(missed.sum()):,} | "
                    f"{int(missed.max(initial=0)):,} | {r.gpu_hours:.2f} | {len(r.scale_log)} |")
    static_note = ("" if static is not None else f"\n\nNo static fleet of the {len(refs.static_tried)} tried "
                                                 f"reached {100 * first['slo_attainment']:.2f}%.")
    static_note += (
        "\n\nHindsight-reactive: each interval's exact need, known once it has finished; every control step "
        "holds the largest of the last w (no forecast). The shortest hold reaching the first policy's attainment "
        "is listed; tried: " + ", ".join(f"w={w} {100 * a:.2f}% @ {g:.2f} GPU-h" for w, a, g in refs.reactive_tried)
        + ". A policy above it in GPU-hours loses on sizing or holding; the oracle's lead over it needs a forecast.")
    body = (f"### What-if: {first['trace']}, {first['load_model']}\n\n"
            "| policy | SLA met | missed requests | worst minute | GPU-hours | scale events |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows) + static_note + "\n\n" + markdown_report(first))
    create_markdown_artifact(markdown=body, key="what-if-compare",
                             description="what-if: policies vs oracle, best static and hindsight-reactive")
    create_image_artifact(image_url=png_data_url(figure), key="what-if-compare-misses",
                          description="workers and SLA misses per minute: policies, oracle, best static fleet, "
                                      "hindsight-reactive")
    message = "; ".join(f"{label} {100 * float(r.sla_met().mean()):.2f}% met, {r.gpu_hours:.2f} GPU-h"
                        for label, r in results.items())
    return Completed(message=message, data={
        "policies": summaries,
        "oracle_gpu_hours": oracle.gpu_hours,
        "best_static": None if static is None else static.policy,
        "best_static_gpu_hours": None if static is None else static.gpu_hours,
        "hindsight_reactive": None if refs.reactive is None else refs.reactive.policy,
        "hindsight_reactive_gpu_hours": None if refs.reactive is None else refs.reactive.gpu_hours,
        "plot": figure,
    })


@flow(name="sla-planner-what-if-fleet",
      flow_run_name="what-if fleet: {fleet.budget_gpus} GPUs, rule {fleet.rule}")
def what_if_fleet_flow(fleet: FleetWhatIf) -> State:
    """Two or three models, each its own trace, SLA and planner, replayed against one GPU budget; publish the
    per-model table (planner.fleet arbitrates every interval)."""
    summary = replay_fleet_what_if(fleet)
    create_markdown_artifact(markdown=fleet_markdown(summary), key=_key(f"what-if-fleet-{fleet.rule}"),
                             description=f"fleet what-if: {fleet.budget_gpus} GPUs, rule {fleet.rule}")
    return Completed(message=f"fleet {summary['fleet_attainment']:.2%} of requests met their SLA (worst model "
                             f"{summary['worst_model_attainment']:.2%}), {summary['gpu_hours']:.2f} GPU-hours",
                     data=summary)


@flow(name="sla-planner-what-if-sweep")
def sweep_flow(scenarios: list[WhatIfScenario]) -> list[dict]:
    """Replay every scenario as its own task; publish one comparison table."""
    futures = simulate_scenario.map(scenarios)
    summaries = [f.result() for f in futures]
    rows = [
        {
            "trace": s["trace"],
            "policy": s["policy"],
            "load_multiplier": s.get("load_multiplier"),
            "load_model": s.get("load_model"),
            "slo_attainment_pct": round(100 * s["slo_attainment"], 2),
            "ttft_p99_ms": None if s["ttft_ms"]["p99"] is None else round(s["ttft_ms"]["p99"], 1),
            "itl_p99_ms": None if s["itl_ms"]["p99"] is None else round(s["itl_ms"]["p99"], 2),
            "gpu_hours": round(s["gpu_hours"], 3),
            "oracle_gpu_hours": None if s["oracle_gpu_hours"] is None else round(s["oracle_gpu_hours"], 3),
            "scale_events": s["scale_events"],
        }
        for s in summaries
    ]
    create_table_artifact(table=rows, key="what-if-sweep", description="what-if sweep: one row per scenario")
    return summaries


def run_sweep(scenarios: list[WhatIfScenario], *, dask_address: str | None = None) -> list[dict]:
    """Run the sweep locally, or on the Dask cluster at dask_address (e.g. tcp://scheduler:8786)."""
    if dask_address is None:
        return sweep_flow(scenarios)
    from prefect_dask import DaskTaskRunner

    return sweep_flow.with_options(task_runner=DaskTaskRunner(address=dask_address))(scenarios)
