"""Latency predictor quality and training time: the retrain core on simulator samples from real traces.

For each scenario the simulated prefill/decode fleet (measured Dynamo H200
Llama-3.1-8B profile, planner policy in the loop, least-loaded routing)
replays a real trace; every finished request's lifecycle calls go through a
real in-process routing service (`sim.samples.record_samples`), whose registry
computes the features and whose sample store records the samples, exactly as
over HTTP. The calls follow the simulated fleet, which picks a decode worker
when prefill returns, as Dynamo's frontend does: `dispatched` names the prefill
endpoint, `prefill_done` the decode one (its TPOT features are taken then). The
same simulated requests are also recorded with both endpoints named at dispatch
(a router picking both at once, as llm-d's does, and this benchmark before
prefill_done) and trained as a variant. The newest `--max-samples` samples (the store's default capacity)
then go through the retrain core as the flow runs it: drop bad samples,
time-ordered split (70% train, 10% calibration, newest 20% held out), fit,
export to the safe format, and score the exported document on the held-out
samples, next to the router's profile estimate (same H200 profile). The same
samples are also trained on feature set 1 (the features before the
prefill-progress fields) and with the other p90 calibrations (one global
shift, per load bucket for both targets), so what each change brings is
measured on identical data.

Scenarios (copies of a trace are independent tenants: shifted by up to
+-30 s, the what-if default): Azure LLM conversation trace 2023 x4 (58 min) and x8 (first
30 min), Mooncake FAST'25 x4 (17 min; 3-s ticks jittered), and a loaded
fleet: Azure x5 (first 30 min) on a static 1 prefill + 2 decode fleet, whose
queues build and drain with the trace's bursts.
Late batch-mates: a request queued on a prefill worker joins the next batch with
whatever arrives before that batch starts, and its TTFT holds their prefill work,
which no prediction made at its dispatch can know. From the simulator's own record
(batch-mates share a prefill worker and a prefill end) each TTFT stratum reports
the share of held-out requests whose batch took later arrivals, and the MAPE of a
prediction that knows everything at dispatch but those arrivals (each outcome
exactly, less the prefill time the later arrivals added): the floor of any
dispatch-time prediction while fewer than half the requests get such batch-mates.
Join phase: a request admitted to a decode worker that is mid-step waits for that
step to end before its first decode step, so its first token gap, and its TPOT
(divided over osl - 1 gaps), holds a wait anywhere from 0 to one step, which
nothing at dispatch knows, and how much of the TPOT it is depends on the output
length, which nothing at dispatch knows either. Each TPOT stratum reports the share
of held-out requests that joined a busy decoder, the MAPE of a prediction exact but
for that wait (what the wait costs a prediction that ignores it), and the MAPE of one
that knows everything, the output length included, but the phase (the step in
progress taken as half done, the median of a uniform phase): the floor the phase
alone sets.
Training time: `fit_all` (4 models) on the newest 100k samples of the first
scenario, median of --repeats runs, with the 1-minute load average around it
(the machine is shared).

Writes benchmarks/results/retrain.json and prints a markdown table.
Run: .venv/bin/python benchmarks/bench_retrain.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import load_profile_dir  # noqa: E402
from routing.features import FEATURE_SET_VERSION  # noqa: E402
from routing.models.predictor import ProfileEstimator  # noqa: E402
from routing.training.config import TrainingConfig  # noqa: E402
from routing.training.data import prepare_samples  # noqa: E402
from routing.training.evaluation import STRATA  # noqa: E402
from routing.training.fit import fit_all  # noqa: E402
from routing.training.publish import decide_candidate  # noqa: E402
from routing.training.split import holdout_rows, splits_for  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.samples import record_samples, simulate_routed  # noqa: E402
from workloads.traces import time_window  # noqa: E402
from sim.whatif.scenario import WhatIfScenario, load_model, load_scenario_trace  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
PROFILE_DIR = DATA / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
OUT = ROOT / "benchmarks" / "results" / "retrain.json"
SCENARIOS = [
    {"name": "azure_conv x4", "trace": "azure2023_conv.csv.gz", "load_multiplier": 4.0, "window_s": None},
    {"name": "azure_conv x8 (30 min)", "trace": "azure2023_conv.csv.gz", "load_multiplier": 8.0, "window_s": 1800.0},
    {"name": "mooncake x4", "trace": "mooncake_fast25_synthetic_trace.jsonl.gz", "load_multiplier": 4.0,
     "window_s": None},
    # A loaded fleet: one prefill worker for x5 the trace (the planner would run two or three), so queues
    # build in each burst and drain after it (TTFT median 0.12 s, p90 11 s): the deep-queue samples the
    # planner-sized fleets hardly produce.
    {"name": "azure_conv x5 loaded (static 1x2, 30 min)", "trace": "azure2023_conv.csv.gz", "load_multiplier": 5.0,
     "window_s": 1800.0, "policy": "static:1x2"},
]
# Training variants measured on the same samples next to the default configuration.
VARIANTS = {
    "absolute model (not relative to the profile estimate)": {"relative_to_estimate": "never"},
    "feature set 1 (before the prefill-progress features)": {"feature_set": 1},
    "p90 calibration: one global shift for both targets": {"p90_calibration": {"ttft": "global", "tpot": "global"}},
    "p90 calibration: per load bucket for both targets": {
        "p90_calibration": {"ttft": "load_bucket", "tpot": "load_bucket"}},
}
# Training variants on other recordings of the same simulated requests: name -> sim.samples decode_pick.
LIFECYCLE_VARIANTS = {"decode named at dispatch (both endpoints at once, as llm-d picks)": "at_dispatch"}
DEFAULT_DECODE_PICK = "after_prefill"
TARGETS = {"mape_max": 0.05, "p90_coverage": [0.88, 0.92], "training_s_max_100k": 10.0,
           "stratum_min_holdout": 500}


def samples_cached(sc: dict, *, quick: bool, cache_dir: Path | None) -> tuple[dict[str, list[dict]], dict, dict, dict]:
    """samples_for, read from / written to cache_dir when given (this benchmark's own recordings, pickled)."""
    if cache_dir is None:
        return samples_for(sc, quick=quick)
    path = cache_dir / (sc["name"].replace(" ", "_").replace("(", "").replace(")", "") + ("-quick" if quick else "")
                        + "-lifecycles-v3.pkl")
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    out = samples_for(sc, quick=quick)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(out, f)
    return out


def samples_for(sc: dict, *, quick: bool) -> tuple[dict[str, list[dict]], dict, dict[str, float], dict]:
    """The scenario's samples per decode_pick (the default and each lifecycle variant's), run facts, each
    request's late batch-mates' prefill time (late_batch_ms) and its decode join phase (join_phase)."""
    what_if = WhatIfScenario(trace=str(DATA / "traces" / sc["trace"]), profile_dir=str(PROFILE_DIR),
                             load_multiplier=sc["load_multiplier"], seed=0)
    trace = load_scenario_trace(what_if)
    window = 300.0 if quick else sc["window_s"]
    if window is not None:
        trace = time_window(trace, 0.0, window)
    t0 = time.perf_counter()
    routed = simulate_routed(trace, profile_dir=str(PROFILE_DIR), policy=sc.get("policy", "planner"))
    t1 = time.perf_counter()
    profile = load_profile_dir(PROFILE_DIR)
    picks = [DEFAULT_DECODE_PICK, *LIFECYCLE_VARIANTS.values()]
    samples = {pick: record_samples(routed, profile_dir=str(PROFILE_DIR), profile=profile, decode_pick=pick)
               for pick in picks}
    t2 = time.perf_counter()
    info = {"requests": len(routed), "trace_duration_s": round(trace.duration_s, 1),
            "load_model": load_model(sc["load_multiplier"], what_if.jitter_s),
            "simulate_s": round(t1 - t0, 1), "record_s": round(t2 - t1, 1),
            "samples_recorded": len(samples[DEFAULT_DECODE_PICK])}
    return samples, info, late_batch_ms(routed, ProfileTables(profile)), join_phase(routed)


def join_phase(routed) -> dict[str, tuple[float, float, int]]:
    """Per request id ("r<index>") admitted to a decode worker: (the wait for the step in progress, ms; that
    step's length, ms, 0 on an idle worker; output tokens)."""
    ok = np.flatnonzero(np.isfinite(routed.join_wait_s))
    return {f"r{i}": (w, st, o) for i, w, st, o in zip(ok.tolist(), (routed.join_wait_s[ok] * 1e3).tolist(),
                                                       (routed.join_step_s[ok] * 1e3).tolist(),
                                                       routed.osl_tokens[ok].tolist())}


def late_batch_ms(routed, tables) -> dict[str, float]:
    """Per request id ("r<index>", as sim.samples names them), the prefill time, ms, its batch took for
    requests that arrived after it (0: none). Batch-mates share a prefill worker and a prefill end; the
    simulator's profile engine runs a batch of whole prompts in the profile's TTFT at their sum."""
    done = routed.prefill_done_s
    order = np.lexsort((routed.arrival_s, done, routed.prefill_wid))
    out: dict[str, float] = {}
    start = 0
    while start < order.size:
        i0 = order[start]
        end = start + 1
        while end < order.size and routed.prefill_wid[order[end]] == routed.prefill_wid[i0] \
                and done[order[end]] == done[i0]:
            end += 1
        batch = order[start:end]
        tokens = routed.isl_tokens[batch]
        total = int(tokens.sum())
        later = np.concatenate([np.cumsum(tokens[::-1])[::-1][1:], [0]])  # arrived after each, in arrival order
        for i, late in zip(batch.tolist(), later.tolist()):
            out[f"r{i}"] = tables.prefill_ms(total) - tables.prefill_ms(total - int(late)) if late else 0.0
        start = end
    return out


def evaluate_scenario(samples: list[dict], cfg: TrainingConfig, estimate, *, max_samples: int,
                      late: dict[str, float] | None = None, join: dict[str, tuple] | None = None) -> dict:
    """The scenario's figures; late: each request's late batch-mates' prefill time (late_batch_ms); join: its
    decode join phase (join_phase)."""
    used = samples[-max_samples:]
    prepared = prepare_samples(used, cfg, estimate=estimate)
    t0 = time.perf_counter()
    models = fit_all(prepared, cfg)
    fit_s = time.perf_counter() - t0
    # As the retrain flow decides: a target whose trees are worse than the estimate is kept on it.
    cand = decide_candidate(models, prepared, cfg, version="bench", created_at_s=None, current_document=None,
                            current_version=None, estimate=estimate, force=False)
    ev, doc, decision, models = cand.evaluation, cand.document, cand.decision, cand.models
    splits = splits_for(prepared, cfg)
    out = {"samples_used": len(used), "fit_s": round(fit_s, 2), "document_bytes": len(json.dumps(doc)),
           "gate": decision.code, "gate_reason": decision.reason, "kept_estimate": list(cand.kept_estimate),
           "strata": strata_of(ev.candidate)}
    if late is not None:
        overall, per_stratum = late_figures(prepared, cfg, late, used, splits)
        out["late_batch_mates"] = overall
        for st, figures in zip(out["strata"], per_stratum):
            st["ttft"]["late_batch_mates"] = figures
    if join is not None:
        overall, per_stratum = join_figures(prepared, cfg, join, used, splits)
        out["join_phase"] = overall
        for st, figures in zip(out["strata"], per_stratum):
            st["tpot"]["join_phase"] = figures
    for t in ("ttft", "tpot"):
        c, e = ev.candidate[t], ev.estimate[t]
        n_tr, n_cal, n_hold = splits[t].sizes()
        out[t] = {
            "train": n_tr, "calibration": n_cal, "holdout": n_hold,
            "dropped": {k: v for k, v in prepared.by_target[t].dropped.items() if v},
            "mape": round(c["mape"], 5), "p90_coverage": round(c["p90_coverage"], 4),
            "p90_loss": round(c["p90_loss"], 5), "estimate_mape": round(e["mape"], 5),
            "served": {k: round(v, 5) for k, v in c["served"].items()} if "served" in c else None,
            "estimate_p90_loss": round(e["p90_loss"], 5), "iterations": models[t].iterations,
            "point_model": "estimate" if t in cand.kept_estimate else models[t].mean_kind,
            "point_selection": {k: round(v, 5) for k, v in models[t].point_selection.items()},
            "p90_calibration_factor": round(math.exp(models[t].p90_log_offset), 4),
            "buckets": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in b.items()}
                        for b in c["buckets"] if b["n"]],
        }
    return out


