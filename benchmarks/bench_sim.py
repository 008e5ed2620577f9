"""Fleet simulator benchmarks: replay speed, and control quality of the scaling policies.

Replay speed: simulated requests per wall second with the default planner in the
loop on the control table's traces at its load model (azure2023_conv x1 and x8,
azure2023_code x8, mooncake x2; copies shifted by up to +-jitter_s), each in a fresh
process so its peak memory (ru_maxrss) is its own; the process replays twice, and
the first replay (which also pays the process's one-time costs: the thread-pool scan,
any model library a fit imports lazily) is reported beside the second. Target:
>= 20,000 requests/s, <= 500 MB.

Control quality: policies x traces on the H200 Llama-3.1-8B profile, SLA TTFT
200 ms and ITL 10 ms (per request: TTFT and mean ITL), 60 s startup delay, 60 s
interval, least-loaded routing. Load multiplier K superposes K copies of the
trace, each request shifted by U(-30 s, +30 s) (seed 0): independent tenants;
`--jitter-s 1` is the synchronised stress case (every burst K times at once). The best static fleet in
hindsight is the cheapest P x D whose attainment reaches the default planner's; the
hindsight-reactive row is the shortest hold (sim.oracle.reactive_reference: the oracle's
per-interval needs, each known once its interval has finished, the largest of the last w
held) reaching it, and `hindsight_frontier` lists every hold measured.
`planner+shape` (benchmark only) is the default planner told the whole trace's exact
prompt-length and context coefficients of variation (sizing.length_cv: configured with
sizing.isl_cv, sizing.decode_context_cv) instead of measuring them from the frontend's
length histograms over the last 30 minutes, as the default does: what the estimate costs.
`planner+warm` (benchmark only; the Azure traces and Mooncake) is the default planner warmed as
Dynamo's --load-predictor-warmup-trace warms its own (predictor.warmup_trace_path) with another draw of
the same K copies (tenants' offsets drawn with seed 100), written as Mooncake JSONL: a stand-in for the
previous hour of the same service, which these one-hour traces do not have. It carries the same hour's
bursts at the same minutes (--warmup rotated: the trace rotated by half its length, the same bursts at
other minutes); its arrivals give each warm interval its peak rate too, so arrival clumping is read from
the first run. `planner+running` replays that stand-in through the fleet and the planner first, unscored
(ReplaySettings.lead_in_s), then the trace: a planner started against a running fleet, with its history,
its stabilization window and the capacity it holds.
Every dynamic policy starts warm by default (issue 40): the stand-in hour (for the ServeGen day, the hour
before it) replayed through the fleet and the policy, unscored, then the planner restarted where the trace
begins (ReplaySettings.lead_in_restart): its first run finds no recorded recommendation and reads the hour as
its Prometheus history (planner.steps.history_warm_start). `+cold` starts on the trace with nothing before
it (the start every row had before), `+running` does not restart, `+warm` is the warm-up trace on a fresh
fleet; each row's `start` names it.
`planner+recurrence`, `planner+warm+recurrence` and `planner+running+recurrence` turn on the recurrence hold
(decision.independent_stabilization_s 360 s, rank 2: while sizing takes the mean forecast, a scale-down
holds at the largest target two of the window's recommendations reached, not at the highest).
`planner+flat-hold`, `planner+warm+flat-hold` and `planner+running+flat-hold` set FLAT_HOLD_SETTINGS: while
arrivals look independent, prefill sized on each interval's flat load (no burst sizing on top) and a scale-down
held at the highest recommendation of 420 s; the p90 basis only once two runs in a row read clumping. Each of
these variants gets its own cheapest static fleet reaching its attainment. `planner+hpa`, `planner+warm+hpa`
and `planner+running+hpa` set HPA_WINDOW_SETTINGS, the default before flat-floor: burst sizing while arrivals
look independent, HPA's 300 s hold alone (no floor), the p90 basis from one reading of a clumping index of 1.8.
`planner+served` and `planner+running+served` set correction.replicas "served" (issue 40): the correction divides
the interval's load by the replicas that served it (time-weighted ready replicas, planner.latency.served) instead
of those the fleet has when the run reads it.
Planner rows carry diagnostics: the share of requests no fleet can serve in time
(single-request prefill above the TTFT target), misses by pool, and how
concentrated the misses are in the worst intervals.

    .venv/bin/python benchmarks/bench_sim.py            # everything (~20-30 min on 2 cores)
    .venv/bin/python benchmarks/bench_sim.py --quick    # without the ServeGen day
    .venv/bin/python benchmarks/bench_sim.py --speed-only
    .venv/bin/python benchmarks/bench_sim.py --ablation  # one design change at a time (~15 min)

Writes benchmarks/results/sim_speed.json and sim_control.json (with Markdown tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
PROFILE = DATA / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
TRACES = DATA / "traces"
RESULTS = ROOT / "benchmarks" / "results"

SPEED_CHILD = r"""
import json, os, resource, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
from connectors.profiles import load_profile_dir
from sim.lookup import ProfileTables
from sim.policies import default_planner_config, make_policy
from sim.replay import ReplaySettings, replay
from planner.config import SloTarget
from workloads.servegen import load_servegen, synthesize_servegen
from workloads.traces import load_trace, multiply_load
t0 = time.perf_counter()
profile = load_profile_dir({profile!r})
tables = ProfileTables(profile)
if {trace!r}.endswith(".tar.gz"):  # a ServeGen archive: its day 1 at x0.02, no copies
    trace = synthesize_servegen(load_servegen({trace!r}), start_s=86_400, duration_s=86_400, seed=0, rate_scale=0.02)
else:
    trace = load_trace({trace!r})
if {k!r} != 1:
    trace = multiply_load(trace, {k!r}, seed=0, jitter_s={jitter_s!r})
setup_s = time.perf_counter() - t0
cfg = default_planner_config(profile_dir={profile!r}, ttft_ms={ttft_ms!r}, itl_ms={itl_ms!r}, interval_s=60)
scenario = ReplaySettings(slo=SloTarget(ttft_ms={ttft_ms!r}, itl_ms={itl_ms!r}))

def run():
    return replay(trace, tables, make_policy("planner", cfg=cfg, profile=profile), scenario=scenario)

