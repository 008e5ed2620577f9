"""Several models under one GPU budget: the arbitration by expected SLA loss against a fixed split and a fixed
priority order (issue 42 item 1).

Three models, each its own trace, SLA and planner (the default configuration) on the H200 Llama-3.1-8B
profile, replayed together against one GPU budget (sim.fleet_replay, the fleet what-if's core):
  code      Azure 2023 code x8, TTFT 200 ms / ITL 10 ms
  conv      Azure 2023 conv x8, TTFT 200 ms / ITL 10 ms
  mooncake  Mooncake's synthetic trace x2, TTFT 3 s / ITL 20 ms (long prompts, the loose SLA)
Load model: every copy of a trace an independent tenant (each request shifted by U(-30 s, +30 s), seed 0);
cold start (each planner's warm start from its first interval, the initial fleets cut to the budget alike
for every rule). 60 s interval, 60 s startup, least-loaded routing. Rules, at each budget:
  loss (default)   planner.fleet.arbitrate as shipped: each model first keeps its wants up to its priority share
                   of the budget (guaranteed_share_frac 1), the rest by expected SLA loss
  loss, no shares  all of the budget by expected SLA loss (guaranteed_share_frac 0)
  split       fixed equal shares, unused GPUs not lent
  priority    wants in full in priority order (equal priorities: the order above)
  static      the best static split in hindsight: per model the P x D fleet, together within the budget,
              maximising the mean of the models' attainment (each model's static fleets replayed alone)
Then the same at 16 and 18 GPUs with code at priority 2 (the others 1): the loss rule's shares follow the
priorities (code's is its floor plus half of what the floors leave), the split stays equal, the priority
order puts code first.
The unconstrained row is the planners alone (budget far above their wants). Figures: each model's SLA
attainment (TTFT and mean ITL per request) and GPU-hours, the fleet's (all requests pooled), the mean and the
worst over models.

    .venv/bin/python benchmarks/bench_budget.py            # budgets 14, 16, 18, 20 (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench_budget.py --quick    # budgets 14 and 18, no static search

Writes benchmarks/results/budget.json (with a Markdown table).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench_sim import DATA, PROFILE, RESULTS, TRACES  # noqa: E402  (the control benchmark's profile and traces)

MODELS = (  # name, trace file, copies, TTFT ms, ITL ms
    ("code", "azure2023_code.csv.gz", 8, 200.0, 10.0),
    ("conv", "azure2023_conv.csv.gz", 8, 200.0, 10.0),
    ("mooncake", "mooncake_fast25_synthetic_trace.jsonl.gz", 2, 3000.0, 20.0),
)
RULES = (("loss (default: shares first)", "loss", 1.0), ("loss, no shares", "loss", 0.0), ("split", "split", 0.0),
         ("priority", "priority", 0.0))
# The unequal-priority case: the busiest model counts twice.
PRIORITIES = {"code": 2.0}
PRIORITY_BUDGETS = (16, 18)
UNCONSTRAINED_GPUS = 1000
# Static fleets tried per model (prefill, decode), each replayed alone.
STATIC_GRID = {"code": [(p, d) for p in range(2, 10) for d in (1, 2)],
               "conv": [(p, d) for p in range(1, 6) for d in range(1, 5)],
               "mooncake": [(p, d) for p in range(2, 10) for d in (1, 2)]}


JITTER_S = 30.0  # --jitter-s sets it: 30 independent tenants, 1 synchronised copies (the stress case)


def fleet_spec(budget: int, rule: str, share: float, priorities: dict[str, float]):
    from sim.whatif.fleet import FleetModel, FleetWhatIf
    from sim.whatif.scenario import WhatIfScenario

    models = [FleetModel(name=name, priority=priorities.get(name, 1.0), scenario=WhatIfScenario(
        trace=str(TRACES / file), profile_dir=str(PROFILE), ttft_ms=ttft, itl_ms=itl, load_multiplier=k,
        jitter_s=JITTER_S, seed=0)) for name, file, k, ttft, itl in MODELS]
    return FleetWhatIf(models=models, budget_gpus=budget, rule=rule, guaranteed_share_frac=share)


def fresh(members):
    """The same traces and settings with new planners (a planner keeps state between intervals)."""
    from sim.policies import PlannerPolicy

    return [dataclasses.replace(m, policy=PlannerPolicy(m.policy.cfg, m.policy.profile, name="planner"))
            for m in members]


def static_replays(members) -> dict[str, dict[tuple[int, int], tuple[float, float]]]:
    """Each model's static fleets replayed alone: (P, D) -> (attainment, GPU-hours)."""
    from sim.policies import StaticPolicy
    from sim.replay import replay

    out = {}
    for m in members:
        out[m.name] = {}
        for p, d in STATIC_GRID[m.name]:
            r = replay(m.trace, m.tables, StaticPolicy(p, d), scenario=m.scenario)
            out[m.name][(p, d)] = (float(r.sla_met().mean()), r.gpu_hours)
        print(f"static {m.name}: {len(out[m.name])} fleets replayed", flush=True)
    return out


