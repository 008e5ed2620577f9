"""Wall time of one planner flow run under Prefect, against the compute alone.

Each flow run is the real `planner_flow` against Prefect's ephemeral API
(SQLite in a temporary PREFECT_HOME) with the Kalman predictor, the measured
H200 profile, the local connector (a JSON file) and given metrics: the load
history is the Azure 2023 conversation trace binned to 60-s intervals (58
points). The compute alone is `planner.pipeline.plan_interval` on the same
inputs. The difference is Prefect's orchestration: task runs, state
transitions, artifacts and the connector's file I/O.

Writes benchmarks/results/flow.json and prints a markdown table.
Run: .venv/bin/python benchmarks/bench_flow.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="bench-flow-prefect-"))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from connectors.config import LocalConnectorConfig  # noqa: E402
from connectors.local import LocalConnector  # noqa: E402
from connectors.profiles import load_profile  # noqa: E402
from flows.config import PlannerRunConfig, ReplayInputs  # noqa: E402
from planner.config import PlannerConfig, PredictorConfig, ProfileConfig  # noqa: E402
from planner.pipeline import plan_interval  # noqa: E402
from planner.types import Observation, PodMetrics  # noqa: E402
from workloads.traces import bin_trace, load_trace  # noqa: E402

TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
OUT = ROOT / "benchmarks" / "results" / "flow.json"
INTERVAL_S = 60.0


def _inputs(state_path: Path) -> tuple[PlannerRunConfig, Observation]:
    history = bin_trace(load_trace(TRACE), bin_s=INTERVAL_S)
    cfg = PlannerRunConfig(
        planner=PlannerConfig(
            profile=ProfileConfig(dir=str(PROFILE)),
            adjustment_interval_s=INTERVAL_S,
            predictor=PredictorConfig(name="kalman"),
        ),
        connector=LocalConnectorConfig(state_path=str(state_path)),
    )
    t_end = history.t_s[-1]
    obs = Observation(
        taken_at_s=t_end,
        interval_s=INTERVAL_S,
        num_requests=history.num_requests[-1],
        avg_isl_tokens=history.avg_isl_tokens[-1],
        avg_osl_tokens=history.avg_osl_tokens[-1],
        avg_ttft_ms=90.0,
        avg_itl_ms=7.0,
        history=history,
        pods=(PodMetrics("prefill-0", "prefill", 0.2, 1.0), PodMetrics("decode-0", "decode", 0.4, 0.0)),
    )
    return cfg, obs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)

    from flows.planner_flow import planner_flow

    state = Path(tempfile.mkdtemp(prefix="bench-flow-state-")) / "fleet.json"
    cfg, obs = _inputs(state)
    profile = load_profile(cfg.planner.profile)
    connector = LocalConnector(cfg.connector)

    # Warm-up: starts the ephemeral API and imports everything once.
    planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=obs.taken_at_s), dry_run=True)

    flow_ms, compute_ms = [], []
    for i in range(args.runs):
        now = obs.taken_at_s + i
        t0 = time.perf_counter()
        planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=now))
        flow_ms.append((time.perf_counter() - t0) * 1e3)
        fleet = connector.read_fleet(now_s=now)
        t0 = time.perf_counter()
        plan_interval(obs, fleet, cfg.planner, profile, now_s=now)
        compute_ms.append((time.perf_counter() - t0) * 1e3)

    flow_med, compute_med = statistics.median(flow_ms), statistics.median(compute_ms)
    result = {
        "what": "one planner flow run (ephemeral API, Kalman, local connector, given metrics) vs plan_interval alone",
        "runs": args.runs,
        "flow_run_ms": {"median": flow_med, "min": min(flow_ms), "max": max(flow_ms)},
        "compute_ms": {"median": compute_med, "min": min(compute_ms), "max": max(compute_ms)},
        "orchestration_overhead_ms": flow_med - compute_med,
        "overhead_ratio": flow_med / compute_med if compute_med > 0 else None,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_at_end": os.getloadavg()[0],
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print("| measure | median ms | min ms | max ms |\n|---|---:|---:|---:|")
    print(f"| planner flow run | {flow_med:.0f} | {min(flow_ms):.0f} | {max(flow_ms):.0f} |")
    print(f"| compute alone (plan_interval) | {compute_med:.1f} | {min(compute_ms):.1f} | {max(compute_ms):.1f} |")
    print(f"\norchestration overhead {flow_med - compute_med:.0f} ms per run "
          f"({result['overhead_ratio']:.0f}x the compute); load average {result['machine']['load_average_1m_at_end']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
