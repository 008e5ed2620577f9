"""SLO attainment of the routing policies on the same fixed fleet, in the simulator.

Replays real traces through a static fleet with each router, at one of two load
models: independent tenants (`--load tenants`, the default: copies of a trace
shifted by up to +-30 s; the fleets are the best static fleets in hindsight of
the control benchmark on that load, sim_control_tenants.json) or synchronised
copies (`--load synchronised`, the stress case: shifted by up to +-1 s, every
burst K times at once; the fleets of the control benchmark's earlier synchronised
table). Routers: round-robin,
least-loaded, and the routing service's SLO-aware picker in-process (profile
estimate; its default configuration, then strategies `least` and `most` with
the other defaults). The picker runs as the service would: the adapter makes
the lifecycle calls in Dynamo's order (dispatched, prefill done with the decode
pick, first token after the KV transfer, completed), so the registry's own load
is what the service would hold.

For the default picker it also records, per request, the estimate the picker
used for the chosen endpoints against what the simulated engine then did, and
writes the error (actual - predicted) by queue depth, prompt length and KV
usage: the check that the profile-derived estimate is unbiased against an
engine built from the same profile.

Mooncake is small enough to replay again with other superposition seeds
(the K copies of the trace shifted differently): least-loaded against the
default picker per seed, the spread that says how much of a difference is
noise.

Writes benchmarks/results/routing_sim_tenants.json (tenants) or routing_sim.json
(synchronised) and prints a markdown table.

Run: .venv/bin/python benchmarks/bench_routing_sim.py [--load tenants|synchronised] [--quick | --seeds-only | --case I]
(--quick: the first 900 s of each trace, for a look while changing things;
--seeds-only: recompute the seed spread and keep the rest of the JSON;
--case I: rerun one case and keep the rest.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import load_profile_dir  # noqa: E402
from planner.config import PlannerConfig, ProfileConfig, SloTarget  # noqa: E402
from routing.config import PickerConfig  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.picker_router import LEVELS, PickerRouter  # noqa: E402
from sim.policies import make_policy  # noqa: E402
from sim.replay import ReplaySettings, replay  # noqa: E402
from sim.routing import make_router  # noqa: E402
from workloads.traces import Trace, load_trace, multiply_load  # noqa: E402
from sim.whatif.scenario import load_model  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "traces"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
RESULTS = ROOT / "benchmarks" / "results"
ROUTERS = ("round-robin", "least-loaded", "picker", "picker:least", "picker:most")
# Per load model: copies' shift (s), output file, and the cases (trace, load multiplier, fleet,
# routers). Each third case is the first fleet with two prefill workers fewer: prefill queues
# build, which is where the estimate's view of each running batch counts.
LOADS = {
    "tenants": (30.0, "routing_sim_tenants.json", [
        ("azure2023_conv.csv.gz", 8.0, "4x2", ROUTERS),
        ("mooncake_fast25_synthetic_trace.jsonl.gz", 2.0, "9x2", ROUTERS),
        ("azure2023_conv.csv.gz", 8.0, "2x2", ("round-robin", "least-loaded", "picker")),
    ]),
    "synchronised": (1.0, "routing_sim.json", [
        ("azure2023_conv.csv.gz", 8.0, "4x3", ROUTERS),
        ("mooncake_fast25_synthetic_trace.jsonl.gz", 2.0, "8x2", ROUTERS),
        ("azure2023_conv.csv.gz", 8.0, "2x3", ("round-robin", "least-loaded", "picker")),
    ]),
}
SEEDS = (1, 2, 3, 4)  # Mooncake (each load's second case) again with other superposition seeds


class _Recording(PickerRouter):
    """The picker, noting what it predicted for the endpoints it chose."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ttft: dict[int, tuple[float, float]] = {}  # rid -> (predicted TTFT ms, prompt tokens ahead)
        self.tpot: dict[int, tuple[float, float]] = {}  # rid -> (predicted TPOT ms, KV usage at dispatch)

    def pick_prefill(self, rid, isl_tokens, workers):
        w = super().pick_prefill(rid, isl_tokens, workers)
        rec = self.registry.in_flight(str(rid))
        self.ttft[rid] = (rec.predicted_ttft_ms, rec.ttft_features["prefill_tokens_in_flight"])
        return w

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers):
        d = super().pick_decode(rid, isl_tokens, osl_tokens, source, workers)
        rec = self.registry.in_flight(str(rid))
        if rec is not None and rec.tpot_features is not None:
            self.tpot[rid] = (rec.predicted_tpot_ms, rec.tpot_features["kv_usage_frac"])
        return d