def late_figures(prepared, cfg: TrainingConfig, late: dict[str, float], used: list[dict],
                 splits: dict) -> tuple[dict, list[dict]]:
    """Held-out TTFT rows overall and per stratum: the share whose prefill batch took later arrivals, and the
    floor MAPE (each outcome predicted exactly less its late batch-mates' prefill time)."""
    def row(request_id: str, y_ms: float) -> tuple[float, bool]:
        ms = late.get(request_id, np.nan)
        return ms / y_ms, ms > 0
    return floor_figures(prepared, cfg, used, splits, "ttft", row)


def join_figures(prepared, cfg: TrainingConfig, join: dict[str, tuple], used: list[dict],
                 splits: dict) -> tuple[dict, list[dict]]:
    """Held-out TPOT rows overall and per stratum: the share admitted to a decoder mid-step; wait_mape, the MAPE
    of each outcome predicted exactly less its join wait; floor_mape, exactly but for the join phase (the step in
    progress taken as half done, the output length known)."""
    def row(request_id: str, y_ms: float) -> tuple[tuple[float, float], bool]:
        if request_id not in join:
            return (np.nan, np.nan), False
        wait_ms, step_ms, osl = join[request_id]
        gaps = max(osl - 1, 1) * y_ms
        return (wait_ms / gaps, abs(wait_ms - step_ms / 2) / gaps), step_ms > 0
    return floor_figures(prepared, cfg, used, splits, "tpot", row, names=("wait_mape", "floor_mape"))


