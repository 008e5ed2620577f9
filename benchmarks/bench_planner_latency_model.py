"""What the planner's TTFT source changes: the profile vs the published latency model the router uses.

Scenario: the Azure LLM conversation trace 2023 x8 as independent tenants (eight
copies, each request shifted by up to +-30 s: the default load model), the
measured Dynamo H200 Llama-3.1-8B profile for the simulated fleet, the planner
policy (default configuration, SLA 200 ms TTFT / 10 ms ITL), least-loaded routing,
seed 0. Also the synchronised stress case (+-1 s copies) with the same model.

The model: the retrain core as benchmarks/bench_retrain.py runs it (its own
functions: the scenario's replay recorded by a real in-process routing service,
newest 100k samples, prepare -> fit -> export), on this scenario's samples. The
exported document is then the planner's TTFT view in a second replay
(`WhatIfScenario.latency_model_path`: mean TTFT on an idle prefill engine as the
service time, p90 for which requests can meet the target, and the correction
factor against the same mean). The same pairs with the correction step off show
what the source changes on its own (the correction factor otherwise absorbs most
of a difference in level between the two sources).

Writes benchmarks/results/planner_latency_model.json and prints a table.
Run: .venv/bin/python benchmarks/bench_planner_latency_model.py [--samples-cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import warnings  # noqa: E402

import numpy as np  # noqa: E402

from bench_retrain import DATA, DEFAULT_DECODE_PICK, PROFILE_DIR, samples_cached  # noqa: E402
from connectors.profiles import load_profile_dir  # noqa: E402
from planner.latency.profile_checks import ProfileRangeWarning  # noqa: E402
from planner.latency.ttft_view import ProfileTtftView  # noqa: E402
from routing.training.export import to_document  # noqa: E402
from routing.models.predictor import ProfileEstimator  # noqa: E402
from routing.training.config import TrainingConfig  # noqa: E402
from routing.training.data import prepare_samples  # noqa: E402
from routing.training.evaluation import evaluate_all  # noqa: E402
from routing.training.fit import fit_all  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.policies import default_planner_config, make_policy  # noqa: E402
from sim.published_ttft import load_ttft_view  # noqa: E402
from sim.replay import ReplayResult, replay  # noqa: E402
from sim.whatif.report import summarize  # noqa: E402
from sim.routing import make_router  # noqa: E402
from sim.whatif.scenario import WhatIfScenario, build_replay_settings, load_model, load_scenario_trace, run_what_if  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "planner_latency_model.json"
SCENARIO = {"name": "azure_conv x8", "trace": "azure2023_conv.csv.gz", "load_multiplier": 8.0, "window_s": None}
JITTERS_S = (30.0, 1.0)
VIEW_ISL = (128, 512, 1024, 2048, 4096, 8192)


def train_document(samples: list[dict], *, max_samples: int) -> tuple[dict, dict]:
    """(the exported model document, its held-out TTFT figures) from the newest max_samples samples."""
    cfg = TrainingConfig()
    estimate = ProfileEstimator(load_profile_dir(PROFILE_DIR))
    prepared = prepare_samples(samples[-max_samples:], cfg, estimate=estimate)
    t0 = time.perf_counter()
    models = fit_all(prepared, cfg)
    fit_s = time.perf_counter() - t0
    doc = to_document(models, version="bench-azure-conv-x8", metrics={}, created_at_s=0.0)
    ev = evaluate_all(prepared, cfg, candidate_document=doc, current_document=None, estimate=estimate)
    c = ev.candidate["ttft"]
    return doc, {"samples_used": min(max_samples, len(samples)), "fit_s": round(fit_s, 2),
                 "ttft_holdout_mape": round(c["mape"], 5), "ttft_holdout_p90_coverage": round(c["p90_coverage"], 4)}


def view_table(path: Path) -> list[dict]:
    """Idle-engine TTFT at a few prompt lengths: profile vs the model's mean and p90, ms."""
    profile = load_profile_dir(PROFILE_DIR)
    view, prof = load_ttft_view(path, profile), ProfileTtftView(profile.prefill)
    isl = np.array(VIEW_ISL, dtype=float)
    rows = zip(isl, prof.ttft_ms_many(isl), view.ttft_ms_many(isl), view.ttft_ms_many(isl, quantile="p90"))
    return [{"isl_tokens": int(n), "profile_ms": round(float(p), 2), "model_mean_ms": round(float(m), 2),
             "model_p90_ms": round(float(q), 2)} for n, p, m, q in rows]


def scenario(jitter_s: float, model_path: Path | None) -> WhatIfScenario:
    return WhatIfScenario(trace=str(DATA / "traces" / SCENARIO["trace"]), profile_dir=str(PROFILE_DIR),
                          load_multiplier=SCENARIO["load_multiplier"], jitter_s=jitter_s, seed=0,
                          latency_model_path=None if model_path is None else str(model_path))