def _bucketed(actual, predicted, key, edges, label) -> list[dict]:
    err = actual - predicted
    out = []
    bounds = [-np.inf, *edges, np.inf]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m = (key >= lo) & (key < hi)
        if not m.any():
            continue
        out.append({
            label: f"[{lo:g}, {hi:g})", "n": int(m.sum()),
            "actual_mean_ms": round(float(actual[m].mean()), 2), "predicted_mean_ms": round(float(predicted[m].mean()), 2),
            "bias_ms": round(float(err[m].mean()), 2), "mae_ms": round(float(np.abs(err[m]).mean()), 2),
        })
    return out


def estimate_error(router: _Recording, result, slo: SloTarget) -> dict:
    """Actual - predicted TTFT and TPOT of the chosen endpoints (ms), overall and by bucket."""
    q = result.requests
    rid = np.array(sorted(router.ttft), dtype=np.int64)
    pred = np.array([router.ttft[r][0] for r in rid])
    ahead = np.array([router.ttft[r][1] for r in rid])
    act = q.ttft_ms[rid]
    isl = q.isl_tokens[rid].astype(float)
    did = np.array([r for r in sorted(router.tpot) if q.osl_tokens[r] > 1], dtype=np.int64)
    tpot_pred = np.array([router.tpot[r][0] for r in did])
    kv = np.array([router.tpot[r][1] for r in did])
    tpot_act = q.itl_ms[did]
    return {
        "ttft": {
            "n": int(rid.size), "bias_ms": round(float((act - pred).mean()), 2),
            "mae_ms": round(float(np.abs(act - pred).mean()), 2),
            "predicted_met_but_missed_frac": round(float(((pred <= slo.ttft_ms) & (act > slo.ttft_ms)).mean()), 5),
            "by_prompt_tokens_ahead": _bucketed(act, pred, ahead, [1, 1000, 4000, 8192, 16000], "tokens_ahead"),
            "by_prompt_tokens": _bucketed(act, pred, isl, [500, 1000, 2000, 4000, 8192, 16000], "prompt_tokens"),
        },
        "tpot": {
            "n": int(did.size), "bias_ms": round(float((tpot_act - tpot_pred).mean()), 3),
            "mae_ms": round(float(np.abs(tpot_act - tpot_pred).mean()), 3),
            "predicted_met_but_missed_frac": round(float(((tpot_pred <= slo.itl_ms) & (tpot_act > slo.itl_ms)).mean()), 5),
            "by_kv_usage": _bucketed(tpot_act, tpot_pred, kv, [0.02, 0.05, 0.08, 0.12], "kv_usage_frac"),
        },
    }


def _picker_config(strategy: str | None = None) -> PickerConfig:
    return PickerConfig.model_validate(
        {"slo": {"strategy": strategy} if strategy else {}, "topology": {"levels": list(LEVELS)}}
    )


