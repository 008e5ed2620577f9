"""Wall time of one full planner decision, per predictor: correct -> predict -> size -> saturation -> decide.

Each run calls `planner.pipeline.plan_interval` (the path the flow, the simulator
and the CLI share) on already-collected inputs, so no I/O is timed:
- load history: ServeGen m-mid (14 days of a production language service),
  request counts summed over clients per 10-minute window, scaled by
  RATE_SCALE and replayed as 60-s planner intervals; collection gaps are NaN.
  Mean ISL/OSL per interval: the rate-weighted mean of the clients' length
  distributions for that 6-hour window. Each run slides the history window by
  one interval, so no two runs fit the same data;
- profile: the measured Dynamo H200 Llama-3.1-8B TP1 profile;
- fleet: prefill 6, decode 10 replicas, one pod metric each (seeded KV/queue),
  a recent-targets history for the stabilization window.

Two modes per predictor: "stateless" (no predictor cache, as a fresh flow
run) and "warm" (one cache kept across runs, as the simulator keeps it).
Every registered predictor is timed; ARIMA and Prophet appear when they are
registered in planner.predict.

Writes benchmarks/results/decision.json and prints a markdown table.
Run: .venv/bin/python benchmarks/bench_decision.py [--max-seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import load_profile_dir  # noqa: E402
from planner.config import PlannerConfig, ProfileConfig  # noqa: E402
from planner.decision.decide import decide  # noqa: E402
from planner.pipeline import plan_interval  # noqa: E402
from planner.steps import analyze_fleet_saturation, predict_load  # noqa: E402
from planner.predictors.registry import predictor_names  # noqa: E402
from planner.types import (  # noqa: E402
    FleetState,
    LoadHistory,
    Observation,
    PodMetrics,
    PoolSizing,
    PoolState,
)
from workloads.servegen import load_servegen  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
PROFILE_DIR = DATA / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
SERVEGEN = DATA / "traces" / "servegen_language_m-mid.tar.gz"
OUT = ROOT / "benchmarks" / "results" / "decision.json"
INTERVAL_S = 60.0
RATE_SCALE = 0.01  # m-mid averages ~1,790 req/s; 1% keeps the fleet within the default bounds
MODES = ("stateless", "warm")
TARGET_MS = {"constant": 50.0, "kalman": 50.0, "arima": 1000.0, "prophet": 1000.0}


def _mean_length(dist) -> float:
    pmf = np.diff(dist.cdf, prepend=0.0)
    return float(np.dot(dist.values, pmf))


def _window_mean_lengths(data, dists_per_client, t_s: float, rates: np.ndarray) -> float:
    """Rate-weighted mean length over clients for the 6-hour window containing t_s."""
    key = np.floor(t_s / 21600.0) * 21600.0
    num = den = 0.0
    for c, dists in enumerate(dists_per_client):
        if rates[c] <= 0 or not dists:
            continue
        k = key if key in dists else min(dists, key=lambda d: abs(d - key))
        num += rates[c] * _mean_length(dists[k])
        den += rates[c]
    return num / den if den > 0 else float("nan")


def load_series() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(requests per interval, mean ISL, mean OSL), one entry per ServeGen window."""
    if not SERVEGEN.is_file():
        raise SystemExit(f"benchmark data missing: {SERVEGEN} (see ../shared/data/README.md)")
    data = load_servegen(SERVEGEN)
    _, counts = data.summed_series()
    requests = (counts / data.window_s * INTERVAL_S * RATE_SCALE).filled(np.nan)
    isl = np.empty(len(requests))
    osl = np.empty(len(requests))
    for w, t_s in enumerate(data.window_start_s):
        rates = data.rate_rps[:, w]
        isl[w] = _window_mean_lengths(data, data.input_dists, t_s, rates)
        osl[w] = _window_mean_lengths(data, data.output_dists, t_s, rates)
    return requests, isl, osl


def inputs(series, start: int, n_hist: int, seed: int) -> tuple[Observation, FleetState]:
    """The observation and fleet state of run `start` (history window [start, start + n_hist))."""
    requests, isl, osl = series
    sl = slice(start, start + n_hist)
    t = tuple(float(i * INTERVAL_S) for i in range(start + 1, start + n_hist + 1))
    history = LoadHistory(
        t_s=t,
        num_requests=tuple(float(x) for x in requests[sl]),
        avg_isl_tokens=tuple(float(x) for x in isl[sl]),
        avg_osl_tokens=tuple(float(x) for x in osl[sl]),
        interval_s=INTERVAL_S,
    )
    rng = np.random.default_rng(seed)
    pods = [
        PodMetrics(pod=f"{pool}-{i}", pool=pool, kv_usage_frac=float(rng.uniform(0.2, 0.6)),
                   queue_length=float(rng.integers(0, 3)))
        for pool, n in (("prefill", 6), ("decode", 10))
        for i in range(n)
    ]
    last = history.num_requests[-1]
    obs = Observation(
        taken_at_s=t[-1],
        interval_s=INTERVAL_S,
        num_requests=last,
        avg_isl_tokens=history.avg_isl_tokens[-1],
        avg_osl_tokens=history.avg_osl_tokens[-1],
        avg_ttft_ms=float(rng.uniform(60, 140)),
        avg_itl_ms=float(rng.uniform(6, 12)),
        history=history,
        pods=tuple(pods),
    )
    fleet = FleetState(
        prefill=PoolState(current_replicas=6, ready_replicas=6),
        decode=PoolState(current_replicas=10, ready_replicas=10),
        recent_targets=tuple((t[-1] - 60.0 * k, 6, 10) for k in (4, 3, 2, 1)),
    )
    return obs, fleet


