"""The live fleet (sim.live) on its own, against a real etcd and a real routing service.

The fleet's clock is stepped by hand here (no threads, no sleeping for the
simulation), so every expectation is exact: a decision's new workers serve
`startup_s` after the fleet saw it, and `scaled_decision_id` appears only then.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from etcd3gw.client import Etcd3Client
from prometheus_client.parser import text_string_to_metric_families

from connectors.config import PoolMapping, VirtualConnectorConfig
from connectors.virtual import VirtualConnector
from planner.types import Decision
from routing.http.app import create_app
from routing.config import RouterConfig
from sim.live.config import LiveConfig, make_tables
from sim.live.fleet import LiveFleet
from workloads.trace_shaping import TraceSegment, build_trace, shaped_trace
from workloads.traces import load_trace, time_window
from tests.support.fixtures_net import free_port
from tests.support.fixtures_routing import TOKEN, RunningServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "data" / "traces" / "azure2023_conv.csv.gz"
PROFILE = ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"
STARTUP_S = 5.0


@pytest.mark.parametrize("segments, expected", [
    pytest.param([(30.0, 1.0)], lambda n: (n[0], n[0]), id="one window as recorded: exactly its requests"),
    pytest.param([(30.0, 1.0), (30.0, 3.0)], lambda n: (n[0] + 3 * n[1] - 40, n[0] + 3 * n[1]),
                 id="second window x3: 3 copies, minus copies jittered past its end (< 40)"),
])
def test_shaped_trace_is_consecutive_real_windows_with_their_multipliers(segments, expected):
    source = load_trace(TRACE)
    counts = [len(time_window(source, 600.0 + sum(d for d, _ in segments[:i]),
                              600.0 + sum(d for d, _ in segments[: i + 1]))) for i in range(len(segments))]
    trace = shaped_trace(source, [TraceSegment(duration_s=d, load_multiplier=k) for d, k in segments],
                         start_s=600.0, seed=0)
    lo, hi = expected(counts)
    assert lo <= len(trace) <= hi
    assert trace.arrival_s.min() >= 0 and trace.arrival_s.max() < sum(d for d, _ in segments)
    assert np.all(np.diff(trace.arrival_s) >= 0)
    # The first window keeps its real requests untouched.
    first = time_window(source, 600.0, 630.0)
    assert np.array_equal(trace.isl_tokens[: len(first)], first.isl_tokens)


def test_shape_window_past_the_trace_end_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"shape\[1\]: .* no requests in \[3510, 3570\) s \(it lasts 3502 s\)"):
        shaped_trace(load_trace(TRACE), [TraceSegment(duration_s=30.0), TraceSegment(duration_s=60.0)],
                     start_s=3480.0, seed=0)


class ManualClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def router():
    app = create_app(RouterConfig(profile_dir=str(PROFILE)), token=TOKEN)
    with RunningServer(app) as server:
        yield server


def live_fleet(etcd_url: str, namespace: str, router_url: str, *, seconds: float = 20.0) -> tuple[LiveFleet, ManualClock]:
    cfg = LiveConfig(
        trace_path=str(TRACE), trace_start_s=600.0, shape=[TraceSegment(duration_s=seconds, load_multiplier=2.0)],
        profile_dir=str(PROFILE), startup_s=STARTUP_S, port=free_port(), namespace=namespace,
        etcd_url=etcd_url, router_url=router_url,
    )
    clock = ManualClock()
    fleet = LiveFleet(cfg, trace=build_trace(cfg), tables=make_tables(cfg), clock=clock, token=TOKEN)
    return fleet, clock


def scaled_id(etcd_server, namespace: str) -> int | None:
    client = Etcd3Client(host="127.0.0.1", port=etcd_server.client_port, timeout=5)
    values = client.get(f"v1/{namespace}/planner/scaled_decision_id")
    return int(values[0]) if values else None


def test_decision_starts_workers_after_the_startup_delay_then_is_confirmed(etcd, etcd_namespace, router):
    fleet, _ = live_fleet(etcd.url, etcd_namespace, router.url)
    planner = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace))
    try:
        fleet.step(2.0)
        planner.apply(Decision(prefill_replicas=3, decode_replicas=2, apply=True, reasons=()), now_s=time.time())
        fleet.follow_etcd()  # sees decision 0 (Dynamo's first id) at t = 2 s
        workers = fleet.status()["workers"]
        assert (workers["prefill"]["ready"], workers["prefill"]["starting"]) == (1, 2)
        assert (workers["decode"]["ready"], workers["decode"]["starting"]) == (1, 1)
        fleet.step(2.0 + STARTUP_S - 0.01)
        fleet.follow_etcd()
        assert scaled_id(etcd, etcd_namespace) is None, "confirmed before the new workers serve"
        assert planner.read_fleet(now_s=time.time()).prefill.ready_replicas == 1

        fleet.step(2.0 + STARTUP_S)  # ready at 2 + 5 = 7 s
        assert scaled_id(etcd, etcd_namespace) == 0
        fleet_state = planner.read_fleet(now_s=time.time())
        assert (fleet_state.prefill.ready_replicas, fleet_state.decode.ready_replicas) == (3, 2)
        assert fleet_state.last_decision.done

        # Scale-down: draining workers stop taking work at once, so it is confirmed at once.
        planner.apply(Decision(prefill_replicas=1, decode_replicas=1, apply=True, reasons=()), now_s=time.time())
        fleet.follow_etcd()
        assert scaled_id(etcd, etcd_namespace) == 1
        fleet.router.sync_endpoints()
        registered = {e["id"] for e in router_get(router, "/v1/endpoints")}
        assert len(registered) == 2 and all(re.fullmatch(r"sim-(prefill|decode)-\d+", e) for e in registered)

        fleet.step(20.0 + 120.0)  # past the last arrival, everything drained
        status = fleet.status()
        assert status["finished"] and status["arrived"] == status["completed"] == len(fleet.trace)
        assert status["router"]["routed"] == len(fleet.trace) and not status["router"]["fallbacks"]
        assert [d["decision_id"] for d in status["decisions"]["log"]] == [0, 1]
    finally:
        fleet.close()


def test_router_down_requests_are_routed_locally_and_none_is_lost(etcd, etcd_namespace):
    app = create_app(RouterConfig(profile_dir=str(PROFILE)), token=TOKEN)
    server = RunningServer(app).__enter__()
    fleet, clock = live_fleet(etcd.url, etcd_namespace, server.url)
    try:
        fleet.step(5.0)
        routed_before = fleet.status()["router"]["routed"]
        assert routed_before > 0
        server.__exit__(None, None, None)
        clock.now_s = 1.0
        fleet.step(10.0)
        status = fleet.status()["router"]
        assert status["routed"] == routed_before
        assert status["fallbacks"].get("router unavailable", 0) > 0
        fleet.step(20.0 + 120.0)
        final = fleet.status()
        assert final["arrived"] == final["completed"] == len(fleet.trace)
        assert final["router"]["routed"] + sum(final["router"]["fallbacks"].values()) == len(fleet.trace)
    finally:
        fleet.close()


def test_metrics_carry_the_names_and_pods_the_planner_reads(etcd, etcd_namespace, router):
    fleet, _ = live_fleet(etcd.url, etcd_namespace, router.url)
    try:
        fleet.step(10.0)
        families = {f.name: f for f in text_string_to_metric_families(fleet.metrics_text().decode())}
        arrived = fleet.status()["arrived"]
        # Dynamo 1.6.1's two counters: accepted at arrival, processed at completion (with its status).
        started = next(s for s in families["dynamo_frontend_requests_started"].samples if s.name.endswith("_total"))
        assert started.value == arrived
        finished = next(s for s in families["dynamo_frontend_requests"].samples if s.name.endswith("_total"))
        assert finished.labels["status"] == "success"
        assert finished.value == fleet.status()["completed"] < arrived
        for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds", "input_sequence_tokens",
                     "output_sequence_tokens"):
            assert f"dynamo_frontend_{hist}" in families, sorted(families)
        isl_count = next(s for s in families["dynamo_frontend_input_sequence_tokens"].samples
                         if s.name.endswith("_count"))
        assert isl_count.value == arrived
        pools = PoolMapping()
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"):
            pods = {s.labels["pod"] for s in families[name].samples}
            assert pods == {"sim-prefill-0", "sim-decode-0"}
            assert all(re.search(pools.prefill_pod_regex, p) or re.search(pools.decode_pod_regex, p) for p in pods)
        assert all(0.0 <= s.value <= 1.0 for s in families["vllm:kv_cache_usage_perc"].samples)
    finally:
        fleet.close()


def router_get(server: RunningServer, path: str):
    import httpx

    return httpx.get(server.url + path, timeout=10).json()