def floor_figures(prepared, cfg: TrainingConfig, used: list[dict], splits: dict, target: str, row,
                  names: tuple[str, ...] = ("floor_mape",)) -> tuple[dict, list[dict]]:
    """{"n", "share", *names} of a target's held-out rows (splits: `splits_for` of prepared, the evaluation's),
    overall and per stratum: row(request id, outcome ms)
    gives a row's errors, one per name (NaN: unknown; a bare float for one name), and whether it is affected;
    each name's figure is the mean of its errors."""
    data = prepared.by_target[target]
    rows = holdout_rows(data, splits[target], max_source_frac=cfg.holdout_max_source_frac)
    request_of = {s["seq"]: s["request_id"] for s in used if s.get("target") == target}
    y, x = data.y_ms[rows], data.x[rows]
    pairs = [row(request_of.get(int(q), ""), float(v)) for q, v in zip(data.seq[rows], y)]
    error = np.array([e for e, _ in pairs], dtype=float).reshape(len(pairs), len(names))
    hit = np.array([h for _, h in pairs], dtype=bool)

    def figures(sel: np.ndarray) -> dict:
        sel = sel & np.isfinite(error).all(axis=1)
        if not sel.any():
            return {"n": 0, "share": None, **dict.fromkeys(names)}
        return {"n": int(sel.sum()), "share": round(float(np.mean(hit[sel])), 4),
                **{k: round(float(np.mean(error[sel, j])), 5) for j, k in enumerate(names)}}

    return figures(np.ones(y.size, dtype=bool)), [figures(st.select(target, x)) for st in STRATA]