def config(predictor: str) -> PlannerConfig:
    return PlannerConfig(
        adjustment_interval_s=INTERVAL_S,
        profile=ProfileConfig(dir=str(PROFILE_DIR)),
        predictor={"name": predictor},
        decision={"prefill": {"max_replicas": 64}, "decode": {"max_replicas": 64}, "max_gpu_budget": 96},
    )


def _stats(times_s: list[float]) -> dict:
    ms = sorted(1000.0 * x for x in times_s)
    return {
        "runs": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 3),
        "min_ms": round(ms[0], 3),
        "max_ms": round(ms[-1], 3),
    }


def bench_predictor(name: str, series, *, max_seconds: float, min_runs: int, max_runs: int) -> dict:
    cfg = config(name)
    profile = load_profile_dir(PROFILE_DIR)
    n_hist = cfg.predictor.history_intervals
    n_series = len(series[0])
    out: dict = {}
    for mode in MODES:
        cache: dict | None = {} if mode == "warm" else None
        totals, predict_times, guard_times = [], [], []
        predictors_used: set[str] = set()
        began = time.perf_counter()
        run = 0
        # One untimed call so imports and first-use setup are not counted as a decision.
        obs, fleet = inputs(series, 0, n_hist, seed=0)
        plan_interval(obs, fleet, cfg, profile, now_s=obs.taken_at_s, predictor_cache=cache)
        while run < max_runs and (run < min_runs or time.perf_counter() - began < max_seconds):
            start = (run + 1) % (n_series - n_hist)
            obs, fleet = inputs(series, start, n_hist, seed=run)
            t0 = time.perf_counter()
            result = plan_interval(obs, fleet, cfg, profile, now_s=obs.taken_at_s, predictor_cache=cache)
            totals.append(time.perf_counter() - t0)
            predictors_used.add(result.forecast.predictor if result.forecast else "none")
            # The predict step and the guardrail + decision alone, on the same inputs, for the breakdown.
            t0 = time.perf_counter()
            predict_load(obs, cfg.predictor, cache=cache)
            predict_times.append(time.perf_counter() - t0)
            sizing = result.sizing or {p: PoolSizing(p, 1) for p in ("prefill", "decode")}
            t0 = time.perf_counter()
            sat = analyze_fleet_saturation(obs, fleet=fleet, cfg=cfg, now_s=obs.taken_at_s)
            decide(sizing=sizing, saturation=sat, fleet=fleet, obs=obs, cfg=cfg.decision, now_s=obs.taken_at_s)
            guard_times.append(time.perf_counter() - t0)
            run += 1
        out[mode] = {
            "total": _stats(totals),
            "predict_step": _stats(predict_times),
            "saturation_and_decide": _stats(guard_times),
            "forecast_by": sorted(predictors_used),
            "history_intervals": n_hist,
        }
    return out


def table(result: dict) -> str:
    lines = [
        "| predictor | mode | runs | median ms | p90 ms | predict median ms | saturation+decide median ms | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, modes in result["predictors"].items():
        target = TARGET_MS.get(name)
        for mode, r in modes.items():
            verdict = "" if target is None else (
                f"< {target:g} ms: {'met' if r['total']['median_ms'] < target else 'MISSED'}")
            lines.append(
                f"| {name} | {mode} | {r['total']['runs']} | {r['total']['median_ms']:.2f} | "
                f"{r['total']['p90_ms']:.2f} | {r['predict_step']['median_ms']:.2f} | "
                f"{r['saturation_and_decide']['median_ms']:.3f} | {verdict} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seconds", type=float, default=15.0, help="time budget per predictor and mode, s")
    ap.add_argument("--min-runs", type=int, default=11, help="runs per predictor and mode at least")
    ap.add_argument("--max-runs", type=int, default=301, help="runs per predictor and mode at most")
    ap.add_argument("--predictors", nargs="*", default=None, help="subset of registered predictors")
    args = ap.parse_args()
    names = args.predictors or predictor_names()
    series = load_series()
    load_before = os.getloadavg()
    result = {
        "what": "wall time of one full planner decision via plan_interval (correct, predict, size, "
                "saturation, decide), no I/O; median over runs on sliding real-load histories",
        "inputs": {
            "load": f"{SERVEGEN.name}: summed client rate per 10-min window x {RATE_SCALE}, "
                    f"replayed as {INTERVAL_S:g}-s intervals",
            "profile": str(PROFILE_DIR.relative_to(DATA)),
            "fleet": "prefill 6, decode 10 replicas, 16 pod metrics",
        },
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.machine(),
            "cpu_count": os.cpu_count(),
            "loadavg_1m_before": round(load_before[0], 2),
        },
        "registered_predictors": predictor_names(),
        "not_registered": sorted(set(TARGET_MS) - set(predictor_names())),
        "predictors": {},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            print(f"... {name}", file=sys.stderr)
            result["predictors"][name] = bench_predictor(
                name, series, max_seconds=args.max_seconds, min_runs=args.min_runs, max_runs=args.max_runs
            )
    result["machine"]["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    if result["not_registered"]:
        print(f"\nnot registered yet (no figures): {', '.join(result['not_registered'])}")


if __name__ == "__main__":
    main()
