"""The planner's own gauges: served over HTTP and scraped as text, or pushed."""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from connectors.config import PlannerMetricsConfig
from connectors.planner_metrics import PlannerMetrics, publish_run, stop_endpoints
from planner.types import Corrections, Decision, DecisionRecord, FleetState, Forecast, Observation, PoolState
from tests.support.fixtures_net import free_port

NOW_S = 1_700_000_000.0


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from a /metrics endpoint."""
    resp = requests.get(url, timeout=5)
    resp.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def labels(pool: str | None = None) -> tuple:
    items = {"namespace": "dyn", "model": "llama"}
    if pool:
        items["pool"] = pool
    return tuple(sorted(items.items()))


def one_run(metrics: PlannerMetrics) -> None:
    fleet = FleetState(prefill=PoolState(2, 1), decode=PoolState(4, 4),
                       last_decision=DecisionRecord(6, NOW_S - 60, 2, 4, done=False))
    metrics.update(
        now_s=NOW_S,
        decision=Decision(prefill_replicas=3, decode_replicas=5, apply=True, reasons=()),
        applied=DecisionRecord(7, NOW_S, 3, 5, done=False),
        fleet=fleet,
        forecast=Forecast(num_requests=120.0, avg_isl_tokens=3000.0, avg_osl_tokens=150.0,
                          num_requests_p90=150.0, predictor="kalman"),
        corrections=Corrections(prefill=1.25, decode=0.8),
        observation=Observation(taken_at_s=NOW_S, interval_s=60.0, num_requests=110.0, avg_isl_tokens=2900.0,
                                avg_osl_tokens=140.0, avg_ttft_ms=180.0, avg_itl_ms=None),
    )


def test_served_metrics_carry_the_run():
    metrics = PlannerMetrics(namespace="dyn", model_id="llama")
    one_run(metrics)
    server = metrics.serve(port=0, addr="127.0.0.1")
    try:
        got = scrape(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()

    expected = {
        ("sla_planner_desired_replicas", labels("prefill")): 3,
        ("sla_planner_desired_replicas", labels("decode")): 5,
        ("sla_planner_current_replicas", labels("prefill")): 2,
        ("sla_planner_ready_replicas", labels("prefill")): 1,
        ("sla_planner_current_replicas", labels("decode")): 4,
        ("sla_planner_last_decision_id", labels()): 7,        # the applied record wins over fleet's 6
        ("sla_planner_last_decision_done", labels()): 0,
        ("sla_planner_last_decision_applied", labels()): 1,
        ("sla_planner_correction_factor", labels("prefill")): 1.25,
        ("sla_planner_correction_factor", labels("decode")): 0.8,
        ("sla_planner_predicted_requests", labels()): 120,
        ("sla_planner_predicted_requests_p90", labels()): 150,
        ("sla_planner_predicted_isl_tokens", labels()): 3000,
        ("sla_planner_predicted_osl_tokens", labels()): 150,
        ("sla_planner_observed_requests", labels()): 110,
        ("sla_planner_observed_ttft_ms", labels()): 180,
        ("sla_planner_observation_stale", labels()): 0,
        ("sla_planner_last_run_timestamp_seconds", labels()): NOW_S,
    }
    assert {k: got[k] for k in expected} == expected
    assert math.isnan(got[("sla_planner_observed_itl_ms", labels())])  # no data: NaN, not a stale number
    assert ("sla_planner_observed_ttft_target_met_ratio", labels()) not in got  # no targets given: never set


def test_target_met_gauges_read_the_frontends_histograms_as_the_decision_table_does():
    """The shares within the TTFT and ITL targets, from the observation's histograms; NaN where one was not read."""
    import dataclasses

    from planner.config import SloTarget
    from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, share_within, ttft_histogram_of

    ttft = ttft_histogram_of([0.05] * 90 + [0.15] * 6 + [0.9] * 4)
    obs = Observation(taken_at_s=NOW_S, interval_s=60.0, num_requests=100.0, avg_isl_tokens=900.0,
                      avg_osl_tokens=140.0, avg_ttft_ms=90.0, avg_itl_ms=6.0, ttft_histogram=ttft)
    metrics = PlannerMetrics(namespace="dyn", model_id="llama")
    slo = SloTarget(ttft_ms=200, itl_ms=10)
    metrics.update(now_s=NOW_S, observation=obs, slo=slo)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    ttft_met = got[("sla_planner_observed_ttft_target_met_ratio", labels())]
    assert ttft_met == pytest.approx(share_within(ttft, 0.2).share) and 0.90 < ttft_met < 0.96
    assert math.isnan(got[("sla_planner_observed_itl_target_met_ratio", labels())])  # not read: NaN
    gaps = ttft_histogram_of([0.004] * 99 + [0.05], DYNAMO_ITL_BOUNDS_S)
    metrics.update(now_s=NOW_S + 60, observation=dataclasses.replace(obs, itl_histogram=gaps), slo=slo)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert got[("sla_planner_observed_itl_target_met_ratio", labels())] == pytest.approx(0.99)
    assert math.isnan(got[("sla_planner_observed_ttft_target_met_window_ratio", labels())])  # no window read
    from planner.types import LatencyWindow

    window = LatencyWindow(1800.0, ttft_histogram_of([0.05] * 199 + [0.9]), gaps)
    metrics.update(now_s=NOW_S + 120, observation=dataclasses.replace(obs, slo_window=window), slo=slo)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert got[("sla_planner_observed_ttft_target_met_window_ratio", labels())] == pytest.approx(0.995)
    assert got[("sla_planner_observed_itl_target_met_window_ratio", labels())] == pytest.approx(0.99)


