"""SLO attainment of the routing policies on the same fixed fleet, in the simulator.

Replays real traces through a static fleet (the best static fleet in hindsight
from the control-quality benchmark) with each router: round-robin,
least-loaded, and the routing service's SLO-aware picker in-process (profile
estimate, strategy `least` (the default) and `most`). Writes
benchmarks/results/routing_sim.json and prints a markdown table.

Run: .venv/bin/python benchmarks/bench_routing_sim.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import load_profile_dir  # noqa: E402
from planner.config import PlannerConfig, ProfileConfig, SloTarget  # noqa: E402
from routing.config import PickerConfig  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.picker_router import LEVELS, PickerRouter  # noqa: E402
from sim.policies import make_policy  # noqa: E402
from sim.replay import Scenario, replay  # noqa: E402
from sim.routing import make_router  # noqa: E402
from sim.traces import load_trace, multiply_load  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "traces"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
OUT = ROOT / "benchmarks" / "results" / "routing_sim.json"
CASES = [("azure2023_conv.csv.gz", 8.0, "4x3"), ("mooncake_fast25_synthetic_trace.jsonl.gz", 2.0, "8x2")]
ROUTERS = ["round-robin", "least-loaded", "picker:least", "picker:most"]


def main() -> int:
    profile = load_profile_dir(PROFILE)
    tables = ProfileTables(profile)
    slo = SloTarget(ttft_ms=200, itl_ms=10)
    cfg = PlannerConfig(profile=ProfileConfig(dir=str(PROFILE)), slo=slo)
    rows = []
    for trace_name, k, fleet in CASES:
        trace = multiply_load(load_trace(DATA / trace_name), k, seed=0)
        for label in ROUTERS:
            if label.startswith("picker"):
                strategy = label.split(":", 1)[1]
                router = PickerRouter(profile, slo=slo, config=PickerConfig.model_validate(
                    {"slo": {"strategy": strategy}, "topology": {"levels": list(LEVELS)}}))
            else:
                router = make_router(label, profile=profile, slo=slo, seed=0)
            t0 = time.perf_counter()
            result = replay(trace, tables, make_policy(f"static:{fleet}", cfg=cfg, profile=profile),
                            scenario=Scenario(slo=slo, router=label.split(":")[0]), router=router)
            rows.append({
                "trace": f"{trace_name.split('.')[0]} x{k:g}", "fleet": fleet, "router": label,
                "requests": int(len(trace.arrival_s)), "slo_attainment": float(result.sla_met().mean()),
                "wall_s": time.perf_counter() - t0,
            })
            print(rows[-1], flush=True)
    OUT.write_text(json.dumps({
        "what": "SLO attainment per router on a fixed fleet (TTFT 200 ms, ITL 10 ms, H200 Llama-8B profile)",
        "rows": rows, "load_average_1m_at_end": os.getloadavg()[0],
    }, indent=2) + "\n")
    print("\n| trace | fleet | router | SLA attainment |\n|---|---|---|---:|")
    for r in rows:
        print(f"| {r['trace']} | {r['fleet']} | {r['router']} | {100 * r['slo_attainment']:.2f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