def _figures(m: dict) -> dict:
    out = {"n": m["n"], **{k: (None if m[k] is None else round(m[k], 5)) for k in ("mape", "p90_coverage", "p90_loss")}}
    if "served" in m:
        out["served"] = {k: (None if v is None else round(v, 5)) for k, v in m["served"].items()}
    return out


def strata_of(candidate: dict) -> list[dict]:
    """Per stratum (routing.training.STRATA): {"name", "n" (both targets' held-out rows), "ttft", "tpot"}."""
    out = []
    for i, stratum in enumerate(STRATA):
        per = {t: _figures(candidate[t]["strata"][i]) for t in ("ttft", "tpot")}
        out.append({"name": stratum.name, "n": per["ttft"]["n"] + per["tpot"]["n"], **per})
    return out


def target_misses(result: dict) -> list[str]:
    """Every figure outside TARGETS: each scenario, and each stratum with enough held-out rows of a target."""
    lo, hi = TARGETS["p90_coverage"]
    misses = []
    for s in result["scenarios"]:
        blocks = [(s["name"], t, s[t] | {"n": s[t]["holdout"], "late_batch_mates": s.get("late_batch_mates"),
                                         "join_phase": s.get("join_phase")}) for t in ("ttft", "tpot")]
        blocks += [(f"{s['name']} / {st['name']}", t, st[t]) for st in s["strata"] for t in ("ttft", "tpot")
                   if st[t]["n"] >= TARGETS["stratum_min_holdout"]]
        for where, t, m in blocks:
            if m["mape"] > TARGETS["mape_max"]:
                floor = _floor_words(t, m.get("late_batch_mates" if t == "ttft" else "join_phase"))
                misses.append(f"{where} {t} MAPE {m['mape']:.2%} (n={m['n']}{floor})")
            # The p90 the router serves: with its online calibration when the run measured it.
            cov, how = ((m["served"]["p90_coverage"], "as served") if m.get("served") else (m["p90_coverage"], "fixed"))
            if not lo <= cov <= hi:
                misses.append(f"{where} {t} p90 coverage {how} {cov:.1%} (n={m['n']})")
    tt = result.get("training_time")
    if tt and tt["median_s"] > TARGETS["training_s_max_100k"]:
        misses.append(f"training {tt['median_s']} s for {tt['samples']} samples")
    return misses


