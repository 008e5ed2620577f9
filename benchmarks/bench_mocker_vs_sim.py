"""Our simulator against Dynamo 1.6.1's mocker: the same trace segment on the same fixed fleet.

For each fixed fleet (P prefill x D decode workers) the segment is replayed
four times:

- **simulator, profile model**: `sim.replay` with a static policy, the frontend's
  round-robin routing, workers ready from the start, engines timed by the H200
  Llama-8B profile (SimConfig's default engine_model "profile", default KV transfer);
- **simulator, mocker model**: the same with engine_model "dynamo_mocker" (chunked
  prefill, the first token after the first decode step, the mocker's regression
  grids), no KV transfer time and at most 256 running requests, as the mocker runs;
- **mocker, virtual time**: Dynamo 1.6.1's own mocker engines replaying the same
  requests offline (`dynamo.replay.api.run_trace_replay`, round-robin, no HTTP,
  no real clock): the mocker's model without the live overheads;
- **live**: real processes on this machine: etcd, Dynamo's frontend, the fleet
  executor holding P + D mocker workers (timed from the same profile,
  `--speedup-ratio 1`), and the load generator sending every request as a
  streaming chat completion at its arrival time.

Per request: TTFT (live: first streamed chunk at the client, so HTTP and
frontend overhead are in it), mean ITL = (end - first token) / (output tokens
- 1), and whether both SLOs held (200 ms TTFT, 10 ms ITL). Percentiles and SLA
attainment side by side; the live frontend's own mean TTFT / ITL (its
histograms' sum / count) as a cross-check of the client's view.

The segment is Azure conversation 2023 from 600 s: 30 s as recorded, 60 s with
five copies superposed (independent tenants: each copy shifted by up to ±30 s),
then 60 s as recorded. Writes benchmarks/results/mocker_vs_sim.json and
prints a markdown table.

Run: .venv/bin/python benchmarks/bench_mocker_vs_sim.py [--fleets 1x1,1x2] (needs the
Dynamo environment: bash scripts/install_dynamo.sh; Debian etcd-server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.profiles import load_profile_dir  # noqa: E402
from executor.localfleet import LocalFleet, _port_free  # noqa: E402
from planner.config import SloTarget  # noqa: E402
from sim.config import SimConfig  # noqa: E402
from sim.fleet import FREE_TRANSFER  # noqa: E402
from sim.live.loadgen import LoadGenConfig, replay as replay_http  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.policies import StaticPolicy  # noqa: E402
from sim.replay import ReplaySettings, replay  # noqa: E402
from workloads.trace_shaping import build_trace  # noqa: E402

PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
SHAPE = [{"duration_s": 30, "load_multiplier": 1}, {"duration_s": 60, "load_multiplier": 5},
         {"duration_s": 60, "load_multiplier": 1}]
SLO = SloTarget(ttft_ms=200.0, itl_ms=10.0)
OUT = ROOT / "benchmarks" / "results" / "mocker_vs_sim.json"


def percentiles(values: np.ndarray) -> dict:
    values = values[~np.isnan(values)]
    return {f"p{q}": round(float(np.percentile(values, q)), 2) for q in (50, 90, 99)} if len(values) else {}


def summarize(ttft_ms: np.ndarray, itl_ms: np.ndarray, osl: np.ndarray, finished: np.ndarray) -> dict:
    met = finished & (ttft_ms <= SLO.ttft_ms) & ((osl <= 1) | (itl_ms <= SLO.itl_ms))
    return {
        "requests": int(len(ttft_ms)), "finished": int(finished.sum()),
        "ttft_ms": percentiles(ttft_ms), "itl_ms": percentiles(itl_ms),
        "sla_attainment_pct": round(100.0 * float(met.mean()), 2),
        "ttft_met_pct": round(100.0 * float((finished & (ttft_ms <= SLO.ttft_ms)).mean()), 2),
        "itl_met_pct": round(100.0 * float((finished & ((osl <= 1) | (itl_ms <= SLO.itl_ms))).mean()), 2),
    }


SIM_MODELS = {
    "profile": SimConfig(startup_s=0.0),
    # the mocker as the executor starts it: no --kv-transfer-bandwidth (no transfer delay), --max-num-seqs 256
    "dynamo_mocker": SimConfig(startup_s=0.0, engine_model="dynamo_mocker", transfer=FREE_TRANSFER,
                               decode_max_batch=256),
}

# Run in the Dynamo environment: the mocker's engines in virtual time on the same requests.
OFFLINE_REPLAY = """
import json, math, sys
from dynamo.replay.api import run_trace_replay
trace_path, profile, prefill, decode, out = sys.argv[1:6]
eng = lambda role: {"engine": {"worker_type": role, "timing_model": {
    "type": "external", "provider": "dynamo_profile", "config": {"path": profile}}}}
