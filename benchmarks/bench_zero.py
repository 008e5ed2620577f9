"""Scale to zero and back in the simulator: GPU-hours saved and the TTFT the first requests after each gap pay.

A trace with long idle gaps: azure2023_conv's first three 10-minute windows as recorded (one tenant, ~5.5 req/s
while busy) and thinned to x0.05 (a rarely used model, ~0.3 req/s; seed 0), each window followed by 30 or 60
minutes without a request (workloads.traces.with_idle_gaps). H200 Llama-8B profile, SLA TTFT 200 ms / ITL 10 ms,
60 s interval, workers start in 60 s (the simulator's startup and the planner's configured one; the planner
measures its own from the simulated fleet's ready counts after the first wake), the wake run decides 10 s after
the first held request (ReplaySettings.fast_path_dispatch_s: watcher poll, scrape, run start).

Policies: the planner with scale to zero off (min 1 per pool, the default), on at the default
decision.scale_to_zero (quiet 600 s, a late request worth 0.1 GPU-h) and at 0.01 GPU-h per late request, and
the best static fleet (highest attainment, then fewest GPU-hours, over 1..3 x 1..3). Per run: GPU-hours, SLA
attainment, and per gap the wake (first held request, decision, replicas ready) with the TTFT of the first
request after it and how many of the requests arriving before the woken fleet served missed the TTFT target.

    .venv/bin/python benchmarks/bench_zero.py          # writes benchmarks/results/zero.json, prints the table
    .venv/bin/python benchmarks/bench_zero.py --quick  # x0.05 with 60-minute gaps only, nothing written
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sim import PROFILE, RESULTS, TRACES  # noqa: E402

BUSY_S, BURSTS = 600.0, 3
CASES = ((1.0, 1800.0), (1.0, 3600.0), (0.05, 1800.0), (0.05, 3600.0))
ZERO_COSTS = (("zero (default: 0.1 GPU-h a late request)", 0.1), ("zero (0.01 GPU-h a late request)", 0.01))
STATICS = [(p, d) for p in (1, 2, 3) for d in (1, 2, 3)]


def zero_config(cfg, late_request_cost_gpu_h: float):
    """cfg with both pools allowed to reach zero at the given cold-start price."""
    d = cfg.decision.model_dump()
    d.update(allow_scale_to_zero=True, prefill={**d["prefill"], "min_replicas": 0},
             decode={**d["decode"], "min_replicas": 0},
             scale_to_zero={**d["scale_to_zero"], "late_request_cost_gpu_h": late_request_cost_gpu_h})
    return cfg.model_copy(update={"decision": type(cfg.decision).model_validate(d)})


def gaps_of(trace, result, *, gap_s: float, ttft_ms: float) -> list[dict]:
    """Per gap: the first request after it, its TTFT, and the late ones among those before the fleet served."""
    out = []
    for j in range(1, BURSTS):
        start = j * (BUSY_S + gap_s)
        first = int(np.searchsorted(trace.arrival_s, start))
        wake = next((e for e in result.wake_events if abs(e.held_s - trace.arrival_s[first]) < 1e-6), None)
        served_s = trace.arrival_s[first] if wake is None or wake.ready_s is None else wake.ready_s
        waiting = (trace.arrival_s >= trace.arrival_s[first]) & (trace.arrival_s < served_s)
        ttft = result.requests.ttft_ms
        # when the gap's last scale to zero was applied (None: the fleet stayed up through the gap)
        zero_at = [t for t, _, _, to in result.scale_log if to == 0 and start - gap_s <= t < start]
        out.append({
            "at_zero_from_s": max(zero_at) if zero_at else None,
            "at_zero_s": start - max(zero_at) if zero_at else 0.0,
            "gap_end_s": start, "first_arrival_s": float(trace.arrival_s[first]),
            "first_ttft_ms": float(ttft[first]),
            "arrived_before_served": int(waiting.sum()),
            "late_before_served": int((ttft[waiting] > ttft_ms).sum()),
            "wake": None if wake is None else wake.as_dict(),
        })
    return out


def run_case(load: float, gap_s: float, *, profile, tables) -> dict:
    from sim.policies import PlannerPolicy, StaticPolicy, default_planner_config
    from sim.replay import ReplaySettings, replay
    from workloads.traces import load_trace, multiply_load, with_idle_gaps

    source = load_trace(TRACES / "azure2023_conv.csv.gz")
    if load != 1.0:
        source = multiply_load(source, load, seed=0)
    trace = with_idle_gaps(source, busy_s=BUSY_S, gap_s=gap_s, bursts=BURSTS)
    base = default_planner_config(profile_dir=str(PROFILE), ttft_ms=200, itl_ms=10, interval_s=60)
    scenario = ReplaySettings()
    rows = []

    def row(label: str, policy) -> dict:
        t0 = time.perf_counter()
        result = replay(trace, tables, policy, scenario=scenario)
        met = result.sla_met()
        r = {"policy": label, "gpu_hours": result.gpu_hours, "sla_attainment_pct": 100.0 * float(np.mean(met)),
             "requests": len(trace), "gaps": gaps_of(trace, result, gap_s=gap_s, ttft_ms=scenario.slo.ttft_ms),
             "wall_s": time.perf_counter() - t0}
        rows.append(r)
        return r

    off = row("planner, scale to zero off", PlannerPolicy(base, profile))
    for label, cost in ZERO_COSTS:
        row(f"planner, {label}", PlannerPolicy(zero_config(base, cost), profile))
    statics = []
    for p, d in STATICS:
        result = replay(trace, tables, StaticPolicy(p, d), scenario=scenario)
        statics.append((100.0 * float(np.mean(result.sla_met())), -result.gpu_hours, p, d))
    best = max(statics)
    row(f"best static {best[2]}x{best[3]}", StaticPolicy(best[2], best[3]))
    for r in rows:
        r["gpu_hours_saved_vs_planner"] = off["gpu_hours"] - r["gpu_hours"]
    return {"trace": trace.name, "load": load, "gap_s": gap_s, "duration_s": trace.duration_s, "rows": rows}


def table(cases: list[dict]) -> str:
    lines = ["| trace | policy | GPU-h | saved | SLA % | minutes at zero in each gap | first request after each "
             "gap: TTFT (late of arrived before served) |", "|---|---|---:|---:|---:|---|---|"]
    for c in cases:
        for r in c["rows"]:
            firsts = ", ".join(f"{g['first_ttft_ms'] / 1000:.1f} s ({g['late_before_served']} of "
                               f"{g['arrived_before_served']})" if g["wake"] else f"{g['first_ttft_ms']:.0f} ms"
                               for g in r["gaps"])
            at_zero = ", ".join(f"{g['at_zero_s'] / 60:.0f}" for g in r["gaps"])
            lines.append(f"| conv x{c['load']:g}, {c['gap_s'] / 60:.0f}-min gaps | {r['policy']} | "
                         f"{r['gpu_hours']:.2f} | {r['gpu_hours_saved_vs_planner']:.2f} | "
                         f"{r['sla_attainment_pct']:.2f} | {at_zero} | {firsts} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="x0.05 with 60-minute gaps only; nothing written")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from connectors.profiles import load_profile_dir
    from sim.lookup import ProfileTables

    profile = load_profile_dir(PROFILE)
    tables = ProfileTables(profile)
    started = time.time()
    cases = [run_case(load, gap, profile=profile, tables=tables)
             for load, gap in (CASES[-1:] if args.quick else CASES)]
    print(table(cases))
    if not args.quick:
        out = {"what": __doc__.split("\n\n")[0], "cases": cases, "wall_s": time.time() - started,
               "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        (RESULTS / "zero.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {RESULTS / 'zero.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