def _floor_words(target: str, fl: dict | None) -> str:
    """A miss's floor, in words ("" when not measured)."""
    if not fl or fl["floor_mape"] is None:
        return ""
    if target == "ttft":
        return f"; floor {fl['floor_mape']:.2%}: {fl['share']:.0%} took later arrivals into their batch"
    return (f"; the join wait costs a prediction that ignores it {fl['wait_mape']:.2%}, {fl['floor_mape']:.2%} "
            f"knowing the output length: {fl['share']:.0%} joined a decoder mid-step")


def training_time(samples: list[dict], cfg: TrainingConfig, estimate, *, n: int, repeats: int) -> dict:
    prepared = prepare_samples(samples[-n:], cfg, estimate=estimate)
    load_before = os.getloadavg()[0]
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit_all(prepared, cfg)
        runs.append(time.perf_counter() - t0)
    return {"samples": min(n, len(samples)), "runs_s": [round(r, 2) for r in runs],
            "median_s": round(statistics.median(runs), 2), "n_threads": cfg.n_threads,
            "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)}


def variant(samples: list[dict], cfg: TrainingConfig, estimate, *, max_samples: int) -> dict:
    """Held-out MAPE and p90 coverage of one training variant (same samples, same split)."""
    r = evaluate_scenario(samples, cfg, estimate, max_samples=max_samples)
    return {"fit_s": r["fit_s"], **{t: {k: r[t][k] for k in ("mape", "p90_coverage", "p90_loss")}
                                     for t in ("ttft", "tpot")}}


def _coverages(m: dict) -> str:
    """'fixed / served' p90 coverage of a metrics block (— when none)."""
    if m["p90_coverage"] is None:
        return "—"
    served = (m.get("served") or {}).get("p90_coverage")
    return f"{m['p90_coverage']:.1%}" + ("" if served is None else f" / {served:.1%}")


def table(result: dict) -> str:
    lines = ["| scenario | requests | samples used | TTFT MAPE | TTFT p90 cov. fixed / served | TPOT MAPE "
             "| TPOT p90 cov. fixed / served | estimate MAPE TTFT / TPOT | fit s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in result["scenarios"]:
        lines.append(
            f"| {s['name']} | {s['requests']} | {s['samples_used']} | {s['ttft']['mape']:.2%} "
            f"| {_coverages(s['ttft'])} | {s['tpot']['mape']:.2%} | {_coverages(s['tpot'])} "
            f"| {s['ttft']['estimate_mape']:.1%} / {s['tpot']['estimate_mape']:.1%} | {s['fit_s']:.1f} |")
    lines += ["", "Same samples, other training variants (TTFT MAPE / p90 cov., TPOT MAPE / p90 cov.):", "",
              "| scenario | variant | TTFT MAPE | TTFT p90 cov. | TPOT MAPE | TPOT p90 cov. |", "|---|---|---|---|---|---|"]
    for s in result["scenarios"]:
        for name, v in s["variants"].items():
            lines.append(f"| {s['name']} | {name} | {v['ttft']['mape']:.2%} | {v['ttft']['p90_coverage']:.1%} "
                         f"| {v['tpot']['mape']:.2%} | {v['tpot']['p90_coverage']:.1%} |")
    lines += ["", "Per stratum (held-out rows, MAPE / p90 coverage; * fewer than "
              f"{TARGETS['stratum_min_holdout']} rows, not held to the targets):", "",
              "| scenario | stratum | TTFT n | TTFT MAPE | TTFT floor (late batch-mates) | TTFT p90 cov. fixed / served "
              "| TPOT n | TPOT MAPE | TPOT join wait / floor (join phase) | TPOT p90 cov. fixed / served |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in result["scenarios"]:
        for st in s["strata"]:
            cells = []
            for t in ("ttft", "tpot"):
                m = st[t]
                star = "*" if m["n"] < TARGETS["stratum_min_holdout"] else ""
                cells += [f"{m['n']}{star}", "—" if m["mape"] is None else f"{m['mape']:.2%}"]
                fl = m.get("late_batch_mates" if t == "ttft" else "join_phase") or {}
                both = f"{fl['wait_mape']:.2%} / " if "wait_mape" in fl and fl["wait_mape"] is not None else ""
                cells.append("—" if fl.get("floor_mape") is None
                             else f"{both}{fl['floor_mape']:.2%} ({fl['share']:.0%} of rows)")
                cells.append(_coverages(m))
            lines.append(f"| {s['name']} | {st['name']} | " + " | ".join(cells) + " |")
    tt = result["training_time"]
    lines.append("")
    lines.append(f"Training time for {tt['samples']} samples (4 models, {tt['n_threads']} thread): median "
                 f"{tt['median_s']:.1f} s of {tt['runs_s']} (load average {tt['loadavg_1m_before']} before, "
                 f"{tt['loadavg_1m_after']} after, {result['machine']['cpu_count']} cores).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-samples", type=int, default=100_000, help="newest samples used (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="training-time runs (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="5-minute windows, no JSON written (smoke run)")
    ap.add_argument("--only", help="run only the scenario whose name starts with this (no JSON written)")
    ap.add_argument("--no-variants", action="store_true", help="skip the training variants (no JSON written)")
    ap.add_argument("--samples-cache", type=Path,
                    help="folder keeping each scenario's recorded samples, to re-train without re-simulating")
    args = ap.parse_args(argv)
    partial = args.quick or bool(args.only) or args.no_variants
    for p in (PROFILE_DIR, *(DATA / "traces" / s["trace"] for s in SCENARIOS)):
        if not p.exists():
            print(f"{p}: benchmark data not found (../shared/data beside the project)", file=sys.stderr)
            return 2
    cfg = TrainingConfig()
    estimate = ProfileEstimator(load_profile_dir(PROFILE_DIR))
    load_start = os.getloadavg()[0]
    scenarios, first_samples = [], None
    for sc in [s for s in SCENARIOS if not args.only or s["name"].startswith(args.only)]:
        recordings, info, late, join = samples_cached(sc, quick=args.quick, cache_dir=args.samples_cache)
        samples = recordings[DEFAULT_DECODE_PICK]
        first_samples = first_samples if first_samples is not None else samples
        res = {"name": sc["name"], "trace": sc["trace"], "load_multiplier": sc["load_multiplier"],
               "window_s": sc["window_s"], **info, **evaluate_scenario(samples, cfg, estimate,
                                                                      max_samples=args.max_samples, late=late, join=join)}
        res["variants"] = {
            name: variant(samples, cfg.model_copy(update=update), estimate, max_samples=args.max_samples)
            for name, update in ({} if args.no_variants else VARIANTS).items()
        } | {
            name: variant(recordings[pick], cfg, estimate, max_samples=args.max_samples)
            for name, pick in ({} if args.no_variants else LIFECYCLE_VARIANTS).items()
        }
        scenarios.append(res)
        print(f"{sc['name']}: {info['requests']} requests, TTFT MAPE {res['ttft']['mape']:.2%}, "
              f"TPOT MAPE {res['tpot']['mape']:.2%}", flush=True)
    result = {
        "what": "retrain core on simulator samples recorded by a real in-process routing service: held-out "
                "(newest 20%) MAPE and p90 coverage of the exported model vs the profile estimate; training time",
        "inputs": {"profile": "profiles/dynamo/profiler/H200_TP1P_TP1D (fleet and router estimate)",
                   "policy": "planner (default config, SLA 200 ms TTFT / 10 ms ITL), least-loaded routing",
                   "features": "lifecycle-call estimates (no scraped engine metrics)",
                   "lifecycle": "dispatched names prefill; prefill_done names decode (the simulator's and Dynamo's "
                                "order); the at-dispatch lifecycle is a variant",
                   "load_model": "copies of a trace are independent tenants (shifted by up to +-30 s)",
                   "feature_set": cfg.feature_set, "current_feature_set": FEATURE_SET_VERSION},
        "config": cfg.model_dump(),
        "machine": {"python": platform.python_version(), "cpu": platform.machine(), "cpu_count": os.cpu_count(),
                    "loadavg_1m_start": round(load_start, 2)},
        "targets": TARGETS,
        "scenarios": scenarios,
        "training_time": training_time(first_samples, cfg, estimate, n=args.max_samples, repeats=args.repeats),
    }
    result["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    result["targets_missed"] = target_misses(result)
    print(table(result))
    print("targets missed:" if result["targets_missed"] else "every target met",
          *result["targets_missed"], sep="\n  ")
    if not partial:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
