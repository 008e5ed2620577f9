"""What advisory mode adds to a planner run, against the comparison window: read-back, comparison, table, chart.

A real Prometheus (Debian's, started here in a temporary folder) holds a week of the running
autoscaler's replicas (Dynamo's planner gauges) and the advisory's own targets and recommendations,
one sample every 30 s per series: a seeded random walk of the replicas (synthetic: this measures cost,
not control quality). For each window (3 h, the default; a day; a week) at a 60 s interval, the work an
advisory run does beyond an applying one is timed: reading the three histories back
(connectors.autoscaler_history), the comparison (planner.advisory.compare_run), the series table
(flows.advisory.series_table), and the chart with both lines (flows.charts, drawn by every run; its
cost grows with the window). Median and max of --repeats runs each.

Writes benchmarks/results/advisory.json and prints a markdown table.
Run: nice -n 10 .venv/bin/python benchmarks/bench_advisory.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NS, MODEL = "bench-advisory", "m"
INTERVAL_S = 60.0
SAMPLE_S = 30.0
WEEK_S = 7 * 86_400.0
WINDOWS_S = (3 * 3600.0, 86_400.0, WEEK_S)


def random_walk(times: list[float], *, seed: int) -> list[tuple[float, int, int]]:
    """(t_s, prefill, decode) replicas moving by one now and then, never below 1."""
    rng = random.Random(seed)
    prefill, decode, rows = 2, 4, []
    for t in times:
        prefill = max(1, prefill + (rng.choice((-1, 1)) if rng.random() < 0.01 else 0))
        decode = max(1, decode + (rng.choice((-1, 1)) if rng.random() < 0.01 else 0))
        rows.append((t, prefill, decode))
    return rows


def backfill(prometheus, *, now_s: float) -> int:
    from tests.support.fixtures_prometheus import OpenMetricsWriter, write_gauge

    times = [now_s - WEEK_S + SAMPLE_S * i for i in range(int(WEEK_S / SAMPLE_S))]
    theirs, ours = random_walk(times, seed=1), random_walk(times, seed=2)
    writer = OpenMetricsWriter()
    for i, pool in enumerate(("prefill", "decode"), start=1):
        write_gauge(writer, name=f"dynamo_planner_num_{pool}_replicas", labels={"namespace": NS},
                    points=[(row[0], row[i]) for row in theirs])
        for gauge in ("sla_planner_advisory_replicas", "sla_planner_recommended_replicas"):
            write_gauge(writer, name=gauge, labels={"namespace": NS, "model": MODEL, "pool": pool},
                        points=[(row[0], row[i]) for row in ours])
    prometheus.backfill(writer.render())
    return len(times)


def plan_result(*, now_s: float):
    """One planner interval on the measured H200 profile (the chart needs a PlanResult)."""
    from connectors.profiles import load_profile
    from planner.config import PlannerConfig, ProfileConfig
    from planner.pipeline import plan_interval
    from planner.types import FleetState, LoadHistory, Observation, PoolState

    cfg = PlannerConfig(namespace=NS, profile=ProfileConfig(dir=str(ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1")))
    n = 288
    hist = LoadHistory(t_s=tuple(now_s - INTERVAL_S * (n - i) for i in range(n)), num_requests=(600.0,) * n,
                       avg_isl_tokens=(1000.0,) * n, avg_osl_tokens=(150.0,) * n, interval_s=INTERVAL_S)
    obs = Observation(taken_at_s=now_s, interval_s=INTERVAL_S, num_requests=600.0, avg_isl_tokens=1000.0,
                      avg_osl_tokens=150.0, avg_ttft_ms=60.0, avg_itl_ms=6.0, history=hist)
    fleet = FleetState(prefill=PoolState(2, 2), decode=PoolState(4, 4))
    return plan_interval(obs, fleet, cfg, load_profile(cfg.profile), now_s=now_s)


def measure(prometheus_url: str, *, now_s: float, window_s: float, repeats: int, result) -> dict:
    from connectors.autoscaler_history import read_advisory_history
    from connectors.config import AdvisoryConfig, MetricsConfig
    from flows.advisory import advisory_view
    from flows.charts import planner_chart_png
    from planner.advisory import advisory_fleet, compare_run

    advisory = AdvisoryConfig(selector=f'namespace="{NS}"', window_s=window_s)
    times: dict[str, list[float]] = {"read_s": [], "compare_s": [], "table_s": [], "chart_s": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        history = read_advisory_history(MetricsConfig(prometheus_url=prometheus_url), advisory, namespace=NS,
                                        model_id=MODEL, now_s=now_s, interval_s=INTERVAL_S,
                                        recommendation_window_s=3600.0)
        t1 = time.perf_counter()
        fleet = advisory_fleet(result.fleet, autoscaler=history.autoscaler, recommended=history.recommended)
        comparison = compare_run(result.decision, fleet, advisory=history.advisory, autoscaler=history.autoscaler,
                                 now_s=now_s, window_s=window_s, step_s=INTERVAL_S)
        t2 = time.perf_counter()
        view = advisory_view(comparison, history, result.decision, autoscaler=advisory.name, now_s=now_s)
        t3 = time.perf_counter()
        png = planner_chart_png(result, now_s=now_s, record=None, window_s=window_s, advisory=view.lines)
        t4 = time.perf_counter()
        for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[key].append(value)
    return {
        "window_s": window_s,
        "rows_read": [len(history.autoscaler), len(history.advisory), len(history.recommended)],
        "intervals_compared": comparison.intervals,
        "series_table_rows": len(view.series),
        "chart_bytes": len(png),
        **{f"{k}_median": statistics.median(v) for k, v in times.items()},
        **{f"{k}_max": max(v) for k, v in times.items()},
    }


def markdown(result: dict) -> str:
    lines = ["| window | rows read (autoscaler / ours / recommended) | read back | compare | series table | chart |",
             "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        hours = row["window_s"] / 3600.0
        cells = [f"{1000 * row[f'{k}_median']:.0f} ms (max {1000 * row[f'{k}_max']:.0f})"
                 for k in ("read_s", "compare_s", "table_s", "chart_s")]
        lines.append(f"| {hours:g} h | {' / '.join(map(str, row['rows_read']))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per window (default 5)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "advisory.json"))
    args = parser.parse_args(argv)

    from tests.support.fixtures_prometheus import ANCHOR_S, PrometheusServer

    now_s = ANCHOR_S + 8 * 86_400.0
    base = Path(tempfile.mkdtemp(prefix="bench-advisory-"))
    prometheus = PrometheusServer(base_dir=base)
    try:
        samples = backfill(prometheus, now_s=now_s)
        prometheus.start()
        result = plan_result(now_s=now_s)
        rows = [measure(prometheus.url, now_s=now_s, window_s=w, repeats=args.repeats, result=result)
                for w in WINDOWS_S]
    finally:
        prometheus.stop()
        shutil.rmtree(base, ignore_errors=True)
    out = {
        "benchmark": "advisory mode's extra work per run against the comparison window",
        "data": f"a week of synthetic replica random walks, {samples} samples per series at {SAMPLE_S:g} s, 6 series, "
                f"in a real Prometheus; interval {INTERVAL_S:g} s",
        "load_average_1m_at_end": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "repeats": args.repeats,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(markdown(out))
    print(f"load average (1 min) at the end: {out['load_average_1m_at_end']:.2f}; written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