def test_skipped_run_keeps_last_decision_and_reports_not_applied():
    metrics = PlannerMetrics(namespace="dyn", model_id="llama")
    one_run(metrics)
    fleet = FleetState(prefill=PoolState(3, 3), decode=PoolState(5, 5),
                       last_decision=DecisionRecord(7, NOW_S, 3, 5, done=True))
    metrics.update(now_s=NOW_S + 60, decision=Decision(3, 5, apply=True, reasons=()), applied=None, fleet=fleet)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert got[("sla_planner_last_decision_applied", labels())] == 0
    assert got[("sla_planner_last_decision_id", labels())] == 7
    assert got[("sla_planner_last_decision_done", labels())] == 1
    assert got[("sla_planner_ready_replicas", labels("prefill"))] == 3


def test_registries_are_private():
    a = PlannerMetrics(namespace="a", model_id="m")
    b = PlannerMetrics(namespace="b", model_id="m")  # same names, no "Duplicated timeseries" error
    a.update(now_s=NOW_S, decision=Decision(1, 1, apply=True, reasons=()))
    assert b'namespace="a"' in a.render()
    assert b'namespace="a"' not in b.render()
    assert b"sla_planner_" not in generate_latest(REGISTRY)  # the process-global registry is untouched


class _Capture(BaseHTTPRequestHandler):
    received: list = []

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, body.decode()))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_push_sends_the_group_to_the_gateway_api():
    # No Pushgateway binary here: a stdlib server records what the client sends.
    _Capture.received = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        metrics = PlannerMetrics(namespace="dyn", model_id="llama")
        one_run(metrics)
        metrics.push(gateway_url=f"http://127.0.0.1:{httpd.server_address[1]}", job="planner")
    finally:
        httpd.shutdown()
        httpd.server_close()
    ((path, body),) = _Capture.received
    assert path == "/metrics/job/planner/model/llama/namespace/dyn"
    assert 'sla_planner_desired_replicas{model="llama",namespace="dyn",pool="decode"} 5.0' in body


def test_push_to_nowhere_is_a_connection_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=rf"Pushgateway {url} \(job sla-planner\)"):
        PlannerMetrics(namespace="dyn", model_id="llama").push(gateway_url=url, timeout_s=2)


def plan_result(*, prefill: int, decode: int, taken_at_s: float):
    from planner.pipeline import PlanResult

    return PlanResult(
        observation=Observation(taken_at_s=taken_at_s, interval_s=60.0, num_requests=50.0, avg_isl_tokens=1000.0,
                                avg_osl_tokens=100.0, avg_ttft_ms=150.0, avg_itl_ms=8.0,
                                stale_reasons=("prometheus: example",)),
        fleet=FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1)),
        corrections=Corrections(prefill=1.1, decode=0.9),
        forecast=None,
        sizing={},
        saturation=None,
        decision=Decision(prefill_replicas=prefill, decode_replicas=decode, apply=True, reasons=()),
    )


def test_publish_run_serves_the_newest_run_per_namespace():
    port = free_port()
    cfg = PlannerMetricsConfig(enabled=True, port=port, addr="127.0.0.1")
    try:
        publish_run(cfg, result=plan_result(prefill=2, decode=3, taken_at_s=NOW_S), record=None, namespace="dyn",
                    model_id="llama")
        publish_run(cfg, result=plan_result(prefill=4, decode=6, taken_at_s=NOW_S + 60),
                    record=DecisionRecord(9, NOW_S + 60, 4, 6, done=False), namespace="dyn", model_id="llama")
        publish_run(cfg, result=plan_result(prefill=1, decode=1, taken_at_s=NOW_S + 60), record=None,
                    namespace="other", model_id="llama")
        got = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop_endpoints()

    assert got[("sla_planner_desired_replicas", labels("decode"))] == 6  # the second run replaced the first
    assert got[("sla_planner_last_decision_id", labels())] == 9
    assert got[("sla_planner_last_run_timestamp_seconds", labels())] == NOW_S + 60
    assert got[("sla_planner_observation_stale", labels())] == 1
    other = (("model", "llama"), ("namespace", "other"), ("pool", "decode"))
    assert got[("sla_planner_desired_replicas", other)] == 1


def test_publish_run_disabled_does_nothing():
    cfg = PlannerMetricsConfig(enabled=False, port=free_port())
    assert publish_run(cfg, result=plan_result(prefill=1, decode=1, taken_at_s=NOW_S), record=None,
                       namespace="dyn") is None
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{cfg.port}/metrics", timeout=2)