def best_static_split(statics, budget: int) -> dict | None:
    """Per model the static fleet, together within the budget, maximising the mean attainment."""
    names = list(statics)
    best = None
    for combo in itertools.product(*(statics[n].items() for n in names)):
        gpus = sum(p + d for (p, d), _ in combo)
        if gpus > budget:
            continue
        mean = sum(a for _, (a, _) in combo) / len(combo)
        if best is None or mean > best[0]:
            best = (mean, combo)
    if best is None:
        return None
    return {n: {"fleet": f"{p}x{d}", "slo_attainment": a, "gpu_hours": h}
            for n, ((p, d), (a, h)) in zip(names, best[1])}


def row(label: str, summary: dict) -> dict:
    return {"rule": label, "budget_gpus": summary["budget_gpus"],
            "priorities": {n: m["priority"] for n, m in summary["models"].items()},
            "models": {n: {k: m[k] for k in ("slo_attainment", "gpu_hours", "held_intervals", "max_replicas")}
                       for n, m in summary["models"].items()},
            "fleet_attainment": summary["fleet_attainment"], "mean_model_attainment": summary["mean_model_attainment"],
            "worst_model_attainment": summary["worst_model_attainment"], "gpu_hours": summary["gpu_hours"],
            "short_intervals": summary["short_intervals"], "peak_granted_gpus": summary["peak_granted_gpus"],
            "peak_allocated_gpus": summary["peak_allocated_gpus"], "wall_s": summary["replay_wall_s"]}


def static_row(budget: int, split: dict, requests: dict[str, int]) -> dict:
    total = sum(requests.values())
    att = {n: v["slo_attainment"] for n, v in split.items()}
    return {"rule": "static (best split in hindsight)", "budget_gpus": budget,
            "models": {n: {"slo_attainment": v["slo_attainment"], "gpu_hours": v["gpu_hours"], "fleet": v["fleet"]}
                       for n, v in split.items()},
            "fleet_attainment": sum(att[n] * requests[n] for n in att) / total,
            "mean_model_attainment": sum(att.values()) / len(att), "worst_model_attainment": min(att.values()),
            "gpu_hours": sum(v["gpu_hours"] for v in split.values())}


def markdown(rows: list[dict], names: list[str]) -> str:
    head = ("| budget GPUs | rule | " + " | ".join(f"{n} attainment / GPU-h" for n in names)
            + " | fleet attainment | mean / worst model | GPU-hours |")
    lines = [head, "|" + "---|" * (len(names) + 5)]
    for r in rows:
        budget = "unconstrained" if r["budget_gpus"] >= UNCONSTRAINED_GPUS else str(r["budget_gpus"])
        cells = []
        for n in names:
            m = r["models"][n]
            extra = f" ({m['fleet']})" if "fleet" in m else ""
            cells.append(f"{m['slo_attainment']:.2%} / {m['gpu_hours']:.2f}{extra}")
        lines.append(f"| {budget} | {r['rule']} | " + " | ".join(cells) + f" | {r['fleet_attainment']:.2%} | "
                     f"{r['mean_model_attainment']:.2%} / {r['worst_model_attainment']:.2%} | {r['gpu_hours']:.2f} |")
    return "\n".join(lines)


