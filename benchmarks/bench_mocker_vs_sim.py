"""Our simulator against Dynamo 1.6.1's mocker: the same trace segment on the same fixed fleet.

For each fixed fleet (P prefill x D decode workers) the segment is replayed
twice:

- **simulator**: `sim.replay` with a static policy, the frontend's round-robin
  routing, workers ready from the start, engines from the H200 Llama-8B profile;
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
from sim.loadgen import LoadGenConfig, replay as replay_http  # noqa: E402
from sim.lookup import ProfileTables  # noqa: E402
from sim.policies import StaticPolicy  # noqa: E402
from sim.replay import ReplaySettings, replay  # noqa: E402
from sim.trace_shaping import build_trace  # noqa: E402

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


def run_sim(trace, tables, prefill: int, decode: int) -> dict:
    scenario = ReplaySettings(slo=SLO, interval_s=30.0, router="round-robin", sim=SimConfig(startup_s=0.0))
    result = replay(trace, tables, StaticPolicy(prefill, decode), scenario=scenario)
    r = result.requests
    itl = np.where(r.osl_tokens > 1, r.itl_ms, np.nan)
    return summarize(r.ttft_ms, itl, r.osl_tokens, ~np.isnan(r.finish_s))


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
            live = run_live(python, etcd_url, tmp / f"{prefill}x{decode}", cfg_data, prefill, decode, len(trace))
            rows.append({"fleet": f"{prefill}x{decode}", "simulator": sim, "mocker": live,
                         "attainment_gap_points": round(sim["sla_attainment_pct"] - live["sla_attainment_pct"], 2),
                         "wall_s": round(time.time() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        etcd.terminate()
        etcd.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "what": "the same trace segment on the same fixed fleets: our simulator vs Dynamo 1.6.1 mocker workers "
                "behind a real Dynamo frontend (load over HTTP, streaming chat completions)",
        "trace": trace.name, "requests": len(trace),
        "load": "independent tenants: the x5 window superposes five copies shifted by up to ±30 s (seed 0)",
        "profile": str(PROFILE.relative_to(ROOT)), "slo": {"ttft_ms": SLO.ttft_ms, "itl_ms": SLO.itl_ms},
        "mocker": "dynamo.mocker 1.6.1, --planner-profile-data (same profile), --speedup-ratio 1, "
                  "round-robin frontend router, etcd discovery, TCP request plane",
        "measured_on": time.strftime("%Y-%m-%d"), "machine": "2 cores (everything on one machine)",
        "fleets": rows,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| fleet | TTFT p50/p90/p99 ms sim / mocker | ITL p50/p90/p99 ms sim / mocker | SLA sim / mocker |")
    print("|---|---|---|---|")
    for r in rows:
        s, m = r["simulator"], r["mocker"]

        def trio(d):
            return "/".join(f"{d.get(k, float('nan')):.1f}" for k in ("p50", "p90", "p99"))

        print(f"| {r['fleet']} | {trio(s['ttft_ms'])} / {trio(m['ttft_ms'])} | {trio(s['itl_ms'])} / "
              f"{trio(m['itl_ms'])} | {s['sla_attainment_pct']:.1f}% / {m['sla_attainment_pct']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