# The first replay in a fresh process also pays what a process does once (the thread-pool scan,
# any model library a fit imports lazily: statsmodels only for a trend or season, scikit-learn
# from gradient boosting's 200 points); the second, with a new policy, is the replay alone.
cold = run()
cold_met, cold_gpu_h = cold.sla_met(), cold.gpu_hours
cold_wall_s, cold_planner_wall_s = cold.wall_s, cold.policy_wall_s
del cold
c0 = time.process_time()
r = run()
cpu_s = time.process_time() - c0
if not (r.gpu_hours == cold_gpu_h and (r.sla_met() == cold_met).all()):
    raise SystemExit("the second replay's outcome differs from the first's: not deterministic")
n = len(trace)
print(json.dumps(dict(requests=n, wall_s=r.wall_s, setup_s=setup_s,
    requests_per_wall_s=n / r.wall_s, intervals=len(r.timeline.t_s), cpu_s=cpu_s, requests_per_cpu_s=n / cpu_s,
    planner_wall_s=r.policy_wall_s, simulator_wall_s=r.wall_s - r.policy_wall_s,
    simulator_requests_per_wall_s=n / (r.wall_s - r.policy_wall_s),
    cold_wall_s=cold_wall_s, cold_planner_wall_s=cold_planner_wall_s, cold_requests_per_wall_s=n / cold_wall_s,
    load_avg_1min=os.getloadavg()[0],
    peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    slo_attainment=float(r.sla_met().mean()), gpu_hours=r.gpu_hours)))