def priority_case(members) -> list[dict]:
    """The rules at PRIORITY_BUDGETS with code at priority 2."""
    from sim.whatif.fleet import run_fleet_what_if

    rows = []
    for budget in PRIORITY_BUDGETS:
        for label, rule, share in RULES:
            summary, _ = run_fleet_what_if(fleet_spec(budget, rule, share, PRIORITIES), members=fresh(members))
            rows.append(row(label, summary))
            print(f"priorities {PRIORITIES}, budget {budget} {label}: " + ", ".join(
                f"{n} {m['slo_attainment']:.2%}" for n, m in summary["models"].items()), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="budgets 14 and 18, no static search")
    ap.add_argument("--budgets", default=None, help="comma-separated budgets (GPUs); default 14,16,18,20")
    ap.add_argument("--priority-case-only", action="store_true",
                    help="re-run only the unequal-priority case into the existing results file")
    ap.add_argument("--jitter-s", type=float, default=30.0,
                    help="copies shifted by up to +- this, s: 30 independent tenants (default), 1 synchronised copies "
                    "(the stress case: no static search, no priority case)")
    ap.add_argument("--out", default=None, help="default benchmarks/results/budget.json (budget_synchronised.json "
                    "with --jitter-s 1)")
    args = ap.parse_args()
    global JITTER_S
    JITTER_S = args.jitter_s
    stress = args.jitter_s != 30.0
    args.out = args.out or str(RESULTS / ("budget_synchronised.json" if stress else "budget.json"))
    warnings.simplefilter("ignore")
    from sim.whatif.fleet import fleet_members, run_fleet_what_if
    from sim.whatif.scenario import load_model

    if args.priority_case_only:
        members = fleet_members(fleet_spec(UNCONSTRAINED_GPUS, "loss", 0.0, {}))
        out = json.loads(Path(args.out).read_text())
        rows = priority_case(members)
        out["priority_case"] = {"priorities": PRIORITIES, "rows": rows,
                                "markdown": markdown(rows, [m.name for m in members])}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(out["priority_case"]["markdown"])
        return
    budgets = ([int(b) for b in args.budgets.split(",")] if args.budgets else [14, 18] if args.quick
               else [14, 16, 18, 20])
    t0 = time.perf_counter()
    members = fleet_members(fleet_spec(UNCONSTRAINED_GPUS, "loss", 0.0, {}))
    requests = {m.name: len(m.trace) for m in members}
    rows = []
    summary, _ = run_fleet_what_if(fleet_spec(UNCONSTRAINED_GPUS, "loss", 0.0, {}), members=fresh(members))
    rows.append(row("planners alone", summary))
    print(f"unconstrained: peak {summary['peak_granted_gpus']} GPUs granted, fleet "
          f"{summary['fleet_attainment']:.2%}", flush=True)
    statics = None if args.quick or stress else static_replays(members)
    for budget in budgets:
        for label, rule, share in RULES:
            summary, _ = run_fleet_what_if(fleet_spec(budget, rule, share, {}), members=fresh(members))
            rows.append(row(label, summary))
            print(f"budget {budget} {label}: " + ", ".join(f"{n} {m['slo_attainment']:.2%}"
                                                             for n, m in summary["models"].items())
                  + f"; fleet {summary['fleet_attainment']:.2%}, {summary['gpu_hours']:.2f} GPU-h "
                  f"(load avg {os.getloadavg()[0]:.1f})", flush=True)
        if statics is not None:
            split = best_static_split(statics, budget)
            if split is not None:
                rows.append(static_row(budget, split, requests))
    priority_rows = [] if args.quick or stress else priority_case(members)
    names = [m.name for m in members]
    out = {
        "what": "three models under one GPU budget: the arbitration by expected SLA loss (planner.fleet) against "
                "a fixed equal split, a fixed priority order and the best static split in hindsight",
        "models": [{"name": n, "trace": f, "copies": k, "ttft_ms": t, "itl_ms": i, "requests": requests[n]}
                   for n, f, k, t, i in MODELS],
        "profile": str(PROFILE.relative_to(DATA)), "load_model": load_model(MODELS[0][2], JITTER_S) + " (seed 0)", "start": "cold (each planner's warm start from its first interval, cut to the budget)",
        "interval_s": 60, "startup_s": 60, "priorities": "equal (1)",
        "rows": rows, "markdown": markdown(rows, names),
        "priority_case": {"priorities": PRIORITIES, "rows": priority_rows,
                          "markdown": markdown(priority_rows, names) if priority_rows else ""},
        "wall_s": time.perf_counter() - t0,
        "load_avg_1min_at_end": os.getloadavg()[0],
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(out["markdown"])
    print(f"wrote {args.out} in {out['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