rep = run_trace_replay(trace_path, prefill_engine_args=eng("prefill"), decode_engine_args=eng("decode"),
                       num_prefill_workers=int(prefill), num_decode_workers=int(decode),
                       router_mode="round_robin", capture_per_request=True, trace_block_size=64)
rows = [{"arrival_ms": r["arrival_time_ms"], "ttft_ms": r["ttft_ms"], "e2e_ms": r["e2e_latency_ms"],
         "osl": r["output_length"], "isl": r["input_length"]} for r in rep.per_request]
json.dump(rows, open(out, "w"))
"""


def run_sim(trace, tables, prefill: int, decode: int, engine_model: str = "profile") -> dict:
    scenario = ReplaySettings(slo=SLO, interval_s=30.0, router="round-robin", sim=SIM_MODELS[engine_model])
    result = replay(trace, tables, StaticPolicy(prefill, decode), scenario=scenario)
    r = result.requests
    itl = np.where(r.osl_tokens > 1, r.itl_ms, np.nan)
    return summarize(r.ttft_ms, itl, r.osl_tokens, ~np.isnan(r.finish_s))


def run_offline_mocker(python: str, trace, base: Path, prefill: int, decode: int) -> dict:
    """Dynamo's mocker engines in virtual time (its own replay), prompts sharing no prefix."""
    base.mkdir(parents=True, exist_ok=True)
    npz = base / "perf_data.npz"
    subprocess.run([python, "-m", "dynamo.mocker.utils.planner_profiler_perf_data_converter",
                    "--profile_results_dir", str(PROFILE), "--output_dir", str(base)],
                   check=True, capture_output=True)
    lines, next_block = [], 0
    for t, isl, osl in zip(trace.arrival_s, trace.isl_tokens, trace.osl_tokens):
        blocks = -(-int(isl) // 64)
        lines.append(json.dumps({"timestamp": round(float(t) * 1e3, 3), "input_length": int(isl),
                                 "output_length": int(osl), "hash_ids": list(range(next_block, next_block + blocks))}))
        next_block += blocks
    (base / "trace.jsonl").write_text("\n".join(lines) + "\n")
    out = base / "offline.json"
    subprocess.run([python, "-c", OFFLINE_REPLAY, str(base / "trace.jsonl"), str(npz), str(prefill), str(decode),
                    str(out)], check=True, capture_output=True)
    rows = sorted(json.loads(out.read_text()), key=lambda r: r["arrival_ms"])
    ttft = np.array([r["ttft_ms"] if r["ttft_ms"] is not None else np.nan for r in rows])
    osl = np.array([r["osl"] for r in rows])
    e2e = np.array([r["e2e_ms"] for r in rows])
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(osl > 1, (e2e - ttft) / np.maximum(osl - 1, 1), np.nan)
    return summarize(ttft, itl, osl, ~np.isnan(e2e))


def frontend_means(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            for part in ("sum", "count"):
                if line.startswith(f"dynamo_frontend_{name}_{part}{{"):
                    values[f"{name}_{part}"] = float(line.rsplit(" ", 1)[1])
    return {
        "ttft_mean_ms": round(1e3 * values["time_to_first_token_seconds_sum"]
                              / values["time_to_first_token_seconds_count"], 2),
        "itl_mean_ms": round(1e3 * values["inter_token_latency_seconds_sum"]
                             / values["inter_token_latency_seconds_count"], 2),
    }


def run_live(python: str, etcd_url: str, base: Path, cfg_data: dict, prefill: int, decode: int, n: int) -> dict:
    http_port = next(p for p in range(18700, 18800) if _port_free(p))
    fleet = LocalFleet(python=python, etcd_url=etcd_url, base_dir=base, namespace=f"bench{uuid.uuid4().hex[:6]}",
                       http_port=http_port, profile_dir=str(PROFILE), speedup_ratio=1.0,
                       initial_workers={"prefill": prefill, "decode": decode})
    try:
        fleet.start_frontend()
        fleet.start_executor()
        deadline = time.monotonic() + 120
        while not fleet.events("fleet_ready"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet {prefill}x{decode} not ready{fleet.log_tail('executor.log')}")
            time.sleep(0.2)
        cfg = LoadGenConfig.model_validate({**cfg_data, "url": fleet.url, "out_dir": str(base / "loadgen")})
        trace = build_trace(cfg)
        asyncio.run(replay_http(cfg, trace, stop=asyncio.Event()))
        means = frontend_means(fleet.url)
    finally:
        fleet.close()
    rows = sorted((json.loads(line) for line in (base / "loadgen" / "requests.jsonl").read_text().splitlines()),
                  key=lambda r: r["rid"])
    assert len(rows) == n, (len(rows), n)
    ok = np.array([r["ok"] for r in rows])
    ttft = np.array([1e3 * r["ttft_s"] if r["ttft_s"] is not None else np.nan for r in rows])
    osl = np.array([r["completion_tokens"] or 0 for r in rows])
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(osl > 1, (np.array([r["e2e_s"] for r in rows]) * 1e3 - ttft) / np.maximum(osl - 1, 1), np.nan)
    out = summarize(ttft, itl, osl, ok)
    out["failed"] = int((~ok).sum())
    out["frontend_histograms"] = means
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleets", default="1x1,1x2,2x3", help="PxD fixed fleets, comma separated")
    args = parser.parse_args()
    fleets = [tuple(int(x) for x in f.split("x")) for f in args.fleets.split(",")]
    python = subprocess.run(["bash", str(ROOT / "scripts" / "install_dynamo.sh")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    cfg_data = {"model": "tok", "trace_path": str(TRACE), "trace_start_s": 600.0, "shape": SHAPE, "seed": 0,
                "url": "http://x", "out_dir": "x"}
    trace = build_trace(LoadGenConfig.model_validate(cfg_data))
    tables = ProfileTables(load_profile_dir(PROFILE))
    tmp = Path(tempfile.mkdtemp(prefix="bench-mocker-"))
    etcd_port = next(p for p in range(12479, 12600, 2) if _port_free(p) and _port_free(p + 1))
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd = subprocess.Popen(
        ["/usr/bin/etcd", "--name", "b", "--data-dir", str(tmp / "etcd"), "--listen-client-urls", etcd_url,
         "--advertise-client-urls", etcd_url, "--listen-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_port + 1}",
         "--initial-cluster", f"b=http://127.0.0.1:{etcd_port + 1}", "--heartbeat-interval", "10",
         "--election-timeout", "50", "--log-level", "warn"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rows = []
    try:
        time.sleep(1.0)
        for prefill, decode in fleets:
            t0 = time.time()
            sim = run_sim(trace, tables, prefill, decode)
            sim_mocker = run_sim(trace, tables, prefill, decode, "dynamo_mocker")
            offline = run_offline_mocker(python, trace, tmp / f"{prefill}x{decode}-offline", prefill, decode)
            load_before = os.getloadavg()
            live = run_live(python, etcd_url, tmp / f"{prefill}x{decode}", cfg_data, prefill, decode, len(trace))
            load_after = os.getloadavg()
            gap = {name: round(r["sla_attainment_pct"] - live["sla_attainment_pct"], 2)
                   for name, r in (("simulator", sim), ("simulator_mocker_model", sim_mocker),
                                   ("mocker_virtual_time", offline))}
            rows.append({"fleet": f"{prefill}x{decode}", "simulator": sim, "simulator_mocker_model": sim_mocker,
                         "mocker_virtual_time": offline, "mocker": live,
                         "attainment_gap_points": gap["simulator"], "attainment_gap_vs_live_points": gap,
                         "load_average_1_5_15": {"before_live": [round(x, 2) for x in load_before],
                                                 "after_live": [round(x, 2) for x in load_after]},
                         "wall_s": round(time.time() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        etcd.terminate()
        etcd.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "what": "the same trace segment on the same fixed fleets: our simulator (engine_model profile and "
                "dynamo_mocker), Dynamo 1.6.1's mocker engines in virtual time (its offline replay), and live "
                "mocker workers behind a real Dynamo frontend (load over HTTP, streaming chat completions)",
        "trace": trace.name, "requests": len(trace),
        "load": "independent tenants: the x5 window superposes five copies shifted by up to ±30 s (seed 0)",
        "profile": str(PROFILE.relative_to(ROOT)), "slo": {"ttft_ms": SLO.ttft_ms, "itl_ms": SLO.itl_ms},
        "mocker": "dynamo.mocker 1.6.1, --planner-profile-data (same profile), --speedup-ratio 1, "
                  "round-robin frontend router, etcd discovery, TCP request plane",
        "measured_on": time.strftime("%Y-%m-%d"), "machine": "2 cores (everything on one machine)",
        "fleets": rows,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| fleet | TTFT p50/p90/p99 ms: sim profile / sim mocker model / mocker virtual time / live | "
          "ITL p50/p90/p99 ms: same order | SLA: same order |")
    print("|---|---|---|---|")
    columns = ("simulator", "simulator_mocker_model", "mocker_virtual_time", "mocker")

    def trio(d):
        return "/".join(f"{d.get(k, float('nan')):.1f}" for k in ("p50", "p90", "p99"))

    for r in rows:
        ttft = " vs ".join(trio(r[c]["ttft_ms"]) for c in columns)
        itl = " vs ".join(trio(r[c]["itl_ms"]) for c in columns)
        sla = " / ".join(f"{r[c]['sla_attainment_pct']:.1f}%" for c in columns)
        print(f"| {r['fleet']} | {ttft} | {itl} | {sla} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
