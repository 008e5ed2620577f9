"""llm-d's latency-predictor API: ours against llm-d's own sidecars on the same rows, from an EPP-shaped client.

Rows: the loaded retrain scenario's simulator samples (bench_retrain.py: Azure conversation trace x5 as
independent tenants, +-30 s, on a static 1 prefill + 2 decode fleet, first 30 minutes; recorded with both
endpoints named at dispatch, as llm-d's EPP picks), as llm-d training entries (routing.llmd.rows, feature set
1: the seven load fields and the pod's role). In time order, the older 80% are posted to both servers'
training routes; the newest 20% are replayed at the trace's own speed: each chunk of 100 rows is predicted
in one `/predict/bulk/strict` call when its first outcome is due, then posted as training rows (the EPP
posts every second; an outcome posted at once is a little early for both servers alike). Then an
EPP-shaped load for the latency: 20 strict bulk calls a second of 100 rows each (one per scheduling
decision at 100 candidate pods, 400 ms budget) for 60 s while another client posts 50 training rows every
second.

* **Ours**: `sla-planner router --llmd-listen` (a subprocess). After the older rows are posted, the retrain
  core runs once as the retrain flow does (samples read through the admin API, feature set 1, the gate),
  and publishes; during the replay the served p90 is that model's with its online calibration, which the
  posted outcomes move.
* **Theirs** (with `--llmd-checkout`): llm-d-latency-predictor's training and prediction servers from a
  checkout (@ 04e44cd8 with upstream PR #81's one-line fix, which the benchmark does not apply: at
  04e44cd8 their training server never retrains), in their own Python environment, with their CI settings
  (XGBoost, quantile 0.9, retrain every 1 s, >= 100 samples); after the older rows, the benchmark waits
  for a retrain that has seen them and calls `/reload`; during the replay they retrain every second.

Figures per target (held-out rows): p90 coverage (share of outcomes at or under `*_ms`), pinball loss at
0.9 relative to the outcome (routing.training.scores), and per queue stratum; per server, the bulk
call's latency seen by the client (p50, p99, max, calls over 400 ms) and the server's own processing time.
`--quick`: a 5-minute window, the replay unpaced, 10 s of load, no JSON written.

Writes benchmarks/results/llmd_predictor.json and prints a table.
Run: .venv/bin/python benchmarks/bench_llmd_predictor.py --samples-cache /tmp/retrain-cache \\
        [--llmd-checkout /tmp/llmd-lp --llmd-python /tmp/llmd-venv/bin/python] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_retrain import PROFILE_DIR, SCENARIOS, samples_cached  # noqa: E402
from connectors.profiles import load_profile_dir  # noqa: E402
from connectors.router_admin import RouterAdminClient  # noqa: E402
from routing.features import QUANTILE  # noqa: E402
from routing.models.predictor import ProfileEstimator  # noqa: E402
from routing.training.config import TrainingConfig  # noqa: E402
from routing.training.data import prepare_samples  # noqa: E402
from routing.training.fit import fit_all  # noqa: E402
from routing.training.publish import decide_candidate  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "llmd_predictor.json"
SCENARIO = "azure_conv x5 loaded"
POD_TYPE = {"prefill": "prefill", "decode": "decode", "aggregated": ""}
CHUNK = 100
DEADLINE_MS = 400.0
TOKEN = "bench-admin-token"
STRATA = {"queue 0": (0, 0), "queue 1-3": (1, 3), "queue 4+": (4, None)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entry_of(sample: dict) -> dict:
    """An llm-d training entry for one of our stored samples (the inverse of routing.llmd.rows' mapping)."""
    f = sample["features"]
    ttft = sample["target"] == "ttft"
    return {
        "kv_cache_percentage": min(max(float(f["kv_usage_frac"]), 0.0), 1.0),
        "input_token_length": int(round(f["input_tokens"])),
        "num_request_waiting": int(round(f["waiting_requests"])),
        "num_request_running": int(round(f["running_requests"])),
        "num_tokens_generated": 1 if ttft else int(round(f["tokens_generated"])),
        "prefix_cache_score": min(max(float(f["prefix_cache_hit_frac"]), 0.0), 1.0),
        "pod_type": POD_TYPE[sample["role"]],
        "prefill_tokens_in_flight": int(round(f["prefill_tokens_in_flight"])),
        "decode_tokens_in_flight": int(round(f["decode_tokens_in_flight"])),
        "actual_ttft_ms": float(sample["observed_ms"]) if ttft else 0.0,
        "actual_tpot_ms": 0.0 if ttft else float(sample["observed_ms"]),
    }


def wait_answers(url: str, path: str, proc: subprocess.Popen, *, timeout_s: float = 120.0) -> None:
    """Wait until GET url+path answers 200 (RuntimeError if the server exits or the time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        time.sleep(0.5)
    raise RuntimeError(f"{url}{path}: no 200 within {timeout_s:.0f} s")


def start_ours(tmp: Path) -> dict:
    port, admin = free_port(), free_port()
    cfg = tmp / "routing.yaml"
    cfg.write_text(json.dumps({"profile_dir": str(PROFILE_DIR), "samples": {"capacity": 200_000},
                               "llmd": {"listen": f"127.0.0.1:{port}"}}))
    proc = subprocess.Popen([str(Path(sys.executable).with_name("sla-planner")), "router", "--port", str(admin),
                             "--config", str(cfg), "--log-level", "warning"],
                            env={**os.environ, "SLA_ROUTER_TOKEN": TOKEN}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_answers(url, "/readyz", proc)
    return {"procs": [proc], "pred": url, "train": url, "admin": f"http://127.0.0.1:{admin}"}


def start_theirs(checkout: Path, python: str, tmp: Path) -> dict:
    t_port, p_port = free_port(), free_port()
    models, local = tmp / "models", tmp / "local_models"
    models.mkdir()
    local.mkdir()
    common = {**os.environ, "LATENCY_MODEL_TYPE": "xgboost", "LATENCY_QUANTILE_ALPHA": str(QUANTILE),
              "LATENCY_OBJECTIVE_TYPE": "quantile", "PYTHONPATH": str(checkout)}
    train_env = {**common, "LATENCY_RETRAINING_INTERVAL_SEC": "1", "LATENCY_MIN_SAMPLES_FOR_RETRAIN": "100",
                 **{f"LATENCY_{n}_PATH": str(models / f"{f}.joblib") for n, f in (
                     ("TTFT_MODEL", "ttft"), ("TPOT_MODEL", "tpot"), ("TTFT_SCALER", "ttft_scaler"),
                     ("TPOT_SCALER", "tpot_scaler"), ("TTFT_GATED_MODEL", "ttft_gated"),
                     ("TPOT_GATED_MODEL", "tpot_gated"))}}
    pred_env = {**common, "TRAINING_SERVER_URL": f"http://127.0.0.1:{t_port}",
                **{f"LOCAL_{n}_PATH": str(local / f"{f}.joblib") for n, f in (
                    ("TTFT_MODEL", "ttft"), ("TPOT_MODEL", "tpot"), ("TTFT_SCALER", "ttft_scaler"),
                    ("TPOT_SCALER", "tpot_scaler"), ("TTFT_GATED_MODEL", "ttft_gated"),
                    ("TPOT_GATED_MODEL", "tpot_gated"))}}
    train = subprocess.Popen([python, "-m", "uvicorn", "training.training_server:app", "--port", str(t_port),
                              "--host", "127.0.0.1", "--log-level", "warning"], cwd=checkout, env=train_env,
                             stdout=subprocess.DEVNULL, stderr=(tmp / "train.log").open("w"))
    wait_answers(f"http://127.0.0.1:{t_port}", "/readyz", train)
    pred = subprocess.Popen([python, "-m", "uvicorn", "prediction.prediction_server:app", "--port", str(p_port),
                             "--host", "127.0.0.1", "--workers", "1", "--log-level", "warning"], cwd=checkout,
                            env=pred_env, stdout=subprocess.DEVNULL, stderr=(tmp / "pred.log").open("w"))
    wait_answers(f"http://127.0.0.1:{p_port}", "/healthz", pred)  # its /readyz says 503 until a model is loaded
    return {"procs": [train, pred], "pred": f"http://127.0.0.1:{p_port}", "train": f"http://127.0.0.1:{t_port}"}


def post(client: httpx.Client, url: str, entries: list[dict]) -> None:
    r = client.post(f"{url}/add_training_data_bulk", json={"entries": entries})
    if r.status_code != 202:
        raise RuntimeError(f"{url}/add_training_data_bulk: {r.status_code} {r.text[:200]}")


def retrain_ours(admin_url: str) -> dict:
    """The retrain flow's core on what the router holds: fetch, prepare (feature set 1), fit, gate, publish."""
    cfg = TrainingConfig(feature_set=1)
    estimate = ProfileEstimator(load_profile_dir(PROFILE_DIR))
    with RouterAdminClient(admin_url, token=TOKEN) as admin:
        samples = [s for page in admin.iter_sample_pages() for s in page["samples"]]
        prepared = prepare_samples(samples, cfg, estimate=estimate)
        t0 = time.perf_counter()
        models = fit_all(prepared, cfg)
        fit_s = time.perf_counter() - t0
        cand = decide_candidate(models, prepared, cfg, version="llmd-bench-1", created_at_s=time.time(),
                                current_document=None, current_version=None, estimate=estimate, force=False)
        if cand.decision.code == "publish":
            admin.publish(cand.document)
    return {"samples": len(samples), "fit_s": round(fit_s, 2), "gate": cand.decision.code,
            "gate_reason": cand.decision.reason, "kept_estimate": list(cand.kept_estimate)}


def wait_theirs_trained(train_url: str, pred_url: str, posted_at_s: float, *, timeout_s: float = 300.0) -> float:
    """Seconds until llm-d's training server wrote models after `posted_at_s` and the prediction server loaded them."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        infos = [httpx.get(f"{train_url}/model/{m}/info", timeout=10).json() for m in ("ttft", "tpot")]
        if all(i.get("exists") and _mtime(i) > posted_at_s + 1.0 for i in infos):
            r = httpx.post(f"{pred_url}/reload", timeout=60).json()
            if r.get("is_ready"):
                return time.monotonic() - t0
        time.sleep(1.0)
    raise RuntimeError(f"llm-d's training server wrote no model within {timeout_s:.0f} s of the last post "
                       "(at 04e44cd8 it never retrains without upstream PR #81's fix)")


def _mtime(info: dict) -> float:
    for key in ("last_modified", "modified_at", "mtime"):
        if key in info and info[key] is not None:
            v = info[key]
            return float(v) if isinstance(v, (int, float)) else _iso_s(v)
    return 0.0


def _iso_s(text: str) -> float:
    from datetime import datetime, timezone

    t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def replay(client: httpx.Client, servers: dict, held: list[dict], times_s: list[float], *, paced: bool) -> dict:
    """The held-out rows in trace time: each chunk of CHUNK rows predicted in one strict bulk call when its
    first request arrives, then posted as training rows (paced: at the trace's own speed, so a server that
    retrains every second sees the outcomes as a deployed one would)."""
    out = {"ttft": [], "tpot": []}
    wall0, trace0 = time.monotonic(), times_s[0]
    for k in range(0, len(held), CHUNK):
        if paced:
            time.sleep(max(0.0, (times_s[k] - trace0) - (time.monotonic() - wall0)))
        chunk = held[k:k + CHUNK]
        rows = [{f: v for f, v in e.items() if not f.startswith("actual_")} for e in chunk]
        r = client.post(f"{servers['pred']}/predict/bulk/strict", json={"requests": rows})
        r.raise_for_status()
        for e, p in zip(chunk, r.json()["predictions"]):
            target = "ttft" if e["actual_ttft_ms"] > 0 else "tpot"
            out[target].append((e[f"actual_{target}_ms"], p[f"{target}_ms"], e["num_request_waiting"]))
        post(client, servers["train"], chunk)
    return out


def load_phase(client: httpx.Client, servers: dict, held: list[dict], *, seconds: float, calls_per_s: float,
               rows_per_post: int) -> dict:
    """An EPP-shaped load: `calls_per_s` strict bulk calls of CHUNK rows (one per scheduling decision at 100
    candidate pods) while another thread posts `rows_per_post` training rows every second."""
    import threading

    stop = threading.Event()
    rng = np.random.default_rng(0)

    def poster() -> None:
        with httpx.Client(timeout=60) as c:
            k = 0
            while not stop.wait(1.0):
                post(c, servers["train"], held[k:k + rows_per_post] or held[:rows_per_post])
                k = (k + rows_per_post) % len(held)

    thread = threading.Thread(target=poster, daemon=True)
    thread.start()
    latencies, server_ms = [], []
    t_end = time.monotonic() + seconds
    next_at = time.monotonic()
    try:
        while time.monotonic() < t_end:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1.0 / calls_per_s
            idx = rng.integers(0, len(held), CHUNK)
            rows = [{f: v for f, v in held[i].items() if not f.startswith("actual_")} for i in idx]
            t0 = time.perf_counter()
            r = client.post(f"{servers['pred']}/predict/bulk/strict", json={"requests": rows})
            latencies.append((time.perf_counter() - t0) * 1000.0)
            r.raise_for_status()
            server_ms.append(float(r.json()["processing_time_ms"]))
    finally:
        stop.set()
        thread.join(timeout=30)
    return latency_figures(latencies, server_ms) | {"calls_per_s": calls_per_s, "training_rows_per_s": rows_per_post}


def figures(rows: list[tuple]) -> dict:
    y, p, q = (np.array(c, dtype=float) for c in zip(*rows)) if rows else (np.array([]),) * 3

    def score(mask: np.ndarray) -> dict:
        if not mask.any():
            return {"n": 0}
        d = y[mask] - p[mask]
        return {"n": int(mask.sum()), "p90_coverage": round(float(np.mean(y[mask] <= p[mask])), 4),
                "p90_loss": round(float(np.mean(np.maximum(QUANTILE * d, (QUANTILE - 1) * d) / y[mask])), 5),
                "p90_loss_ms": round(float(np.mean(np.maximum(QUANTILE * d, (QUANTILE - 1) * d))), 3)}

    out = score(np.ones(y.size, dtype=bool))
    out["strata"] = {name: score((q >= lo) & (q <= (np.inf if hi is None else hi)))
                     for name, (lo, hi) in STRATA.items()}
    return out


def latency_figures(ms: list[float], server_ms: list[float]) -> dict:
    a, s = np.array(ms), np.array(server_ms)
    return {"calls": int(a.size), "rows_per_call": CHUNK, "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "max_ms": round(float(a.max()), 2),
            "over_deadline": int((a > DEADLINE_MS).sum()),
            "server_processing_p50_ms": round(float(np.percentile(s, 50)), 2),
            "server_processing_p99_ms": round(float(np.percentile(s, 99)), 2)}


def run_server(name: str, start, entries: list[dict], held: list[dict], times_s: list[float], retrain, *,
               paced: bool, load_s: float) -> dict:
    """Start a server pair, post the older rows, train (retrain(servers, posted_at_s)), replay the held-out
    rows (quality), then an EPP-shaped load (latency)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-llmd-{name}-") as tmp:
        servers = start(Path(tmp))
        try:
            with httpx.Client(timeout=60) as client:
                t0 = time.perf_counter()
                for k in range(0, len(entries), 1000):
                    post(client, servers["train"], entries[k:k + 1000])
                trained = retrain(servers, time.time())
                setup_s = time.perf_counter() - t0
                preds = replay(client, servers, held, times_s, paced=paced)
                status = client.get(f"{servers['pred']}/status").json()
                latency = load_phase(client, servers, held, seconds=load_s, calls_per_s=20.0, rows_per_post=50)
        finally:
            for p in servers["procs"]:
                p.terminate()
                p.wait(timeout=30)
    return {"model_type": status.get("model_type"), "training": trained, "setup_s": round(setup_s, 1),
            "ttft": figures(preds["ttft"]), "tpot": figures(preds["tpot"]), "bulk_latency": latency}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples-cache", type=Path, help="bench_retrain's samples cache folder (re-simulates without)")
    ap.add_argument("--max-samples", type=int, default=30_000, help="newest samples used (default: %(default)s)")
    ap.add_argument("--llmd-checkout", type=Path, help="a checkout of llm-d/llm-d-latency-predictor (theirs)")
    ap.add_argument("--llmd-python", help="the Python of an environment with its requirements.txt")
    ap.add_argument("--quick", action="store_true", help="5-minute window, no JSON written")
    args = ap.parse_args(argv)
    sc = next(s for s in SCENARIOS if s["name"].startswith(SCENARIO))
    recordings, info, _, _ = samples_cached(sc, quick=args.quick, cache_dir=args.samples_cache)
    samples = sorted(recordings["at_dispatch"], key=lambda s: s["recorded_at_s"])[-args.max_samples:]
    kept = [s for s in samples if s["observed_ms"] > 0]
    entries, times_s = [entry_of(s) for s in kept], [float(s["recorded_at_s"]) for s in kept]
    cut = int(len(entries) * 0.8)
    older, held, held_times = entries[:cut], entries[cut:], times_s[cut:]
    paced, load_s = not args.quick, (10.0 if args.quick else 60.0)
    result = {"what": __doc__.split("\n\n")[0], "scenario": sc["name"], "load_model": info["load_model"],
              "lifecycle": "both endpoints named at dispatch (as llm-d's EPP picks)", "rows_posted": len(older),
              "rows_held_out": len(held), "chunk_rows": CHUNK, "deadline_ms": DEADLINE_MS,
              "replay": "paced at the trace's own speed" if paced else "as fast as the servers answer (quick)",
              "held_out_trace_s": round(held_times[-1] - held_times[0], 1),
              "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                          "loadavg_1m_start": round(os.getloadavg()[0], 2)}, "servers": {}}
    result["servers"]["sla-planner"] = run_server(
        "ours", start_ours, older, held, held_times, lambda servers, at: retrain_ours(servers["admin"]),
        paced=paced, load_s=load_s)
    if args.llmd_checkout:
        python = args.llmd_python or sys.executable
        result["servers"]["llm-d 04e44cd8 (+PR #81 fix)"] = run_server(
            "theirs", lambda tmp: start_theirs(args.llmd_checkout, python, tmp), older, held, held_times,
            lambda servers, at: {"waited_s": round(wait_theirs_trained(servers["train"], servers["pred"], at), 1)},
            paced=paced, load_s=load_s)
    result["machine"]["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps({k: s["training"] for k, s in result["servers"].items()}))
    print(table(result))
    if not args.quick:
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {OUT}")
    return 0


def table(result: dict) -> str:
    lines = [f"{result['scenario']} ({result['load_model']}), {result['rows_posted']} rows posted, "
             f"{result['rows_held_out']} replayed in calls of {result['chunk_rows']} rows",
             "| server | model | TTFT p90 coverage | TTFT p90 loss | TPOT p90 coverage | TPOT p90 loss | "
             "bulk p50 / p99 / max ms | over 400 ms |", "|---|---|---|---|---|---|---|---|"]
    for name, s in result["servers"].items():
        b = s["bulk_latency"]
        lines.append(f"| {name} | {s['model_type']} | {s['ttft']['p90_coverage']:.1%} | {s['ttft']['p90_loss']:.4f} | "
                     f"{s['tpot']['p90_coverage']:.1%} | {s['tpot']['p90_loss']:.4f} | "
                     f"{b['p50_ms']} / {b['p99_ms']} / {b['max_ms']} | {b['over_deadline']}/{b['calls']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
