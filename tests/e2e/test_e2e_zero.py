"""Scale to zero and back on a live Dynamo 1.6.1 fleet: Dynamo's own frontend and mocker workers, our executor.

Real processes on 127.0.0.1: etcd, Prometheus (scraping the frontend and the
waker every second), Prefect's test server, Dynamo 1.6.1's frontend, the fleet
executor (Dynamo's VirtualConnectorClient, one prefill and one decode mocker
to start) and the waker in front of the frontend. The planner flow runs every
10 s as the scheduled runs would, on the frontend's real counters through
Prometheus and the virtual connector's etcd keys: after two requests and 20 s
without another (decision.scale_to_zero.quiet_s) it takes both pools to zero
(the mocker starts in about a second, inside the 2 s TTFT target, so a cold
start costs no late request). The executor stops the workers and the frontend
forgets the model (404). A request to the waker is then held; the watcher
(`sla-planner watch --wake-run`) reads it through Prometheus and runs
the wake flow, whose decision the executor carries out; the waker sends the
request again until the frontend serves it. The client sees one answer: 200,
its TTFT the wake's whole cost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
import yaml

from flows.config import load_run_config
from planner_cli.stack_dynamo import planner_overrides
from tests.conftest import PROJECT_ROOT
from tests.support.fixtures_dynamo import DynamoFleet, dynamo_python  # noqa: F401
from tests.support.fixtures_net import free_port, stop_process, wait_http_ok

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 10.0


def chat(url: str, *, timeout_s: float = 120.0, model: str = "tok") -> tuple[int, float, dict | None]:
    """(HTTP status, seconds to the first streamed byte, the last data event) of one streaming chat completion."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "wake up please"}],
                       "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"content-type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            first = resp.read(1)
            ttft = time.monotonic() - t0
            rest = (first + resp.read()).decode()
            events = [json.loads(line[6:]) for line in rest.splitlines()
                      if line.startswith("data: ") and line.strip() != "data: [DONE]"]
            return resp.status, ttft, events[-1] if events else None
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - t0, None