def seed_spread(profile, tables, slo: SloTarget, cfg: PlannerConfig, *, load: str) -> list[dict]:
    """Least-loaded vs the default picker on the load's Mooncake case for each of SEEDS."""
    jitter_s, _, cases = LOADS[load]
    trace_name, k, fleet = cases[1][:3]
    out = []
    for seed in SEEDS:
        trace = multiply_load(load_trace(DATA / trace_name), k, seed=seed, jitter_s=jitter_s)
        row = {"trace": f"{trace_name.split('.')[0]} x{k:g}", "fleet": fleet, "seed": seed}
        for label in ("least-loaded", "picker"):
            router = PickerRouter(profile, slo=slo, config=_picker_config()) if label == "picker" else make_router(label)
            result = replay(trace, tables, make_policy(f"static:{fleet}", cfg=cfg, profile=profile),
                            scenario=ReplaySettings(slo=slo, router=label), router=router)
            row[label] = float(result.sla_met().mean())
        row["picker_minus_least_loaded_points"] = round(100 * (row["picker"] - row["least-loaded"]), 3)
        out.append(row)
        print(row, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", choices=tuple(LOADS), default="tenants",
                    help="copies of a trace: independent tenants (+-30 s, the default) or synchronised (+-1 s, stress)")
    ap.add_argument("--quick", action="store_true", help="first 900 s of each trace; results are not written")
    ap.add_argument("--seeds-only", action="store_true", help="only the seed spread, merged into the existing JSON")
    ap.add_argument("--case", type=int, default=None,
                    help="only the load's case i (0-based): its rows replace that trace and fleet's rows in the existing JSON")
    args = ap.parse_args()
    profile = load_profile_dir(PROFILE)
    tables = ProfileTables(profile)
    slo = SloTarget(ttft_ms=200, itl_ms=10)
    cfg = PlannerConfig(profile=ProfileConfig(dir=str(PROFILE)), slo=slo)
    defaults = PickerConfig().slo
    jitter_s, out_name, all_cases = LOADS[args.load]
    out = RESULTS / out_name
    if args.seeds_only:
        doc = json.loads(out.read_text())
        doc["seed_spread"] = seed_spread(profile, tables, slo, cfg, load=args.load)
        doc["seed_spread_load_average_1m_at_end"] = os.getloadavg()[0]
        out.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    rows, errors = [], {}
    cases = all_cases if args.case is None else [all_cases[args.case]]
    for trace_name, k, fleet, routers in cases:
        trace = multiply_load(load_trace(DATA / trace_name), k, seed=0, jitter_s=jitter_s)
        if args.quick:
            m = trace.arrival_s < 900.0
            trace = Trace(trace.name, trace.arrival_s[m], trace.isl_tokens[m], trace.osl_tokens[m])
        label_trace = f"{trace_name.split('.')[0]} x{k:g}"
        for label in routers:
            if label.startswith("picker"):
                config = _picker_config(label.split(":", 1)[1] if ":" in label else None)
                # the estimate error is recorded on each trace's first fleet only
                record = label == "picker" and fleet == next(c[2] for c in all_cases if c[0] == trace_name)
                router = (_Recording if record else PickerRouter)(profile, slo=slo, config=config)
            else:
                router = make_router(label, profile=profile, slo=slo, seed=0)
            t0 = time.perf_counter()
            result = replay(trace, tables, make_policy(f"static:{fleet}", cfg=cfg, profile=profile),
                            scenario=ReplaySettings(slo=slo, router=label.split(":")[0]), router=router)
            q = result.requests
            rows.append({
                "trace": label_trace, "load_model": load_model(k, jitter_s), "fleet": fleet, "router": label,
                "picker_strategy": router.config.slo.strategy if label.startswith("picker") else None,
                "picker_headroom_margin_frac": router.config.slo.headroom_margin_frac if label.startswith("picker") else None,
                "requests": int(len(trace.arrival_s)), "slo_attainment": float(result.sla_met().mean()),
                "ttft_missed_frac": float((q.ttft_ms > slo.ttft_ms).mean()),
                "itl_missed_frac": float((np.nan_to_num(q.itl_ms) > slo.itl_ms).mean()),
                "wall_s": round(time.perf_counter() - t0, 1),
            })
            if isinstance(router, _Recording):
                errors[label_trace] = estimate_error(router, result, slo)
            print(rows[-1], flush=True)
    table = [f"Load: copies shifted by up to +-{jitter_s:g} s ({args.load}).", "",
             "| trace | fleet | router | SLA attainment | TTFT missed | ITL missed |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        name = r["router"]
        if name == "picker":
            name = f"picker (default: {r['picker_strategy']}, margin {r['picker_headroom_margin_frac']:g})"
        table.append(f"| {r['trace']} | {r['fleet']} | {name} | {100 * r['slo_attainment']:.2f}% | "
                     f"{100 * r['ttft_missed_frac']:.2f}% | {100 * r['itl_missed_frac']:.2f}% |")
    print("\n" + "\n".join(table))
    for trace_label, e in errors.items():
        print(f"\n{trace_label}: TTFT actual - predicted {e['ttft']['bias_ms']} ms (MAE {e['ttft']['mae_ms']}), "
              f"TPOT {e['tpot']['bias_ms']} ms (MAE {e['tpot']['mae_ms']})")
    if args.quick:
        return 0
    if args.case is not None:
        doc = json.loads(out.read_text())
        doc["rows"] = [r for r in doc["rows"] if (r["trace"], r["fleet"]) != (rows[0]["trace"], rows[0]["fleet"])] + rows
        doc.setdefault("estimate_error", {}).update(errors)
        doc[f"load_average_1m_at_end_case_{args.case}"] = os.getloadavg()[0]
        out.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    spread = seed_spread(profile, tables, slo, cfg, load=args.load)
    out.write_text(json.dumps({
        "what": "SLO attainment per router on a fixed fleet (TTFT 200 ms, ITL 10 ms, H200 Llama-8B profile); "
                "estimate error of the default picker (actual - predicted, ms) on the endpoints it chose",
        "load_model": "; ".join(dict.fromkeys(r["load_model"] for r in rows)),  # each row's, once
        "picker_defaults": defaults.model_dump(),
        "rows": rows, "estimate_error": errors, "seed_spread": spread,
        "load_average_1m_at_end": os.getloadavg()[0],
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
