"""The collector's llm-d and vllm-router sources against a real Prometheus holding real vLLM 0.32 scrapes.

vLLM's series are two real `/metrics` scrapes of vLLM 0.32.0's CPU build, every family as exported
(tests/support/fixtures_vllm.py): the kit's (idle, 67 completions) and ours (mid-load). Arrivals come from the
llm-d endpoint picker's counters, written with the names and label sets llm-d-router defines
(`llm_d_epp_request_total{model_name,target_model_name,fairness_id,priority}`, the error counter with
`error_code` too), or from our routing service's `router_requests_total{outcome,mode,tier}`. Every
expected value is the scrape file's numbers by hand.
"""

from __future__ import annotations

import pytest

from connectors.config import MetricsConfig, PoolMapping
from connectors.prometheus import PrometheusCollector
from tests.support.fixtures_prometheus import ANCHOR_S, OpenMetricsWriter, PrometheusServer
from tests.support.fixtures_vllm import (
    KIT_VLLM_METRICS, OWN_VLLM_METRICS, scrape_value, write_counter_rising, write_scrape_rising,
)

# Four hours after the other collector tests' data, so the backfilled blocks do not overlap theirs.
START_S = ANCHOR_S + 4 * 3600
INTERVAL_S = 60.0
END_S = START_S + INTERVAL_S
EPP_LABELS = {"model_name": "tiny-model", "target_model_name": "tiny-model", "priority": "0"}


@pytest.fixture(scope="module")
def llmd_data(prometheus_server: PrometheusServer) -> PrometheusServer:
    w = OpenMetricsWriter()

    def engine(namespace: str, scrape, pod: str = "ms-tiny-llm-d-modelservice-decode-6d9f", **labels: str) -> None:
        write_scrape_rising(w, scrape, labels={"namespace": namespace, "pod": pod, **labels}, start_s=START_S,
                            end_s=END_S)

    def epp(namespace: str, name: str, total: float, **labels: str) -> None:
        write_counter_rising(w, name=name, labels={**EPP_LABELS, "namespace": namespace, **labels}, total=total,
                             start_s=START_S, end_s=END_S)

    # The kit's engine behind an EPP that dispatched 50 + 17 requests (two fairness ids) and refused 5.
    engine("llmd-kit", KIT_VLLM_METRICS)
    epp("llmd-kit", "llm_d_epp_request_total", 50, fairness_id="tenant-a")
    epp("llmd-kit", "llm_d_epp_request_total", 17, fairness_id="tenant-b")
    epp("llmd-kit", "llm_d_epp_request_error_total", 5, fairness_id="tenant-a", error_code="ResourceExhausted")
    # Our loaded engine behind an EPP that refused nothing: no error series at all.
    engine("llmd-own", OWN_VLLM_METRICS)
    epp("llmd-own", "llm_d_epp_request_total", 260, fairness_id="default")
    # No EPP scraped: vLLM alone.
    engine("llmd-no-epp", KIT_VLLM_METRICS)
    # Our routing service in front of the loaded engine: 240 routed, 9 shed.
    engine("router-own", OWN_VLLM_METRICS)
    for outcome, total in (("routed", 240), ("shed", 9)):
        write_counter_rising(w, name="router_requests_total", total=total, start_s=START_S, end_s=END_S,
                             labels={"namespace": "router-own", "outcome": outcome, "mode": "aggregated",
                                     "tier": "headroom"})
    # Two aggregated engines (prefill and decode in one), labelled as the executor's scrape targets label them.
    engine("agg", OWN_VLLM_METRICS, pod="127.0.0.1:21500", role="aggregated")
    engine("agg", KIT_VLLM_METRICS, pod="127.0.0.1:21501", role="aggregated")
    prometheus_server.backfill(w.render())
    return prometheus_server


def collector(server: PrometheusServer, namespace: str, source: str) -> PrometheusCollector:
    return PrometheusCollector(MetricsConfig(
        source=source, prometheus_url=server.url, frontend_selector=f'namespace="{namespace}"',
        worker_selector=f'namespace="{namespace}"', frontend_targets_selector="",
    ))


def collect(server, namespace: str, source: str):
    with collector(server, namespace, source) as c:
        return c.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)