"""

# The control table's traces at its default load model (independent tenants), conv as recorded, the
# long-prompt case at its loose SLA and the ServeGen day (--quick leaves the day out).
SPEED_TRACES = (
    ("azure2023_conv", "azure2023_conv.csv.gz", 1),
    ("azure2023_conv", "azure2023_conv.csv.gz", 8),
    ("azure2023_code", "azure2023_code.csv.gz", 8),
    ("mooncake", "mooncake_fast25_synthetic_trace.jsonl.gz", 2),
    ("mooncake loose-SLA", "mooncake_fast25_synthetic_trace.jsonl.gz", 2),
    ("servegen m-mid day 1 x0.02", "servegen_language_m-mid.tar.gz", 1),
)


def bench_speed(repeats: int, jitter_s: float = 30.0, *, quick: bool = False) -> dict:
    from sim.whatif.scenario import load_model

    rows = []
    for name, file, k in SPEED_TRACES:
        if quick and name.startswith("servegen"):
            continue
        ttft_ms, itl_ms = TRACE_SLA.get(f"{name} x{k}", (200.0, 10.0))
        runs = []
        for _ in range(repeats):
            code = SPEED_CHILD.format(root=str(ROOT), profile=str(PROFILE), trace=str(TRACES / file), k=k,
                                      jitter_s=jitter_s, ttft_ms=ttft_ms, itl_ms=itl_ms)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        best = max(runs, key=lambda r: r["requests_per_wall_s"])
        rows.append(dict(trace=name, load_multiplier=k, jitter_s=jitter_s if k != 1 else None,
                         load_model=(trace_load_model(name, jitter_s) if name.startswith("servegen")
                                     else load_model(k, jitter_s)),
                         sla=dict(ttft_ms=ttft_ms, itl_ms=itl_ms), runs=runs, best=best))
        print(f"speed {name} x{k}: {best['requests']:,} requests, {best['requests_per_wall_s']:,.0f} req/s "
              f"(first replay in a fresh process {best['cold_requests_per_wall_s']:,.0f}; simulator alone "
              f"{best['simulator_requests_per_wall_s']:,.0f} req/s, planner "
              f"{1000 * best['planner_wall_s'] / best['intervals']:.1f} ms/interval), peak RSS "
              f"{best['peak_rss_mb']:.0f} MB, load avg {best['load_avg_1min']:.1f}", flush=True)
    table = ["| trace | load | requests | requests / wall s, planner in the loop (best of %d) | first replay in a "
             "fresh process, req/s | req / CPU s | simulator alone, req/s | planner ms / interval | wall s | peak RSS MB | "
             "load avg |" % repeats,
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["best"]
        table.append(f"| {r['trace']} x{r['load_multiplier']} | {r['load_model']} | {b['requests']:,} | "
                     f"{b['requests_per_wall_s']:,.0f} | {b['cold_requests_per_wall_s']:,.0f} | "
                     f"{b['requests_per_cpu_s']:,.0f} | "
                     f"{b['simulator_requests_per_wall_s']:,.0f} | {1000 * b['planner_wall_s'] / b['intervals']:.1f} | "
                     f"{b['wall_s']:.2f} | {b['peak_rss_mb']:.0f} | {b['load_avg_1min']:.1f} |")
    return dict(
        what="replay speed, default planner in the loop (60 s interval), H200 Llama-8B profile; each run a fresh "
             "process replaying twice: requests_per_wall_s is the second replay, cold_requests_per_wall_s the "
             "first (it also pays the process's one-time costs: the thread-pool scan, any model library a fit "
             "imports lazily); requests_per_cpu_s is the "
             "second replay per CPU second of this process (less sensitive to other processes on the machine)",
        targets=dict(requests_per_wall_s=20_000, peak_rss_mb=500),
        machine=dict(python=platform.python_version(), cpus=_cpus()),
        rows=rows,
        markdown="\n".join(table),
    )


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


# ------------------------------------------------------------------ control quality


# A trace's SLA (TTFT ms, ITL ms) when not the table's 200 / 10: the long-prompt case kept out of tuning
# (issue 40), Mooncake's synthetic trace (prompts of 10-190k tokens) at a loose SLA.
TRACE_SLA = {"mooncake loose-SLA x2": (3000.0, 20.0)}

# planner+warm: the planner warmed (predictor.warmup_trace_path) with another draw of the same copies, the
# tenants' offsets drawn with this seed (plus --seed): a stand-in for the previous hour of the same service,
# which these one-hour traces do not have. --warmup rotated draws them from the trace rotated by half its
# length (workloads.traces.rotate_time: the same bursts at other minutes). Filled by _traces; label -> the trace.
WARMUP_SEED = 100
WARMUP_DRAWS: dict = {}
WARMUP_SOURCES = {
    "draw": "another draw of the same copies (seed {seed}), before the trace: the same bursts at the same minutes",
    "rotated": "another draw of the same copies (seed {seed}) of the trace rotated by half its length, before the "
               "trace: the same bursts at other minutes",
}


# planner+recurrence: the default planner with the recurrence hold on (decision.independent_stabilization_s).
RECURRENCE_HOLD_S = 360.0
# planner+flat-hold: while arrivals look independent, prefill sized on each interval's flat load (no burst
# sizing on top) and a scale-down held at the highest recommendation of 420 s; the p90 basis is taken only once
# two runs in a row read clumping (docs/control.md, "Flat sizing and a longer hold").
FLAT_HOLD_SETTINGS = {"sizing.independent_burst_basis": "off", "decision.independent_stabilization_s": 420,
                      "decision.independent_stabilization_rank": 1, "predictor.clumping_runs": 2,
                      "predictor.clumping_max_index": 1.8, "decision.scale_down_floor_s": None}
# planner+hpa: the default before flat-floor (docs/control.md, "A floor under the scale-down"): prefill sized
# for sub-interval bursts while arrivals look independent, HPA's 300 s hold alone, the p90 basis from one
# reading of a clumping index of 1.8.
HPA_WINDOW_SETTINGS = {"sizing.independent_burst_basis": None, "predictor.clumping_runs": 1,
                       "predictor.clumping_max_index": 1.8, "decision.scale_down_floor_s": None}
# planner+served: issue 40's correction fix: the interval's load divided by the replicas that served it
# (planner.latency.served: time-weighted ready replicas from the applied decisions), not by those the fleet has
# when the run reads it (correction.replicas, "current" by default).
SERVED_REPLICAS_SETTINGS = {"correction.replicas": "served"}
# A variant name's part -> the planner settings it sets (the policy and the row's record read the same table).
NAMED_SETTINGS = {"flat-hold": FLAT_HOLD_SETTINGS, "hpa": HPA_WINDOW_SETTINGS,
                  "served": SERVED_REPLICAS_SETTINGS}
# Planner variants whose row gets its own cheapest static fleet (reaching the variant's attainment).
VARIANTS_WITH_STATIC = ("planner+cold", "planner+warm", "planner+recurrence", "planner+warm+recurrence", "planner+running",
                        "planner+running+recurrence", "planner+flat-hold", "planner+warm+flat-hold",
                        "planner+running+flat-hold", "planner+hpa", "planner+warm+hpa", "planner+running+hpa",
                        "planner+served", "planner+running+served")


def variant_policy(cfg, profile, label: str, folder: Path, name: str):
    """planner+warm / +recurrence / +warm+recurrence / +flat-hold / +hpa: the default planner warmed from
    WARMUP_DRAWS[label] (written to folder as Mooncake JSONL) and/or with the recurrence hold, the flat-hold
    settings (FLAT_HOLD_SETTINGS) or the previous default's (HPA_WINDOW_SETTINGS). None: no warm-up draw for
    label."""
    from sim.policies import PlannerPolicy
    from workloads.traces import write_mooncake_jsonl
    from sim.whatif.scenario import with_settings

    parts = set(name.split("+")[1:])
    for part in parts & NAMED_SETTINGS.keys():
        cfg = with_settings(cfg, NAMED_SETTINGS[part])
    if "recurrence" in parts:
        cfg = with_settings(cfg, {"decision.independent_stabilization_s": RECURRENCE_HOLD_S})
    if "warm" in parts:
        if label not in WARMUP_DRAWS:
            return None
        path = write_mooncake_jsonl(WARMUP_DRAWS[label](), folder / f"warmup-{label.replace(' ', '_')}.jsonl")
        cfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"warmup_trace_path": str(path)})})
    return PlannerPolicy(cfg, profile, name=name)


def running_start(label: str, trace, scenario):
    """planner+running: the warm-up stand-in replayed first through the same fleet and planner (not scored),
    then the trace: a planner started against a running fleet, its history and held capacity."""
    from sim.replay import after_lead_in

    return after_lead_in(WARMUP_DRAWS[label](), trace, scenario)


def warm_start(label: str, trace, scenario):
    """The default start: the stand-in hour through the fleet and the policy (not scored), then the planner
    restarted where the trace begins, its first run reading that hour as its Prometheus history."""
    import dataclasses

    run_trace, run_scenario = running_start(label, trace, scenario)
    return run_trace, dataclasses.replace(run_scenario, lead_in_restart=True)


def _traces(quick: bool, jitter_s: float = 30.0, *, seed: int = 0, warmup: str = "draw"):
    from workloads.servegen import load_servegen, synthesize_servegen
    from workloads.traces import load_trace, multiply_load, rotate_time

    def copies(name, k, seed, rotated=False):
        def make():
            trace = load_trace(TRACES / name)
            if rotated:
                trace = rotate_time(trace, (int(trace.duration_s // 60) + 1) * 30.0)
            return multiply_load(trace, k, seed=seed, jitter_s=jitter_s)
        return make

    for label, name, k in (("azure2023_code x8", "azure2023_code.csv.gz", 8),
                           ("azure2023_conv x8", "azure2023_conv.csv.gz", 8),
                           ("mooncake x2", "mooncake_fast25_synthetic_trace.jsonl.gz", 2),
                           ("mooncake loose-SLA x2", "mooncake_fast25_synthetic_trace.jsonl.gz", 2)):
        WARMUP_DRAWS[label] = copies(name, k, WARMUP_SEED + seed, rotated=warmup == "rotated")
        yield label, copies(name, k, seed)
    if not quick:
        def servegen(start_s, duration_s):
            def make():
                data = load_servegen(TRACES / "servegen_language_m-mid.tar.gz")
                return synthesize_servegen(data, start_s=start_s, duration_s=duration_s, seed=0, rate_scale=0.02)
            return make

        # The hour before the day, from the same archive: a real one, not a stand-in.
        WARMUP_DRAWS["servegen m-mid day 1 x0.02"] = servegen(86_400 - 3_600, 3_600)
        yield "servegen m-mid day 1 x0.02", servegen(86_400, 86_400)


def _row(label: str, result, *, extra: dict | None = None) -> dict:
    from sim.whatif.report import summarize

    s = summarize(result)
    row = dict(
        policy=label,
        slo_attainment=s["slo_attainment"],
        ttft_attainment=s["ttft_attainment"],
        itl_attainment=s["itl_attainment"],
        ttft_p99_ms=s["ttft_ms"]["p99"],
        itl_p99_ms=s["itl_ms"]["p99"],
        gpu_hours=s["gpu_hours"],
        scale_events=s["scale_events"],
        max_prefill=s["max_replicas"]["prefill"],
        max_decode=s["max_replicas"]["decode"],
        wall_s=s["wall_s"],
    )
    row.update(extra or {})
    row.setdefault("start", start_of(label))  # every row names its start
    return row


def measured_shape(trace) -> dict[str, float]:
    """Coefficients of variation of prompt length and of decode context (isl + osl/2) over the trace."""
    import numpy as np

    isl = np.asarray(trace.isl_tokens, dtype=float)
    ctx = isl + np.asarray(trace.osl_tokens, dtype=float) / 2.0
    return {"isl_cv": float(isl.std() / isl.mean()), "decode_context_cv": float(ctx.std() / ctx.mean())}


def shape_config(cfg, trace):
    """The planner configuration told the trace's exact length shape (planner+shape), not measuring it."""
    shape = {k: round(v, 2) for k, v in measured_shape(trace).items()}
    sizing = cfg.sizing.model_copy(update={**shape, "length_cv": "configured"})
    return cfg.model_copy(update={"sizing": sizing}), shape