def replay_without_correction(sc: WhatIfScenario) -> tuple[dict, ReplayResult]:
    """The what-if's replay with the correction step off: what the TTFT source changes on its own."""
    trace = load_scenario_trace(sc)
    profile = load_profile_dir(sc.profile_dir)
    cfg = default_planner_config(profile_dir=sc.profile_dir, ttft_ms=sc.ttft_ms, itl_ms=sc.itl_ms,
                                 interval_s=sc.interval_s)
    cfg = cfg.model_copy(update={"correction": cfg.correction.model_copy(update={"enabled": False})})
    view = load_ttft_view(sc.latency_model_path, profile) if sc.latency_model_path else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        result = replay(trace, ProfileTables(profile), make_policy("planner", cfg=cfg, profile=profile, ttft_view=view),
                        scenario=build_replay_settings(sc, profile), router=make_router("least-loaded", profile=profile,
                                                                                         slo=sc.slo(), seed=sc.seed))
    return summarize(result), result


def replay_row(jitter_s: float, model_path: Path | None, *, correction: bool = True) -> dict:
    sc = scenario(jitter_s, model_path)
    s, result = run_what_if(sc) if correction else replay_without_correction(sc)
    from_model = sum("TTFT from published model" in r for r in result.timeline.reasons)
    return {"jitter_s": jitter_s, "load_model": load_model(sc.load_multiplier, jitter_s),
            "ttft_source": "profile" if model_path is None else "published model (trained on this scenario)",
            "correction": correction, "intervals": len(result.timeline.t_s),
            "intervals_sized_from_model": from_model, "prefill_targets": result.timeline.prefill_target,
            "requests": s["requests"], "slo_attainment": round(s["slo_attainment"], 5),
            "ttft_attainment": round(s["ttft_attainment"], 5), "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
            "gpu_hours": round(s["gpu_hours"], 4),
            "gpu_hours_by_pool": {k: round(v, 4) for k, v in s["gpu_hours_by_pool"].items()},
            "max_replicas": s["max_replicas"], "scale_events": s["scale_events"], "wall_s": round(s["wall_s"], 1)}


def compare_targets(rows: list[dict]) -> None:
    """Each model row gains how many intervals' prefill targets differ from its profile twin's (then the lists go)."""
    for r in rows:
        if r["ttft_source"] != "profile":
            twin = next(p for p in rows if p["ttft_source"] == "profile" and p["jitter_s"] == r["jitter_s"]
                        and p["correction"] == r["correction"])
            pairs = list(zip(r["prefill_targets"], twin["prefill_targets"]))
            r["prefill_target_differs_intervals"] = sum(a != b for a, b in pairs)
            r["prefill_target_sum_vs_profile"] = sum(a - b for a, b in pairs)
    for r in rows:
        r.pop("prefill_targets")


def table(rows: list[dict]) -> str:
    lines = ["| load | correction | TTFT source | SLA attainment | TTFT p99 ms | GPU-hours (prefill / decode) "
             "| max prefill |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        pools = r["gpu_hours_by_pool"]
        lines.append(f"| {r['load_model']} | {'on' if r['correction'] else 'off'} | {r['ttft_source']} "
                     f"| {r['slo_attainment']:.2%} | {r['ttft_p99_ms']:.0f} "
                     f"| {r['gpu_hours']:.2f} ({pools.get('prefill', 0):.2f} / {pools.get('decode', 0):.2f}) "
                     f"| {r['max_replicas']['prefill']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-samples", type=int, default=100_000, help="newest samples trained on (default: %(default)s)")
    ap.add_argument("--samples-cache", type=Path, help="folder keeping the recorded samples (bench_retrain's format)")
    args = ap.parse_args(argv)
    for p in (PROFILE_DIR, DATA / "traces" / SCENARIO["trace"]):
        if not p.exists():
            print(f"{p}: benchmark data not found (../shared/data beside the project)", file=sys.stderr)
            return 2
    load_start = os.getloadavg()[0]
    recordings, info, *_ = samples_cached(SCENARIO, quick=False, cache_dir=args.samples_cache)
    samples = recordings[DEFAULT_DECODE_PICK]  # decode named when prefill returns, as the fleet routes
    doc, training = train_document(samples, max_samples=args.max_samples)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.json"
        path.write_text(json.dumps(doc))
        views = view_table(path)
        rows = [replay_row(j, m, correction=c) for c in (True, False) for j in JITTERS_S for m in (None, path)]
    compare_targets(rows)
    result = {
        "what": "planner TTFT source: the profile vs a published latency model trained by the retrain core on the "
                "scenario's own samples; SLA attainment and GPU-hours of the simulated fleet",
        "scenario": {**SCENARIO, "profile": "profiles/dynamo/profiler/H200_TP1P_TP1D", "policy": "planner (default "
                     "config)", "sla": {"ttft_ms": 200, "itl_ms": 10}, "router": "least-loaded", "seed": 0},
        "samples": {**info, "from": "the jitter 30 s replay (planner policy, profile sizing)"},
        "training": training,
        "idle_ttft": views,
        "rows": rows,
        "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(views, indent=1))
    print(table(rows))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