def test_llmd_arrivals_are_the_epps_dispatches_and_errors_tokens_and_latencies_vllms(llmd_data):
    obs = collect(llmd_data, "llmd-kit", "llm-d")
    # 50 + 17 dispatched (admitted and scheduled) + 5 refused: every one arrived.
    assert obs.num_requests == pytest.approx(72.0, rel=1e-9)
    # vLLM's per-request histograms in the kit's scrape: 25702 prompt and 6550 output tokens over 67 requests,
    # 49.848 s of TTFT over 67 first tokens, 170.747 s over 6483 token gaps.
    assert obs.avg_isl_tokens == pytest.approx(25702 / 67, rel=1e-9)
    assert obs.avg_osl_tokens == pytest.approx(6550 / 67, rel=1e-9)
    assert obs.avg_ttft_ms == pytest.approx(1e3 * 49.84811592102051 / 67, rel=1e-9)
    assert obs.avg_itl_ms == pytest.approx(1e3 * 170.74726452600362 / 6483, rel=1e-9)
    # the EPP's rate is flat over the interval: 72 / 60 s in every 15 s window
    assert obs.peak_rps == pytest.approx(72 / 60, rel=1e-6)
    assert obs.isl_histogram is not None and obs.isl_histogram.count == pytest.approx(67, rel=1e-9)
    assert obs.ttft_histogram is not None
    (pod,) = obs.pods
    assert (pod.pool, pod.kv_usage_frac, pod.queue_length) == ("decode", 0.0, 0.0)
    assert not obs.stale_reasons, obs.stale_reasons
    assert obs.notes[0].startswith("metrics source llm-d: arrivals from the llm-d endpoint picker "
                                   "(llm_d_epp_request_total + llm_d_epp_request_error_total)"), obs.notes


def test_llmd_without_errors_counts_dispatches_and_reads_a_loaded_engines_gauges(llmd_data):
    obs = collect(llmd_data, "llmd-own", "llm-d")
    assert obs.num_requests == pytest.approx(260.0, rel=1e-9)  # no error series: 260 + 0, not "no data"
    own = OWN_VLLM_METRICS
    assert obs.avg_isl_tokens == pytest.approx(34422 / 149, rel=1e-9)  # histogram, not prompt_tokens_total
    assert scrape_value(own, "vllm:prompt_tokens_total") == 134712  # counted at prefill: 100 requests still running
    assert obs.avg_ttft_ms == pytest.approx(1e3 * 44.43225288391113 / 249, rel=1e-9)
    (pod,) = obs.pods
    assert pod.kv_usage_frac == pytest.approx(0.05054945054945059, rel=1e-12)
    assert pod.queue_length == 0.0


def test_llmd_without_an_epp_counts_vllms_completions_and_says_so(llmd_data):
    obs = collect(llmd_data, "llmd-no-epp", "llm-d")
    # vllm:request_success_total over every finished_reason: 67 (length)
    assert obs.num_requests == pytest.approx(67.0, rel=1e-9)
    assert any("arrivals counted from queries.num_requests_fallback" in n and "metrics source llm-d" in n
               for n in obs.notes), obs.notes


def test_vllm_router_arrivals_are_every_route_call(llmd_data):
    obs = collect(llmd_data, "router-own", "vllm-router")
    assert obs.num_requests == pytest.approx(249.0, rel=1e-9)  # 240 routed + 9 shed
    assert obs.avg_osl_tokens == pytest.approx(10650 / 149, rel=1e-9)
    assert obs.notes[0].startswith("metrics source vllm-router: arrivals from the routing service's route calls")
    # the same data read as llm-d finds no EPP and falls back to vLLM's completions (149)
    assert collect(llmd_data, "router-own", "llm-d").num_requests == pytest.approx(149.0, rel=1e-9)


def test_a_query_set_in_the_config_replaces_the_sources_and_the_note_names_it():
    cfg = MetricsConfig.model_validate({"source": "llm-d", "queries": {"peak_rps": ""}})
    assert cfg.queries.peak_rps == ""
    assert cfg.queries.num_requests.startswith("sum(increase(llm_d_epp_request_total{")
    assert cfg.source_note().endswith("; queries set in the config: peak_rps")
    assert "dynamo_frontend" in MetricsConfig().queries.num_requests


def test_an_unknown_source_is_refused_naming_it():
    with pytest.raises(ValueError, match="source"):
        MetricsConfig.model_validate({"source": "epp"})


def test_an_aggregated_engine_reports_in_both_pools(llmd_data):
    pools = PoolMapping(by="label", pool_label="role", pod_label="pod", aggregated_label_values=["aggregated"])
    cfg = MetricsConfig(source="vllm-router", prometheus_url=llmd_data.url, frontend_selector='namespace="agg"',
                        worker_selector='namespace="agg"', frontend_targets_selector="", pools=pools)
    with PrometheusCollector(cfg) as c:
        pods = c.saturation_inputs(now_s=END_S, interval_s=INTERVAL_S)[0]
    # each engine once per pool: the loaded one (KV 0.0505) and the kit's idle one (0)
    assert [(p.pod, p.pool, p.kv_usage_frac) for p in pods] == [
        ("127.0.0.1:21500", "decode", pytest.approx(0.05054945054945059)),
        ("127.0.0.1:21500", "prefill", pytest.approx(0.05054945054945059)),
        ("127.0.0.1:21501", "decode", 0.0),
        ("127.0.0.1:21501", "prefill", 0.0),
    ]
    # without the aggregated value the same series match neither pool and are left out
    plain = cfg.model_copy(update={"pools": PoolMapping(by="label", pool_label="role", pod_label="pod")})
    with PrometheusCollector(plain) as c:
        assert c.saturation_inputs(now_s=END_S, interval_s=INTERVAL_S)[0] == ()