def diagnose(result, profile, *, interval_s: float) -> dict:
    """Where a replay lost attainment: unreachable prompts, misses by pool, concentration in time."""
    import numpy as np

    req = result.requests
    slo = result.scenario.slo
    ttft_ok = req.ttft_ms <= slo.ttft_ms
    itl = req.itl_ms
    itl_ok = np.isnan(itl) | (itl <= slo.itl_ms)
    lo, hi = profile.prefill.isl_range_tokens
    isl = np.asarray(req.isl_tokens, dtype=float)
    alone_ms = profile.prefill.ttft_ms_many(np.clip(isl, lo, hi)) * np.where(isl > hi, isl / hi, 1.0)
    unreachable = alone_ms > slo.ttft_ms
    idx = (req.arrival_s // interval_s).astype(np.int64)
    n_int = int(idx.max()) + 1

    def top10(miss):
        per = np.bincount(idx, weights=miss.astype(float), minlength=n_int)
        total = per.sum()
        return float(np.sort(per)[::-1][:10].sum() / total) if total else 0.0

    n = len(req.arrival_s)
    return dict(
        ttft_unreachable_frac=float(unreachable.mean()),
        ttft_miss_reachable_frac=float((~ttft_ok & ~unreachable).sum() / n),
        itl_miss_frac=float((~itl_ok).sum() / n),
        ttft_misses_in_worst_10_intervals_frac=top10(~ttft_ok & ~unreachable),
        itl_misses_in_worst_10_intervals_frac=top10(~itl_ok),
    )


def static_within(trace, tables, scenario, plan, gpu_hours: float, gpu_hours_per_gpu: float, *, max_runs: int = 3):
    """The static P x D fleet with the highest attainment whose GPU-hours stay within gpu_hours.

    Fleets of the most GPUs the budget allows (gpu_hours / gpu_hours_per_gpu, the hours one GPU runs in a
    static replay), ranked by the attainment the oracle's capacity sweeps estimate (as sim.oracle.best_static
    ranks them); the max_runs best replayed. Returns (its replay or None, every (prefill, decode, attainment,
    GPU-hours) tried); None when the budget buys fewer than two GPUs.
    """
    from sim.policies import StaticPolicy
    from sim.replay import replay

    gpus = int(gpu_hours / gpu_hours_per_gpu + 1e-9)
    if gpus < 2:
        return None, []
    ps, ds = plan.prefill_share_by_k, plan.decode_share_by_k
    cands = sorted(((-ps[min(p, len(ps)) - 1] * ds[min(gpus - p, len(ds)) - 1], p, gpus - p)
                    for p in range(1, gpus)))[:max_runs]
    best, tried = None, []
    for _, p, d in cands:
        r = replay(trace, tables, StaticPolicy(p, d), scenario=scenario)
        tried.append((p, d, float(r.sla_met().mean()), r.gpu_hours))
        if r.gpu_hours <= gpu_hours + 1e-9 and (best is None or tried[-1][2] > float(best.sla_met().mean())):
            best = r
    return best, tried


def static_comparison(row: dict, at_attainment: dict | None, at_gpu_hours: dict | None) -> dict:
    """A planner row against the static fleets (issue 40 item 3): the cheapest reaching its attainment, the best
    within its GPU-hours, the GPU-hours saved against the first, and which static fleet (if any) is better on
    both axes (at least as good on each, strictly better on one)."""
    def fleet(r):
        return None if r is None else dict(fleet=r["policy"].split("(")[-1].rstrip(")"),
                                           slo_attainment=r["slo_attainment"], gpu_hours=r["gpu_hours"])

    att, gph = row["slo_attainment"], row["gpu_hours"]
    dominated = None
    for r in (at_attainment, at_gpu_hours):
        if r is not None and r["slo_attainment"] >= att and r["gpu_hours"] <= gph and (
                r["slo_attainment"] > att or r["gpu_hours"] < gph):
            dominated = fleet(r)["fleet"]
            break
    return dict(static_at_attainment=fleet(at_attainment), static_at_gpu_hours=fleet(at_gpu_hours),
                gpu_hours_saved_vs_static_frac=None if at_attainment is None
                else 1.0 - gph / at_attainment["gpu_hours"],
                dominated_by_static=dominated)


def trace_load_model(label: str, jitter_s: float) -> str:
    """The load model of a control trace, in words: K copies for the Azure and Mooncake traces (label "... xK"),
    the ServeGen day as synthesized (its clients' rates scaled, no copies)."""
    from sim.whatif.scenario import load_model

    if label.startswith("servegen"):
        return "the synthesized day (every client's rate x0.02), no copies"
    return load_model(float(label.rsplit(" x", 1)[1]), jitter_s)


def start_of(policy: str) -> str:
    """How a policy's row started: running (a lead-in through the fleet and the planner, which goes on),
    warm-up trace (a fresh fleet, the predictor warmed), cold (nothing before the trace), n/a for fleets fixed
    in advance (static, oracle), else warm (the default: the lead-in, then the planner restarted, reading it as
    its Prometheus history)."""
    parts = policy.split("+")
    if policy.startswith(("static", "oracle", "best static", "hindsight")):
        return "n/a"
    return ("running" if "running" in parts else "warm-up trace" if "warm" in parts else "cold" if "cold" in parts
            else "warm")


def bench_control(
    quick: bool, policies: list[str], only: list[str] | None = None, *, oracle_rounds: int = 3, static_runs: int = 8,
    with_oracle: bool = True, jitter_s: float = 30.0, seed: int = 0, warmup: str = "draw",
) -> dict:
    from connectors.profiles import load_profile_dir
    from sim.lookup import ProfileTables
    from sim.oracle import HINDSIGHT_WINDOWS, best_static, oracle_plan, reactive_reference
    from sim.whatif.scenario import load_model
    from sim.policies import PlannerPolicy, default_planner_config, make_policy
    from sim.replay import ReplaySettings, replay
    from planner.config import SloTarget

    profile = load_profile_dir(PROFILE)
    tables = ProfileTables(profile)
    cfg = default_planner_config(profile_dir=str(PROFILE), ttft_ms=200, itl_ms=10, interval_s=60)  # the record's
    out = []
    load_avg = [os.getloadavg()[0]]
    for label, make in _traces(quick, jitter_s, seed=seed, warmup=warmup):
        if only and not any(label.startswith(o) for o in only):
            continue
        # The trace's SLA (TRACE_SLA; TTFT 200 ms / ITL 10 ms unless named there), for the planner and the replay.
        ttft_ms, itl_ms = TRACE_SLA.get(label, (200.0, 10.0))
        cfg = default_planner_config(profile_dir=str(PROFILE), ttft_ms=ttft_ms, itl_ms=itl_ms, interval_s=60)
        scenario = ReplaySettings(slo=SloTarget(ttft_ms=ttft_ms, itl_ms=itl_ms))
        t0 = time.perf_counter()
        trace = make()
        print(f"\n{label}: {len(trace):,} requests over {trace.duration_s / 3600:.2f} h", flush=True)
        rows = []
        planner_att = None
        hindsight_frontier = []
        for name in policies:
            if name in ("planner:arima", "dynamo-peer") and len(trace) > 500_000:
                continue  # ARIMA fits take ~1 s per interval: a day of intervals is out of this budget
            extra = {}
            if name in VARIANTS_WITH_STATIC:
                with tempfile.TemporaryDirectory() as folder:  # the policy reads the file as it is built
                    policy = variant_policy(cfg, profile, label, Path(folder), name)
                if policy is None:
                    continue
                if "warm" in name:
                    extra["warmup"] = WARMUP_SOURCES[warmup].format(seed=WARMUP_SEED + seed)
                if "recurrence" in name:
                    extra["independent_stabilization_s"] = RECURRENCE_HOLD_S
                for part in set(name.split("+")) & NAMED_SETTINGS.keys():
                    extra["planner_settings"] = NAMED_SETTINGS[part]
            elif name == "planner+shape":
                shape_cfg, shape = shape_config(cfg, trace)
                policy = PlannerPolicy(shape_cfg, profile, name=name)
                extra["sizing"] = shape
            else:
                policy = make_policy(name, cfg=cfg, profile=profile)
            start = extra["start"] = start_of(name)
            if start in ("running", "warm") and label in WARMUP_DRAWS:
                run_trace, run_scenario = (running_start if start == "running" else warm_start)(label, trace, scenario)
                source = ("the hour before the day" if label.startswith("servegen")
                          else WARMUP_SOURCES[warmup].format(seed=WARMUP_SEED + seed))
                extra["lead_in"] = source + (
                    f", replayed through the fleet and the planner for {run_scenario.lead_in_s:g} s, not scored"
                    + (", then the planner restarted" if start == "warm" else ""))
                r = replay(run_trace, tables, policy, scenario=run_scenario)
            elif start == "running":
                continue
            else:
                extra["start"] = "cold" if start == "warm" else start  # no hour before this trace
                r = replay(trace, tables, policy, scenario=scenario)
            if name.startswith("planner"):
                extra["diagnostics"] = diagnose(r, profile, interval_s=scenario.interval_s)
            rows.append(_row(name, r, extra=extra))
            if name == "planner":
                planner_att = rows[-1]["slo_attainment"]
            print(f"  {name:22s} {100 * rows[-1]['slo_attainment']:6.2f}%  {rows[-1]['gpu_hours']:7.2f} GPU-h  "
                  f"({r.wall_s:.1f} s)", flush=True)
        if not with_oracle:
            out.append(dict(trace=label, requests=len(trace), duration_h=trace.duration_s / 3600, rows=rows,
                            bench_wall_s=time.perf_counter() - t0))
            continue
        plan = oracle_plan(trace, tables, scenario=scenario, max_replicas=16, refine_rounds=oracle_rounds,
                           progress=lambda m: print(f"    {m}", flush=True))
        rows.append(_row("oracle", plan.result))
        print(f"  {'oracle':22s} {100 * rows[-1]['slo_attainment']:6.2f}%  {rows[-1]['gpu_hours']:7.2f} GPU-h", flush=True)
        statics: dict[float, tuple] = {}  # attainment -> best_static's answer (variants often tie the planner)

        def static_for(att: float) -> tuple:
            if att not in statics:
                statics[att] = best_static(trace, tables, scenario, plan, att, max_runs=static_runs)
            return statics[att]

        for variant in [row for row in rows if row["policy"] in VARIANTS_WITH_STATIC]:
            # The fixed fleet a planner variant has to beat: the cheapest reaching its own attainment.
            att = variant["slo_attainment"]
            static, tried = static_for(att)
            what = f"best static for {variant['policy']}"
            rows.append(_row(f"{what} ({static.policy.split(':')[1]})", static, extra={"tried": tried}) if static
                        else dict(policy=what, note=f"none of {tried} reached {att:.4f}"))
            print(f"  {rows[-1]['policy']:22s} {rows[-1].get('gpu_hours', float('nan')):7.2f} GPU-h", flush=True)
        if planner_att is not None:
            static, tried = static_for(planner_att)
            if static is not None:
                rows.append(_row(f"best static ({static.policy.split(':')[1]})", static, extra={"tried": tried}))
                print(f"  {rows[-1]['policy']:22s} {100 * rows[-1]['slo_attainment']:6.2f}%  "
                      f"{rows[-1]['gpu_hours']:7.2f} GPU-h", flush=True)
            else:
                rows.append(dict(policy="best static", note=f"none of {tried} reached {planner_att:.4f}"))
            ref, ref_tried = reactive_reference(trace, tables, scenario, plan, planner_att)
            # The whole frontier: the windows past the one reaching the planner too.
            rest = HINDSIGHT_WINDOWS[len(ref_tried):]
            hindsight_frontier = ref_tried + (reactive_reference(trace, tables, scenario, plan, 2.0, windows=rest)[1]
                                              if rest else [])
            if ref is not None:
                rows.append(_row(f"hindsight-reactive ({ref.policy.split(':')[1]})", ref, extra={"tried": ref_tried}))
                print(f"  {rows[-1]['policy']:22s} {100 * rows[-1]['slo_attainment']:6.2f}%  "
                      f"{rows[-1]['gpu_hours']:7.2f} GPU-h", flush=True)
            else:
                best = max(ref_tried, key=lambda x: x[1])
                rows.append(dict(policy="hindsight-reactive", note=f"no hold of {ref_tried[0][0]}-{ref_tried[-1][0]} "
                                 f"intervals reached {100 * planner_att:.2f}% (best: {best[0]}, {100 * best[1]:.2f}% @ "
                                 f"{best[2]:.2f})"))
        # Every planner row against the static fleets: the cheapest reaching its attainment (found above for the
        # planner and its variants) and the best within its GPU-hours.
        by_policy = {r["policy"]: r for r in rows}
        static_rows = [r for r in rows if r["policy"].startswith(("best static (", "best static for "))
                       and "gpu_hours" in r]
        per_gpu = None
        if static_rows:
            fleet_size = static_rows[0]["policy"].split("(")[-1].rstrip(")").split("x")
            per_gpu = static_rows[0]["gpu_hours"] / (int(fleet_size[0]) + int(fleet_size[1]))
        budgets: dict[float, tuple] = {}
        for name in [r["policy"] for r in rows if r["policy"] == "planner" or r["policy"] in VARIANTS_WITH_STATIC]:
            row = by_policy[name]
            prefix = "best static (" if name == "planner" else f"best static for {name} ("
            at_att = next((r for r in static_rows if r["policy"].startswith(prefix)), None)
            at_gph = None
            if per_gpu is not None:
                if row["gpu_hours"] not in budgets:
                    budgets[row["gpu_hours"]] = static_within(trace, tables, scenario, plan, row["gpu_hours"],
                                                              per_gpu)
                r, tried = budgets[row["gpu_hours"]]
                if r is not None:
                    at_gph = _row(f"best static within {name}'s GPU-hours ({r.policy.split(':')[1]})", r,
                                  extra={"tried": tried})
            row.update(static_comparison(row, at_att, at_gph), load_model=trace_load_model(label, jitter_s))
            print(f"  {name:22s} vs static: {row['static_at_attainment'] and row['static_at_attainment']['fleet']} "
                  f"at its attainment, {row['static_at_gpu_hours'] and row['static_at_gpu_hours']['fleet']} within "
                  f"its GPU-hours, dominated by {row['dominated_by_static']}", flush=True)
        oracle_gph = plan.result.gpu_hours
        oracle_att = float(plan.result.sla_met().mean())
        for row in rows:
            if "gpu_hours" in row:
                row["gpu_hours_vs_oracle"] = row["gpu_hours"] / oracle_gph
        out.append(dict(
            trace=label,
            requests=len(trace),
            duration_h=trace.duration_s / 3600,
            measured_shape=measured_shape(trace),
            oracle_attainment=oracle_att,
            oracle_need_max={"prefill": max(plan.need_prefill), "decode": max(plan.need_decode)},
            hindsight_frontier=[dict(window=w, slo_attainment=att, gpu_hours=g) for w, att, g in hindsight_frontier],
            rows=rows,
            bench_wall_s=time.perf_counter() - t0,
        ))
    return dict(
        what="control quality: policies x traces",
        profile="H200 Llama-3.1-8B-FP8 TP1 prefill / TP1 decode (Dynamo profiler data)",
        sla={"ttft_ms": 200, "itl_ms": 10, "attainment": "share of requests meeting both (per-request TTFT, mean ITL)",
             "by_trace": {label: {"ttft_ms": t, "itl_ms": i} for label, (t, i) in TRACE_SLA.items()}},
        planner_defaults={k: getattr(cfg, k).model_dump() for k in ("sizing", "predictor", "decision", "correction")},
        load_avg_1min_start_end=load_avg + [os.getloadavg()[0]],
        startup_s=60,
        interval_s=60,
        load_multiplier=f"K superposed copies, each request shifted by U(-{jitter_s:g}, +{jitter_s:g}) s, seed {seed}: "
                        + load_model(8, jitter_s).split(": ")[-1],
        jitter_s=jitter_s,
        seed=seed,
        warmup=WARMUP_SOURCES[warmup].format(seed=WARMUP_SEED + seed),
        servegen="m-mid, day 1 (start 86,400 s), 24 h, every client's rate x0.02, seed 0",
        oracle="sim.oracle: per-interval hindsight capacity sweeps, startup-aware schedule, verified by replay; "
               "goal 99% (99.5% per pool) or best achievable - 0.5 points",
        hindsight_reactive="sim.oracle.reactive_reference: the oracle's per-interval needs, known once each interval "
                           "has finished; each control step holds the largest of the last w; the shortest w (of "
                           f"{', '.join(map(str, HINDSIGHT_WINDOWS))}) reaching the planner's attainment",
        traces=out,
        markdown=_control_table(out),
        static_markdown=static_table(out),
    )


def _control_table(traces: list[dict]) -> str:
    lines = ["| trace | policy | SLA attainment | TTFT / ITL met | TTFT p99 ms | ITL p99 ms | GPU-hours | vs oracle "
             "| scale events |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        for r in t["rows"]:
            if "gpu_hours_vs_oracle" not in r:
                r = dict(r, gpu_hours_vs_oracle=float("nan"))
            if "gpu_hours" not in r:
                lines.append(f"| {t['trace']} | {r['policy']} | {r.get('note', '')} | | | | | | |")
                continue
            lines.append(
                f"| {t['trace']} | {r['policy']} | {100 * r['slo_attainment']:.2f}% | "
                f"{100 * r['ttft_attainment']:.2f}% / {100 * r['itl_attainment']:.2f}% | {r['ttft_p99_ms']:.0f} | "
                f"{r['itl_p99_ms']:.1f} | {r['gpu_hours']:.2f} | {r['gpu_hours_vs_oracle']:.2f}x | {r['scale_events']} |"
            )
    return "\n".join(lines)


def static_table(traces: list[dict]) -> str:
    """Each planner row against the static fleets: the cheapest reaching its attainment, the best within its
    GPU-hours, the GPU-hours saved against the first, and whether a static fleet beats it on both axes."""
    lines = ["| trace | load model | start | policy | SLA attainment | GPU-hours | cheapest static reaching it "
             "| best static within its GPU-hours | GPU-hours saved vs that static | a static fleet better on both |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    planner_rows = [(t["trace"], r) for t in traces for r in t["rows"] if "static_at_attainment" in r]
    for label, r in planner_rows:
        a, g = r["static_at_attainment"], r["static_at_gpu_hours"]
        saved = r["gpu_hours_saved_vs_static_frac"]
        cells = [label, r["load_model"], r["start"], r["policy"], f"{100 * r['slo_attainment']:.2f}%",
                 f"{r['gpu_hours']:.2f}",
                 f"{a['fleet']}: {a['gpu_hours']:.2f} GPU-h ({100 * a['slo_attainment']:.2f}%)" if a else "none found",
                 f"{g['fleet']}: {100 * g['slo_attainment']:.2f}% ({g['gpu_hours']:.2f} GPU-h)" if g else "none",
                 "" if saved is None else f"{100 * saved:.1f}%",
                 f"yes: {r['dominated_by_static']}" if r["dominated_by_static"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_checks(trace: dict, row: dict) -> dict:
    """Issue 14's three targets for one planner row: attainment >= min(99%, oracle - 0.5 points); GPU-hours
    <= 1.2x the oracle's; below the cheapest static fleet reaching the row's attainment (its own row)."""
    static_prefix = "best static (" if row["policy"] == "planner" else f"best static for {row['policy']} ("
    static = next((r for r in trace["rows"] if r["policy"].startswith(static_prefix) and "gpu_hours" in r), None)
    need = min(0.99, trace["oracle_attainment"] - 0.005)
    return {"need": need, "attainment": row["slo_attainment"] >= need, "vs_oracle": row["gpu_hours_vs_oracle"] <= 1.2,
            "below_static": static is None or row["gpu_hours"] < static["gpu_hours"],
            "static": None if static is None else static["policy"], "static_gpu_hours": static and static["gpu_hours"]}


def seeds_summary(runs: list[dict]) -> str:
    """One line per trace x planner policy x seed: attainment, GPU-hours, vs oracle, and which targets hold."""
    lines = ["| trace | policy | seed | SLA attainment (target) | GPU-hours | vs oracle | cheapest static reaching it "
             "| targets met |", "|---|---|---|---|---|---|---|---|"]
    cells = []
    for run in runs:
        for t in run["traces"]:
            for r in t["rows"]:
                if r["policy"].startswith("planner") and "gpu_hours" in r:
                    cells.append((t["trace"], r["policy"], run["seed"], t, r))
    for label, policy, seed, t, r in sorted(cells, key=lambda c: (c[0], c[1], c[2])):
        ok = target_checks(t, r)
        met = " ".join(k for k in ("attainment", "vs_oracle", "below_static") if ok[k])
        static = f"{ok['static']}: {ok['static_gpu_hours']:.2f}" if ok["static"] else "none reached it"
        lines.append(f"| {label} | {policy} | {seed} | {100 * r['slo_attainment']:.2f}% ({100 * ok['need']:.2f}%) | "
                     f"{r['gpu_hours']:.2f} | {r['gpu_hours_vs_oracle']:.3f}x | {static} | {met or 'none'} |")
    return "\n".join(lines)


# Each variant changes the default planner in one respect (sizing / predictor / decision fields).
ABLATION = {
    "default": {},
    "- lead time (next interval's p90)": {"sizing": {"replica_startup_s": 0.0}},
    "- prompt-length spread (one length)": {"sizing": {"isl_cv": 0.0}},
    "- ITL quantile (mean ITL, 15% headroom)": {"sizing": {"itl_quantile": 0.51, "decode_headroom_frac": 0.15}},
    "- 99% TTFT share (p95)": {"sizing": {"ttft_quantile": 0.95}},
    "length CVs 2": {"sizing": {"isl_cv": 2.0, "decode_context_cv": 2.0}},
    "arrival CV 1.25": {"sizing": {"prefill_arrival_cv": 1.25}},
    "stabilization 900 s": {"decision": {"scale_down_stabilization_s": 900.0}},
    "size on the mean": {"predictor": {"size_on": "mean"}},
    "- burst sizing (flat arrivals within an interval)": {"sizing": {"burst_basis": "off"}},
    "- burst-aware correction": {"correction": {"burst_aware": False}},
    "- both burst changes (the previous default)": {"sizing": {"burst_basis": "off"},
                                                     "correction": {"burst_aware": False}},
    "burst ratio x mean forecast": {"sizing": {"burst_basis": "mean"}},
    "burst ratio x upper forecast": {"sizing": {"burst_basis": "upper"}},
    "burst lookback 5 intervals": {"predictor": {"burst_lookback_intervals": 5}},
    "- scale-down floor (HPA's window alone)": {"decision": {"scale_down_floor_s": None}},
    "- flat sizing for independent arrivals": {"sizing": {"independent_burst_basis": None}},
    "- two clumping readings at 1.7 (one at 1.8)": {"predictor": {"clumping_runs": 1, "clumping_max_index": 1.8}},
    "+ served replicas in the correction (issue 40)": {"correction": {"replicas": "served"}},
}


def _by_section(settings: dict) -> dict:
    """Dotted planner settings ("decision.scale_down_floor_s": None) as an ABLATION change, by section."""
    out: dict[str, dict] = {}
    for key, value in settings.items():
        section, field = key.split(".")
        out.setdefault(section, {})[field] = value
    return out


ABLATION["- all three (the default before flat-floor)"] = _by_section(HPA_WINDOW_SETTINGS)


def bench_ablation(quick: bool, only: list[str] | None, variants: list[str] | None = None) -> dict:
    """The default planner with one change at a time, on every trace: what each part of the design buys."""
    from connectors.profiles import load_profile_dir
    from sim.lookup import ProfileTables
    from sim.policies import PlannerPolicy, default_planner_config
    from sim.replay import ReplaySettings, replay
    from planner.config import SloTarget

    profile = load_profile_dir(PROFILE)
    tables = ProfileTables(profile)
    base = default_planner_config(profile_dir=str(PROFILE), ttft_ms=200, itl_ms=10, interval_s=60)
    rows = []
    load_avg = [os.getloadavg()[0]]
    for label, make in _traces(quick):
        if only and not any(label.startswith(o) for o in only):
            continue
        trace = make()
        print(f"\n{label}: {len(trace):,} requests", flush=True)
        ttft_ms, itl_ms = TRACE_SLA.get(label, (200.0, 10.0))
        slo = SloTarget(ttft_ms=ttft_ms, itl_ms=itl_ms)
        for name, change in ABLATION.items():
            if variants and name not in variants:
                continue
            cfg = base.model_copy(update={"slo": slo} | {
                section: getattr(base, section).model_copy(update=fields) for section, fields in change.items()
            })
            r = replay(trace, tables, PlannerPolicy(cfg, profile, name=name), scenario=ReplaySettings(slo=slo))
            row = _row(name, r, extra={"trace": label, "change": change, "start": "cold",
                                       "gpu_hours_prefill": r.gpu_seconds["prefill"] / 3600,
                                       "gpu_hours_decode": r.gpu_seconds["decode"] / 3600})
            rows.append(row)
            print(f"  {name:40s} {100 * row['slo_attainment']:6.2f}%  {row['gpu_hours']:7.2f} GPU-h", flush=True)
    lines = ["| trace | planner variant | SLA attainment | TTFT / ITL met | GPU-hours (prefill + decode) |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trace']} | {r['policy']} | {100 * r['slo_attainment']:.2f}% | "
                     f"{100 * r['ttft_attainment']:.2f}% / {100 * r['itl_attainment']:.2f}% | "
                     f"{r['gpu_hours']:.2f} ({r['gpu_hours_prefill']:.2f} + {r['gpu_hours_decode']:.2f}) |")
    load_avg.append(os.getloadavg()[0])
    return dict(what="planner ablation: the default configuration with one change at a time",
                planner_defaults={k: getattr(base, k).model_dump()
                                  for k in ("sizing", "predictor", "decision", "correction")},
                load_avg_1min_start_end=load_avg, rows=rows, markdown="\n".join(lines))


def merge(parts: list[str]) -> dict:
    """Combine control-quality result files (same traces, same seeds) into one table.

    Rows of a trace from every part are put together, a later part's row replacing an
    earlier one of the same policy in its place; the oracle gives every row its GPU-hours ratio.
    """
    merged: dict[str, dict] = {}
    meta = None
    for name in parts:
        doc = json.loads((RESULTS / name).read_text())
        meta = meta or {k: v for k, v in doc.items() if k not in ("traces", "markdown")}
        for t in doc["traces"]:
            slot = merged.setdefault(t["trace"], {k: v for k, v in t.items() if k != "rows"} | {"rows": []})
            if "oracle_attainment" in t:
                slot.update({k: v for k, v in t.items() if k != "rows"})
            # A later part's row replaces an earlier one in its place; new policies go last.
            new = {r.get("policy"): r for r in t["rows"]}
            kept = [new.pop(r.get("policy"), r) for r in slot["rows"]]
            slot["rows"] = kept + list(new.values())
    for t in merged.values():
        oracle = next((r for r in t["rows"] if r.get("policy") == "oracle"), None)
        for r in t["rows"]:
            if oracle is not None and "gpu_hours" in r:
                r["gpu_hours_vs_oracle"] = r["gpu_hours"] / oracle["gpu_hours"]
    traces = list(merged.values())
    return dict(meta or {}, parts=parts, traces=traces, markdown=_control_table(traces))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the ServeGen day")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--control-only", action="store_true")
    ap.add_argument("--jitter-s", type=float, default=30.0,
                    help="load multiplication: shift each copied request by up to +- this, s (30: independent "
                         "tenants, the default; 1: synchronised copies, the stress case)")
    ap.add_argument("--seed", type=int, default=0,
                    help="control: the copies' offsets are drawn with this seed (the warm-up's with 100 + it)")
    ap.add_argument("--seeds", default=None,
                    help="control: comma list of seeds, one run each, written together with a per-seed summary "
                         "of issue 14's targets (`runs`, `summary`)")
    ap.add_argument("--warmup", choices=sorted(WARMUP_SOURCES), default="draw",
                    help="control, planner+warm: the warm-up stand-in (draw: the same minutes; rotated: the trace "
                         "rotated by half its length)")
    ap.add_argument("--traces", default=None, help="comma list of trace label prefixes to run (default: all)")
    ap.add_argument("--out", default=None, help="control JSON file name in benchmarks/results")
    ap.add_argument("--merge", default=None, help="comma list of control JSON files to combine into sim_control.json")
    ap.add_argument("--no-oracle", action="store_true", help="policies only (no oracle, no best static)")
    ap.add_argument("--oracle-rounds", type=int, default=3, help="oracle verify-and-repair rounds")
    ap.add_argument("--static-runs", type=int, default=8, help="most static fleets tried for the best static")
    ap.add_argument("--repeats", type=int, default=2, help="speed runs per configuration (best is reported)")
    ap.add_argument("--ablation", action="store_true",
                    help="the default planner with one change at a time (writes sim_control_ablation.json)")
    ap.add_argument("--variants", default=None, help="ablation: semicolon list of variant names (default: all)")
    ap.add_argument("--policies", default="planner,planner+shape,planner:constant,planner:kalman,"
                    "planner:seasonal_naive,planner:ets,planner:arima,dynamo,saturation")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.ablation:
        doc = bench_ablation(args.quick, args.traces.split(",") if args.traces else None,
                             args.variants.split(";") if args.variants else None)
        (RESULTS / (args.out or "sim_control_ablation.json")).write_text(json.dumps(doc, indent=2) + "\n")
        print(doc["markdown"])
        return 0
    if args.merge:
        doc = merge(args.merge.split(","))
        (RESULTS / "sim_control.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(doc["markdown"])
        return 0
    if not args.control_only:
        speed = bench_speed(args.repeats, args.jitter_s, quick=args.quick)
        (RESULTS / "sim_speed.json").write_text(json.dumps(speed, indent=2) + "\n")
        print(speed["markdown"])
    if not args.speed_only:
        runs = [bench_control(
            args.quick, args.policies.split(","), args.traces.split(",") if args.traces else None,
            oracle_rounds=args.oracle_rounds, static_runs=args.static_runs, with_oracle=not args.no_oracle,
            jitter_s=args.jitter_s, seed=seed, warmup=args.warmup,
        ) for seed in ([int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed])]
        control = runs[0] if not args.seeds else dict(
            what="control quality over seeds of the load model", jitter_s=args.jitter_s, warmup=runs[0]["warmup"],
            seeds=[r["seed"] for r in runs], runs=runs, summary=seeds_summary(runs))
        name = args.out or ("sim_control_quick.json" if args.quick else "sim_control.json")
        (RESULTS / name).write_text(json.dumps(control, indent=2) + "\n")
        print(control.get("summary") or control["markdown"])
        if "static_markdown" in control:
            print(control["static_markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
