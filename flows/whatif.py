"""What-if flows: replay a scenario through the fleet simulator; sweep a grid of scenarios.

`what_if_flow` answers one question (this trace, this load, these SLA targets, this
policy) and publishes a report artifact (attainment, latency percentiles, GPU-hours,
scale events) with PNG plots (load vs workers, latency over time). `sweep_flow` maps
scenarios as tasks; `run_sweep(..., dask_address=...)` runs the same sweep on a Dask
cluster through prefect-dask.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

from sim.report import markdown_report
from sim.whatif import WhatIfScenario
from tasks.whatif import load_trace_for, render_plots, replay_scenario, simulate_scenario


def _png_data_url(path: str) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


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
        create_image_artifact(image_url=_png_data_url(path), key=_key(f"{key}-{name}"), description=name)
    summary = dict(summary, plots=plots)
    return summary


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