@pytest.fixture
def live(dynamo_python, etcd, prometheus_server, prefect_harness, h200_profile_dir, tmp_path):  # noqa: F811
    ns = f"zero{uuid.uuid4().hex[:6]}"
    fleet = DynamoFleet(python=dynamo_python, etcd_url=etcd.url, base_dir=tmp_path / "fleet", namespace=ns,
                        drain_timeout_s=10, restart_backoff_s=0.5)
    waker_port = free_port()
    waker = None
    try:
        fleet.start_frontend()
        fleet.start_executor()
        fleet.wait_served(timeout_s=60)
        with (tmp_path / "waker.log").open("ab") as log:
            waker = subprocess.Popen(
                [sys.executable, "-m", "executor.waker", "--frontend-url", fleet.url, "--port", str(waker_port),
                 "--model", "tok", "--hold-timeout-s", "120"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT)
        wait_http_ok(f"http://127.0.0.1:{waker_port}/healthz", timeout_s=30, proc=waker,
                     log_path=tmp_path / "waker.log", what="waker")
        prometheus_server.add_scrape_target(f"127.0.0.1:{fleet.http_port}", labels={"fleet": ns})
        prometheus_server.add_scrape_target(f"127.0.0.1:{waker_port}", labels={"fleet": ns})
        for role in ("prefill", "decode"):  # slot 0's metrics port: the worker each pool starts first
            port = fleet.config.roles[role].system_port_base
            prometheus_server.add_scrape_target(f"127.0.0.1:{port}", labels={"fleet": ns, "role": role})

        data = load_run_config(PROJECT_ROOT / "configs" / "planner.yaml").model_dump(mode="json", exclude_none=True)
        data["planner"].update(namespace=ns, model_id="tok", adjustment_interval_s=INTERVAL_S)
        data["planner"]["profile"] = {"dir": str(h200_profile_dir)}
        data["planner"]["slo"]["ttft_ms"] = 2000.0
        data["planner"]["sizing"]["replica_startup_s"] = 2.0
        data["planner"]["decision"].update(
            allow_scale_to_zero=True, prefill={"min_replicas": 0, "max_replicas": 2},
            decode={"min_replicas": 0, "max_replicas": 2}, scale_down_min_history_intervals=0,
            scale_to_zero={"quiet_s": 2 * INTERVAL_S})
        data["metrics"] = {"prometheus_url": prometheus_server.url}
        data["connector"] = {"kind": "virtual", "etcd_url": etcd.url}
        planner_overrides(data, namespace=ns, max_workers=2)
        data["metrics"]["queries"] = {"wake_requests": f'sum(sla_planner_waker_held_requests{{fleet="{ns}"}})'}
        data["metrics"]["frontend_selector"] = f'model="tok",fleet="{ns}"'
        data["metrics"]["worker_selector"] = f'fleet="{ns}"'
        data["planner"]["fast_path"] = {"poll_s": 0.5}  # the watcher's poll (the fast path itself stays off)
        (tmp_path / "planner.yaml").write_text(yaml.safe_dump(data))
        cfg = load_run_config(tmp_path / "planner.yaml")
        yield fleet, f"http://127.0.0.1:{waker_port}", cfg, prometheus_server, tmp_path / "planner.yaml"
    finally:
        if waker is not None:
            stop_process(waker)
        fleet.close()


def test_a_pool_scaled_to_zero_after_quiet_is_woken_by_a_request_and_serves_it(live):
    from flows.planner_flow import planner_flow
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from planner_cli.main import main
    from connectors.factory import make_connector
    from connectors.prometheus import PrometheusCollector

    fleet, waker_url, cfg, prom, cfg_path = live
    t_start = time.monotonic()
    # One request through the waker, served at once (its series now exist in Prometheus).
    status, _, last = chat(waker_url)
    assert status == 200 and last["usage"]["completion_tokens"] == 8
    prom.wait_for_series(f'dynamo_frontend_requests_started_total{{fleet="{cfg.planner.namespace}"}}',
                         timeout_s=30)
    # A counter's first sample already holds the request that created it, so increase() never counts that one:
    # a second request is the one the planner sees, and the quiet period starts after it.
    status, _, _ = chat(waker_url)
    t_last = time.monotonic()
    assert status == 200

    # Scheduled runs every 10 s until one takes both pools to zero (quiet 20 s).
    runs = []
    while True:
        state = planner_flow(config=cfg, return_state=True)
        assert state.is_completed(), state.message
        decision = state.result()["decision"]
        runs.append((state.name, decision))
        if (decision["prefill_replicas"], decision["decode_replicas"]) == (0, 0):
            break
        assert len(runs) < 8, runs
        time.sleep(INTERVAL_S)
    assert time.monotonic() - t_last >= 20.0
    print("\n".join(f"run {k}: {[r['code'] for r in d['reasons']]}" for k, (_, d) in enumerate(runs)))
    assert all(min(d["prefill_replicas"], d["decode_replicas"]) >= 1 for _, d in runs[:-1])
    zero = next(r for r in decision["reasons"] if r["code"] == "scale_to_zero" and r["pool"] == "decode")
    # The numbers that decided: quiet long enough, a cold start within the TTFT target (no late request).
    assert zero["numbers"]["quiet_s"] >= 20.0 and zero["numbers"]["cold_start_cost_gpu_h"] == 0.0
    assert zero["numbers"]["saved_gpu_h"] > 0.0
    fleet.wait_for(lambda: not fleet.workers(), timeout_s=40, what="both workers stopped")
    fleet.wait_for(lambda: not fleet.model_served(), timeout_s=20, what="the frontend to forget the model")
    direct, _, _ = chat(fleet.url)
    assert direct == 404  # Dynamo's frontend at zero: the model is gone, and it counts the request nowhere
    # The waker holds only its own models: another name gets the frontend's 404 at once, and is not counted held.
    other, other_s, _ = chat(waker_url, model="not-served")
    assert other == 404 and other_s < 5.0
    assert json.loads(urllib.request.urlopen(f"{waker_url}/healthz").read())["held"] == 0
    t_zero = time.monotonic()

    # `sla-planner watch --wake-run` itself, polling every 0.5 s for 30 s, beside the client.
    connector = make_connector(cfg.connector, default_namespace=cfg.planner.namespace)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(main(
        ["watch", "--config", str(cfg_path), "--polls", "60", "--wake-run"])), daemon=True)
    thread.start()
    status, ttft_s, last = chat(waker_url)
    assert status == 200 and last["usage"]["completion_tokens"] == 8
    with get_client(sync_client=True) as client:
        wakes = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sla-planner-wake"])))
    assert len(wakes) == 1 and wakes[0].name.endswith("wake prefill 0→1 decode 0→1"), [w.name for w in wakes]
    # Held while the wake ran: Prometheus scrape (1 s) + watcher poll (0.5 s) + the wake run + the mocker's
    # start (~1 s) + the waker's retry (0.25 s).
    assert 1.0 < ttft_s < 30.0, ttft_s
    counts = json.loads(urllib.request.urlopen(f"{waker_url}/healthz").read())
    assert counts["held"] == 1 and counts["passed"] == 3 and counts["holding"] == 0  # 2 served + the other model
    fleet.wait_for(lambda: len(fleet.workers()) == 2, timeout_s=20, what="both workers running")

    # The next scheduled runs measure each pool's startup from that wake: its decision (the connector's applied
    # decisions) against the workers reporting (Prometheus, every second here).
    measured = None
    for _ in range(6):
        time.sleep(INTERVAL_S)
        state = planner_flow(config=cfg, return_state=True)
        assert state.is_completed(), state.message
        measured = next((r["numbers"] for r in state.result()["decision"]["reasons"]
                         if r["code"] in ("scale_to_zero", "kept_above_zero") and "startup_s" in r["numbers"]), None)
        if measured is not None:
            break
    fl = connector.read_fleet(now_s=time.time())
    with PrometheusCollector(cfg.metrics) as collector:
        ready = collector.ready_history(now_s=time.time(), window_s=600, step_s=1.0)
    assert measured is not None and measured["startup_measured"] == 1.0, (measured, fl.applied_targets, ready,
                                                                         prom.query(f'up{{fleet="{cfg.planner.namespace}"}}'))
    assert 0.0 < measured["startup_s"] < 15.0, measured
    thread.join(timeout=60)
    assert exit_codes == [0]
    print(f"\nzero {t_zero - t_last:.1f} s after the last request ({len(runs)} planner runs, {t_zero - t_start:.1f} s "
          f"from the start); woken request TTFT {ttft_s:.2f} s; measured startup {measured['startup_s']:.1f} s")
