"""The collect step's Prometheus collector against a real Prometheus holding known data.

History is backfilled with promtool (see tests/support/fixtures_prometheus.py) at a
fixed date, so every expected value below is hand-computed from the series we
wrote. Each scenario has its own `namespace` label value.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from prometheus_client import Counter, Gauge, Histogram

import connectors.prometheus as prom_module
from connectors.config import MetricsConfig, PoolMapping, QueryTemplates
from connectors.prometheus import PrometheusCollector, PrometheusUnavailableError, promql_duration
from planner.config import DecisionConfig
from planner.decision.decide import decide
from planner.types import FleetState, PoolSizing, PoolState, ScrapeCoverage
from tests.support.fixtures_net import free_port
from tests.support.fixtures_prometheus import (
    ANCHOR_S,
    FrontendInterval,
    LiveExporter,
    OpenMetricsWriter,
    PrometheusServer,
    write_frontend_intervals,
    write_gauge,
    write_kit_scrape,
    write_requests,
    write_up,
)

INTERVAL_S = 60.0
N_STEADY = 10
END_S = ANCHOR_S + N_STEADY * INTERVAL_S  # the "now" of most tests


def steady_interval(k: int) -> FrontendInterval:
    """Interval k of the steady scenario: every quantity grows linearly with k."""
    return FrontendInterval(
        requests=60 + 12 * k,
        avg_ttft_s=0.100 + 0.010 * k,
        avg_itl_s=0.0050 + 0.0005 * k,
        avg_isl_tokens=1000 + 100 * k,
        avg_osl_tokens=200 + 10 * k,
    )


@pytest.fixture(scope="session")
def collect_data(prometheus_server: PrometheusServer) -> PrometheusServer:
    """Backfill every scenario once per session."""
    w = OpenMetricsWriter()
    # steady: 10 intervals, frontend + workers.
    steady = {"namespace": "collect-steady", "model": "llama"}
    write_frontend_intervals(w, labels=steady, start_s=ANCHOR_S, interval_s=INTERVAL_S,
                             intervals=[steady_interval(k) for k in range(N_STEADY)])
    # KV usage: the 1 m window before END_S sees 0.2, 0.6, 0.4, 0.4; 0.99 at -90 s is outside it.
    kv_points = [(END_S - 90, 0.99), (END_S - 45, 0.2), (END_S - 30, 0.6), (END_S - 15, 0.4), (END_S, 0.4)]
    prefill_pod = {**steady, "pod": "vllm-disagg-0-prefill-7c9f", "dynamo_component": "prefill", "accelerator": "h200"}
    decode_pod = {**steady, "pod": "vllm-disagg-0-decode-5b2d", "dynamo_component": "backend", "accelerator": "h100"}
    frontend_pod = {**steady, "pod": "vllm-disagg-0-frontend-1a2b", "dynamo_component": "frontend"}
    write_gauge(w, name="vllm:kv_cache_usage_perc", labels=prefill_pod, points=kv_points)
    write_gauge(w, name="vllm:num_requests_waiting", labels=prefill_pod, points=[(END_S - 15, 2), (END_S, 3)])
    # The decode pod reports with the underscore spelling.
    write_gauge(w, name="vllm_kv_cache_usage_perc", labels=decode_pod, points=[(END_S - 30, 0.85), (END_S, 0.80)])
    write_gauge(w, name="vllm_num_requests_waiting", labels=decode_pod, points=[(END_S, 7)])
    write_gauge(w, name="vllm:kv_cache_usage_perc", labels=frontend_pod, points=[(END_S, 0.1)])

    # two frontends: 100 requests at 0.1 s TTFT and 300 at 0.2 s in the last interval.
    for instance, requests, ttft_s in (("fe-a", 100, 0.1), ("fe-b", 300, 0.2)):
        write_frontend_intervals(
            w, labels={"namespace": "collect-two", "instance": instance}, start_s=ANCHOR_S, interval_s=INTERVAL_S,
            intervals=[FrontendInterval(requests, ttft_s, 0.01, 500, 100)] * 3)
    # a real Dynamo 1.6.1 frontend's scrape (the kit's raw /metrics text), rising from 0 over the last interval.
    write_kit_scrape(w, labels={"namespace": "collect-kit"}, start_s=END_S - INTERVAL_S, end_s=END_S)
    for instance in ("fe-a", "fe-b"):  # the same scrape from two frontends
        write_kit_scrape(w, labels={"namespace": "collect-kit-two", "instance": instance},
                         start_s=END_S - INTERVAL_S, end_s=END_S)
    # idle: traffic, then an interval without requests.
    write_frontend_intervals(w, labels={"namespace": "collect-idle"}, start_s=ANCHOR_S, interval_s=INTERVAL_S,
                             intervals=[FrontendInterval(30, 0.1, 0.01, 500, 100), FrontendInterval(0, 0, 0, 0, 0)])
    # old: the frontend stopped reporting 200 s before END_S.
    write_frontend_intervals(w, labels={"namespace": "collect-old"}, start_s=END_S - 320, interval_s=INTERVAL_S,
                             intervals=[FrontendInterval(50, 0.1, 0.01, 500, 100)] * 2)
    # kv reported in percent by mistake.
    write_frontend_intervals(w, labels={"namespace": "collect-pct"}, start_s=END_S - 120, interval_s=INTERVAL_S,
                             intervals=[FrontendInterval(50, 0.1, 0.01, 500, 100)] * 2)
    write_gauge(w, name="vllm:kv_cache_usage_perc", labels={"namespace": "collect-pct", "pod": "x-decode-1"},
                points=[(END_S, 57.0)])
    write_burst_counter(w, labels={"namespace": "collect-burst"})
    for ns, clump in (("collect-independent", 1), ("collect-clumped", 8)):
        write_arrivals_counter(w, labels={"namespace": ns}, arrival_s=clumped_arrivals(clump))
    write_partial_frontends(w)
    prometheus_server.backfill(w.render())
    return prometheus_server


def write_burst_counter(w: OpenMetricsWriter, *, labels: dict) -> None:
    """Requests counter scraped every 5 s over the two intervals before END_S.

    Interval 0 (END_S-120..END_S-60): 60 requests, +5 every 5 s (1 rps flat).
    Interval 1 (END_S-60..END_S): 150 requests, 120 of them in its first 15 s
    (+40 every 5 s: 8 rps), the other 30 spread over the last 45 s.
    """
    start_s = END_S - 2 * INTERVAL_S
    total = 0.0
    points = [(start_s, total)]
    for j in range(1, 13):
        total += 5.0
        points.append((start_s + 5 * j, total))
    for j in range(1, 13):
        total += 40.0 if j <= 3 else 30.0 / 9
        points.append((END_S - INTERVAL_S + 5 * j, total))
    for t_s, value in points:
        write_requests(w, labels=labels, value=value, t_s=t_s)


def clumped_arrivals(clump: int, *, rps: float = 40.0, seed: int = 0):
    """Arrival times over the N_STEADY intervals before END_S, at `rps`, in clumps of `clump` within 1 s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    span = N_STEADY * INTERVAL_S
    starts = np.cumsum(rng.exponential(clump / rps, size=int(rps / clump * span * 1.2)))
    arrivals = np.sort((starts[:, None] + rng.uniform(0.0, 1.0, size=(starts.size, clump))).ravel())
    return END_S - span + arrivals[arrivals < span - 1e-6]


def write_arrivals_counter(w: OpenMetricsWriter, *, labels: dict, arrival_s) -> None:
    """Request counters scraped every 5 s over the arrivals' intervals (as a frontend scraped at 5 s would be)."""
    import numpy as np

    ticks = END_S - N_STEADY * INTERVAL_S + 5.0 * np.arange(0, int(N_STEADY * INTERVAL_S / 5) + 1)
    for t_s, value in zip(ticks, np.searchsorted(arrival_s, ticks, side="right")):
        write_requests(w, labels=labels, value=float(value), t_s=float(t_s))


def write_partial_frontends(w: OpenMetricsWriter) -> None:
    """Two frontends per scenario, each 100 requests per interval while it is scraped.

    collect-partial: fe-b's scrapes fail from END_S - 60 on (up 0, no more samples).
    collect-gone: fe-d's target left service discovery at END_S - 400 (its up ends there).
    collect-whole: both up throughout.
    """
    every_15s = [END_S - 600 + 15 * j for j in range(41)]
    for ns, frontend, last_s in (("collect-partial", "fe-a", END_S), ("collect-partial", "fe-b", END_S - 60),
                                 ("collect-gone", "fe-c", END_S), ("collect-gone", "fe-d", END_S - 400),
                                 ("collect-whole", "fe-e", END_S), ("collect-whole", "fe-f", END_S)):
        labels = {"namespace": ns, "instance": frontend}
        n = round((last_s - (END_S - 300)) / INTERVAL_S)
        write_frontend_intervals(w, labels=labels, start_s=END_S - 300, interval_s=INTERVAL_S,
                                 intervals=[FrontendInterval(100, 0.1, 0.01, 500, 100)] * max(n, 0))
        if ns == "collect-gone" and last_s < END_S:
            write_up(w, labels=labels, points=[(t_s, 1.0) for t_s in every_15s if t_s <= last_s])
        else:
            write_up(w, labels=labels, points=[(t_s, 1.0 if t_s <= last_s else 0.0) for t_s in every_15s])


def collector(server: PrometheusServer, namespace: str, **overrides) -> PrometheusCollector:
    cfg = MetricsConfig(prometheus_url=server.url, frontend_selector=f'namespace="{namespace}"',
                        worker_selector=f'namespace="{namespace}"', **overrides)
    return PrometheusCollector(cfg)


@pytest.mark.parametrize("seconds, expected", [
    pytest.param(60.0, "60s", id="whole seconds"),
    pytest.param(1.5, "1500ms", id="fraction: 1.5 s = 1500 ms"),
])
def test_promql_duration(seconds, expected):
    assert promql_duration(seconds) == expected


def test_interval_averages_equal_hand_computed_values(collect_data):
    obs = collector(collect_data, "collect-steady").collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=N_STEADY)

    # Last interval is k = 9.
    assert obs.taken_at_s == END_S and obs.interval_s == INTERVAL_S
    assert obs.num_requests == pytest.approx(168.0, rel=1e-9)        # 60 + 12*9
    assert obs.avg_ttft_ms == pytest.approx(190.0, rel=1e-9)         # (0.100 + 0.010*9) s = 190 ms
    assert obs.avg_itl_ms == pytest.approx(9.5, rel=1e-9)            # (0.0050 + 0.0005*9) s = 9.5 ms
    assert obs.avg_isl_tokens == pytest.approx(1900.0, rel=1e-9)     # 1000 + 100*9
    assert obs.avg_osl_tokens == pytest.approx(290.0, rel=1e-9)      # 200 + 10*9
    assert obs.stale_reasons == ()


def test_history_comes_from_range_queries(collect_data):
    # 12 intervals asked, 10 exist: the two before the data starts are left out, not zero.
    obs = collector(collect_data, "collect-steady").collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=12)

    h = obs.history
    assert h.interval_s == INTERVAL_S
    assert h.t_s == tuple(ANCHOR_S + INTERVAL_S * (k + 1) for k in range(N_STEADY))
    assert h.num_requests == pytest.approx([60 + 12 * k for k in range(N_STEADY)], rel=1e-9)
    assert h.avg_isl_tokens == pytest.approx([1000 + 100 * k for k in range(N_STEADY)], rel=1e-9)
    assert h.avg_osl_tokens == pytest.approx([200 + 10 * k for k in range(N_STEADY)], rel=1e-9)


def test_long_history_is_read_in_chunks(collect_data, monkeypatch):
    whole = collector(collect_data, "collect-steady").collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=N_STEADY).history
    monkeypatch.setattr(prom_module, "MAX_POINTS_PER_RANGE_QUERY", 3)  # 10 points = chunks of 3+3+3+1
    chunked = collector(collect_data, "collect-steady").collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=N_STEADY).history
    assert chunked == whole


def test_pods_by_name_with_both_metric_spellings(collect_data):
    obs = collector(collect_data, "collect-steady").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)

    pods = {p.pod: p for p in obs.pods}
    assert set(pods) == {"vllm-disagg-0-prefill-7c9f", "vllm-disagg-0-decode-5b2d"}  # the frontend pod matches neither
    prefill, decode = pods["vllm-disagg-0-prefill-7c9f"], pods["vllm-disagg-0-decode-5b2d"]
    assert (prefill.pool, prefill.kv_usage_frac, prefill.queue_length) == ("prefill", 0.6, 3.0)  # max(0.2, 0.6, 0.4, 0.4)
    assert (decode.pool, decode.kv_usage_frac, decode.queue_length) == ("decode", 0.85, 7.0)     # vllm_ spelling
    assert prefill.variant == "default"


def test_pods_by_label_with_variant(collect_data):
    pools = PoolMapping(by="label", pool_label="dynamo_component", variant_label="accelerator")
    obs = collector(collect_data, "collect-steady", pools=pools).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)

    got = sorted((p.pod, p.pool, p.variant) for p in obs.pods)
    assert got == [("vllm-disagg-0-decode-5b2d", "decode", "h100"), ("vllm-disagg-0-prefill-7c9f", "prefill", "h200")]


def test_two_frontends_are_weighted_by_request_count(collect_data):
    obs = collector(collect_data, "collect-two").collect(
        now_s=ANCHOR_S + 3 * INTERVAL_S, interval_s=INTERVAL_S, history_intervals=3)
    assert obs.num_requests == pytest.approx(400.0, rel=1e-9)   # 100 + 300
    assert obs.avg_ttft_ms == pytest.approx(175.0, rel=1e-9)    # (100*0.1 + 300*0.2) / 400 s = 175 ms
    assert obs.history.num_requests == pytest.approx([400.0] * 3, rel=1e-9)


def test_idle_interval_has_zero_requests_and_no_averages(collect_data):
    obs = collector(collect_data, "collect-idle").collect(
        now_s=ANCHOR_S + 2 * INTERVAL_S, interval_s=INTERVAL_S, history_intervals=2)
    assert obs.num_requests == 0.0
    assert (obs.avg_ttft_ms, obs.avg_itl_ms, obs.avg_isl_tokens, obs.avg_osl_tokens) == (None, None, None, None)
    assert obs.stale_reasons == ()  # idle is not stale
    assert obs.history.num_requests == pytest.approx([30.0, 0.0])
    assert obs.history.avg_isl_tokens[0] == pytest.approx(500.0) and math.isnan(obs.history.avg_isl_tokens[1])


def test_old_data_is_marked_stale(collect_data):
    # Last sample at END_S - 200; stale_after_s 120 -> stale; the 60 s windows hold no samples.
    obs = collector(collect_data, "collect-old", stale_after_s=120).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=5)
    assert obs.num_requests is None and obs.avg_ttft_ms is None
    assert "prometheus: newest frontend sample is 200 s old (stale_after_s 120)" in obs.stale_reasons
    assert any("queries.num_requests returned no series" in r for r in obs.stale_reasons)
    assert obs.is_stale


def test_unknown_model_is_empty_and_stale(collect_data):
    obs = collector(collect_data, "no-such-namespace").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=3)
    assert (obs.num_requests, obs.avg_ttft_ms, obs.pods, len(obs.history)) == (None, None, (), 0)
    assert any("no frontend samples within the lookback" in r for r in obs.stale_reasons)
    assert len(obs.stale_reasons) == 6  # 5 empty frontend queries + the age check


def test_kv_usage_outside_0_1_is_rejected(collect_data):
    obs = collector(collect_data, "collect-pct").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    (pod,) = obs.pods
    assert pod.kv_usage_frac is None
    assert any("pod x-decode-1 KV-cache usage 57 is outside 0..1" in r for r in obs.stale_reasons)


def test_query_rejected_by_prometheus_names_the_field(collect_data):
    queries = QueryTemplates(num_requests="sum(rate(dynamo_frontend_requests_total[${interval}])")
    with pytest.raises(ValueError, match=r"metrics.queries.num_requests: Prometheus at .* rejected the query \(HTTP 400\)"):
        collector(collect_data, "collect-steady", queries=queries).collect(
            now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)


def test_unaggregated_override_is_rejected(collect_data):
    queries = QueryTemplates(num_requests="increase(dynamo_frontend_requests_total{${frontend_selector}}[${interval}])")
    # Two frontends, each with a stream and a unary series (a real frontend's label sets): four.
    with pytest.raises(ValueError, match=r"metrics.queries.num_requests: expected at most one series, got 4"):
        collector(collect_data, "collect-two", queries=queries).collect(
            now_s=ANCHOR_S + 3 * INTERVAL_S, interval_s=INTERVAL_S, history_intervals=1)


def test_unreachable_prometheus_is_a_connection_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=rf"Prometheus at {url} unreachable while running queries.num_requests"):
        PrometheusCollector(MetricsConfig(prometheus_url=url)).collect(
            now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert issubclass(PrometheusUnavailableError, ConnectionError)


@pytest.mark.parametrize("fields, message", [
    pytest.param({"frontend_selector": '{model="x"}'}, "without braces", id="selector with braces"),
    pytest.param({"queries": {"num_requests": "sum(x{${selector}})"}}, r"unknown placeholder\(s\) \['selector'\]",
                 id="unknown placeholder"),
    pytest.param({"pools": {"prefill_pod_regex": "("}}, "not a valid regular expression", id="bad regex"),
    pytest.param({"prometheus_url": "localhost:9090"}, "must start with http:// or https://", id="url without scheme"),
    pytest.param({"stale_after": 5}, "stale_after", id="unknown field"),
])
def test_bad_metrics_config_is_named(fields, message):
    with pytest.raises(ValueError, match=message):
        MetricsConfig(**fields)


def test_live_scrape_end_to_end(prometheus_server, live_exporter):
    """Dynamo-style metrics served live, scraped every second, read by the collector."""
    reg = live_exporter.registry
    labels = ["namespace"]
    requests_total = Counter("dynamo_frontend_requests", "requests", labels, registry=reg)
    ttft = Histogram("dynamo_frontend_time_to_first_token_seconds", "ttft", labels, registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels + ["pod"], registry=reg)
    # A frontend that has served for a while: 100 requests at 0.25 s. (Far from zero,
    # so Prometheus' extrapolation is not cut at the counter's zero point and it
    # cancels exactly in increase(_sum) / increase(_count).)
    requests_total.labels("live").inc(100)
    for _ in range(100):
        ttft.labels("live").observe(0.25)
    kv.labels("live", "live-decode-0").set(0.42)
    prometheus_server.wait_for_series('dynamo_frontend_time_to_first_token_seconds_count{namespace="live"}')
    # Two more requests at 0.35 s after the first scrape: the interval's mean is 0.35 s.
    requests_total.labels("live").inc(2)
    ttft.labels("live").observe(0.35)
    ttft.labels("live").observe(0.35)
    prometheus_server.wait_for_series('dynamo_frontend_time_to_first_token_seconds_count{namespace="live"} == 102')

    obs = collector(prometheus_server, "live").collect(now_s=time.time(), interval_s=60.0, history_intervals=1)

    (pod,) = obs.pods
    assert (pod.pod, pod.pool, pod.kv_usage_frac) == ("live-decode-0", "decode", 0.42)
    # increase(_sum) / increase(_count) = (25.7 - 25) / (102 - 100) = 0.35 s = 350 ms.
    assert obs.avg_ttft_ms == pytest.approx(350.0, rel=1e-6)
    assert obs.num_requests > 0
    assert not any("newest frontend sample" in r for r in obs.stale_reasons)
    # This frontend exports only requests_total (completions): counted, and the run says so.
    assert any("arrivals counted from queries.num_requests_fallback" in n for n in obs.notes), obs.notes


def test_peak_rate_of_a_burst_and_its_history(collect_data):
    obs = collector(collect_data, "collect-burst").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=2)

    assert obs.num_requests == pytest.approx(150.0, rel=1e-9)        # 120 + 30
    # the 15 s window over the burst: 120 requests / 15 s = 8 rps, 3.2x the mean 150/60 = 2.5 rps
    assert obs.peak_rps == pytest.approx(8.0, rel=1e-9)
    assert obs.peak_window_s == 15.0
    assert obs.notes == (MetricsConfig().source_note(),)  # the source, nothing else
    h = obs.history
    assert h.num_requests == pytest.approx([60.0, 150.0], rel=1e-9)
    # interval 0 is flat: every full window inside it reads 5 requests / 5 s = 1 rps
    assert h.peak_rps == pytest.approx([1.0, 8.0], rel=1e-9)
    assert h.peak_window_s == 15.0


def test_missing_peak_rate_is_a_note_not_stale(collect_data):
    # A 2 s window holds at most one 5 s scrape: rate() has nothing to say.
    obs = collector(collect_data, "collect-burst", peak_window_s=2.0).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=2)

    assert obs.peak_rps is None
    assert any("peak_rps" in n and "no value" in n for n in obs.notes)
    assert not any("peak_rps" in r for r in obs.stale_reasons)
    assert obs.num_requests == pytest.approx(150.0, rel=1e-9)
    assert all(math.isnan(p) for p in obs.history.peak_rps)


def test_peak_rate_query_can_be_switched_off(collect_data):
    obs = collector(collect_data, "collect-burst", queries=QueryTemplates(peak_rps="")).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=2)

    assert obs.peak_rps is None and obs.peak_window_s is None
    assert obs.history.peak_rps is None
    assert any("queries.peak_rps is empty" in n for n in obs.notes)


def test_peak_rate_query_renders_window_and_step(collect_data):
    c = collector(collect_data, "collect-burst", peak_window_s=30.0, peak_step_s=10.0)
    assert c.render("peak_rps", interval_s=60.0) == (
        'max_over_time(sum(rate(dynamo_frontend_requests_started_total{namespace="collect-burst"}[30s]))[60s:10s])'
        ' or max_over_time(sum(rate(dynamo_frontend_requests_total{namespace="collect-burst"}[30s]))[60s:10s])'
    )


def test_a_real_dynamo_frontends_metrics_read_by_hand_arithmetic(collect_data):
    """The kit's raw frontend-metrics.txt (51 chat completions through Dynamo 1.6.1): every series as
    exported, names, label sets and buckets included; the collector's numbers from the file by hand."""
    obs = collector(collect_data, "collect-kit").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    # requests_started_total{request_type="stream"} 25 + {request_type="unary"} 26
    assert obs.num_requests == pytest.approx(51.0, rel=1e-9)
    assert obs.notes == (MetricsConfig().source_note(),)  # started_total present: no fallback
    assert obs.avg_isl_tokens == pytest.approx(11155 / 51, rel=1e-9)
    assert obs.avg_osl_tokens == pytest.approx(3536 / 51, rel=1e-9)
    assert obs.avg_ttft_ms == pytest.approx(1e3 * 0.29501505899999997 / 51, rel=1e-9)
    assert obs.avg_itl_ms == pytest.approx(1e3 * 2.1569036109999997 / 3485, rel=1e-9)
    assert not obs.stale_reasons
    # The peak signal works on the real counter: 51 requests rising evenly over 60 s.
    assert obs.peak_rps == pytest.approx(51 / 60, rel=0.05)


def test_the_simulated_frontend_exports_what_a_real_one_does():
    """sim.live's frontend series: the names, types, label names and bucket boundaries of the kit's real scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    from sim.live.config import LiveConfig, make_tables
    from sim.live.fleet import LiveFleet
    from workloads.trace_shaping import build_trace
    from tests.conftest import PROJECT_ROOT
    from tests.support.fixtures_prometheus import kit_frontend_families

    cfg = LiveConfig(trace_path=str(PROJECT_ROOT / "data" / "traces" / "azure2023_conv.csv.gz"),
                     trace_start_s=600.0, trace_duration_s=20.0, profile_dir=str(PROJECT_ROOT / "data" / "profiles"
                                                                                 / "h200_llama8b_fp8_tp1"),
                     port=free_port(), model="tok")
    clock = {"now": 0.0}
    fleet = LiveFleet(cfg, trace=build_trace(cfg), tables=make_tables(cfg), clock=lambda: clock["now"])
    try:
        fleet.step(30.0)  # every request arrives and finishes
        text = fleet.metrics_text().decode()
    finally:
        fleet.close()
    real = {f.name: f for f in kit_frontend_families()}
    # (prometheus_client's _created series, which a real frontend lacks, are off in `python -m sim.live`.)
    ours = {f.name: f for f in text_string_to_metric_families(text)
            if f.name.startswith("dynamo_frontend_") and not f.name.endswith("_created")}
    assert {"dynamo_frontend_requests_started", "dynamo_frontend_requests"} <= set(ours)
    assert set(ours) <= set(real), set(ours) - set(real)
    for name, fam in ours.items():
        assert fam.type == real[name].type, name
        samples = [s for s in fam.samples if not s.name.endswith("_created")]
        ours_labels = {frozenset(k for k in s.labels if k != "le") for s in samples}
        real_labels = {frozenset(k for k in s.labels if k != "le") for s in real[name].samples}
        assert ours_labels <= real_labels, (name, ours_labels, real_labels)
        if fam.type == "histogram":
            def bounds(f):
                return sorted({float(s.labels["le"]) for s in f.samples if s.name.endswith("_bucket")})
            assert bounds(fam) == bounds(real[name]), name
    started = sum(s.value for s in ours["dynamo_frontend_requests_started"].samples if s.name.endswith("_total"))
    finished = sum(s.value for s in ours["dynamo_frontend_requests"].samples if s.name.endswith("_total"))
    assert started == finished == len(build_trace(cfg)) > 0


# -- partial scrapes -----------------------------------------------------------------------------


@pytest.mark.parametrize("namespace, expected", [
    pytest.param("collect-partial", ScrapeCoverage("frontend targets", 2, 1, "down: fe-b"), id="one target down"),
    pytest.param("collect-gone", ScrapeCoverage("frontend targets", 2, 1, "1 no longer discovered (seen within 600 s)"),
                 id="one target gone from discovery 400 s ago"),
    pytest.param("collect-whole", ScrapeCoverage("frontend targets", 2, 2, ""), id="both up"),
])
def test_frontend_targets_up_of_those_known(collect_data, namespace, expected):
    obs = collector(collect_data, namespace, frontend_targets_selector=f'namespace="{namespace}"').collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=3)
    assert obs.coverage == (expected,)
    assert obs.stale_reasons == ()


def test_half_the_frontends_down_holds_the_decision_with_the_numbers(collect_data):
    """The failing frontend's requests vanish from the sum: 100 counted where 200 arrived. The decision
    from that observation keeps the fleet (a sizing of (1, 1) would halve it) and names the missing target."""
    partial = collector(collect_data, "collect-partial", frontend_targets_selector='namespace="collect-partial"')
    obs = partial.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=3)
    whole = collector(collect_data, "collect-whole", frontend_targets_selector='namespace="collect-whole"').collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=3)
    assert (obs.num_requests, whole.num_requests) == (pytest.approx(100.0), pytest.approx(200.0))

    fleet = FleetState(prefill=PoolState(2, 2), decode=PoolState(4, 4))
    sizing = {p: PoolSizing(p, 1) for p in ("prefill", "decode")}
    cfg = DecisionConfig(scale_down_min_history_intervals=0)  # three intervals of history are enough here
    held = decide(sizing=sizing, saturation=None, fleet=fleet, obs=obs, cfg=cfg, now_s=END_S)
    assert (held.prefill_replicas, held.decode_replicas, held.apply) == (2, 4, False)
    (reason,) = [r for r in held.reasons if r.code.value == "hold_partial_metrics"]
    assert "1 of 2 frontend targets missing (down: fe-b)" in reason.message
    assert (reason.numbers["frontend_targets_expected"], reason.numbers["frontend_targets_present"]) == (2, 1)
    scaled = decide(sizing=sizing, saturation=None, fleet=fleet, obs=whole, cfg=cfg, now_s=END_S)
    assert (scaled.prefill_replicas, scaled.decode_replicas) == (1, 1)
    assert "hold_partial_metrics" not in scaled.codes()


def test_frontend_targets_not_checked_when_nothing_matches(collect_data):
    obs = collector(collect_data, "collect-steady", frontend_targets_selector='job="no-such-job"').collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    (frontend,) = obs.coverage
    assert (frontend.expected, frontend.present) == (0, 0)
    assert frontend.detail.startswith("not checked: no up series match metrics.frontend_targets_selector")
    off = collector(collect_data, "collect-steady", frontend_targets_selector="").collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert off.coverage[0].expected == 0 and "frontend_targets_selector or queries.frontend_targets is empty" in \
        off.coverage[0].detail


def test_worker_coverage_against_the_fleets_ready_replicas(collect_data):
    # collect-steady has one prefill and one decode pod reporting.
    c = collector(collect_data, "collect-steady", frontend_targets_selector="")
    obs = c.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1,
                    expected_workers={"prefill": 1, "decode": 2})
    assert obs.coverage[1:] == (
        ScrapeCoverage("prefill workers", 1, 1, "1 pods report worker series, the fleet has 1 ready"),
        ScrapeCoverage("decode workers", 2, 1, "1 pods report worker series, the fleet has 2 ready"),
    )
    idle = c.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1,
                     expected_workers={"prefill": 0, "decode": 1})
    assert [x.source for x in idle.coverage[1:]] == ["decode workers"]  # a pool with none ready is not checked
    none = PrometheusCollector(MetricsConfig(  # engines that export no vllm series (Dynamo's mocker, SGLang)
        prometheus_url=collect_data.url, frontend_selector='namespace="collect-steady"',
        worker_selector='namespace="no-such-workers"', frontend_targets_selector=""))
    nothing = none.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1,
                           expected_workers={"prefill": 1, "decode": 2}).coverage[1:]
    assert [(c.source, c.expected, c.present) for c in nothing] == [("prefill workers", 0, 0), ("decode workers", 0, 0)]
    assert nothing[0].detail.startswith("not checked: no prefill pod reports the worker queries' series")
    silent = collector(collect_data, "collect-steady", frontend_targets_selector="", expect_worker_metrics=False)
    assert silent.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1,
                          expected_workers={"prefill": 1, "decode": 2}).coverage[1:] == ()


def _frontend_exporter(prometheus_server: PrometheusServer, namespace: str) -> LiveExporter:
    """A live exporter serving a frontend's request counter and histograms, scraped with `namespace`."""
    exporter = LiveExporter()
    reg = exporter.registry
    started = Counter("dynamo_frontend_requests_started", "started", ["model"], registry=reg)
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "input_sequence_tokens",
                 "output_sequence_tokens"):
        Histogram(f"dynamo_frontend_{name}", name, ["model"], registry=reg).labels("m").observe(1.0)
    started.labels("m").inc(10)
    prometheus_server.add_scrape_target(exporter.address, labels={"namespace": namespace})
    return exporter


def test_live_frontend_stopped_is_a_target_down(prometheus_server):
    """Two frontends scraped every second; one stops: its target reads up 0 and the collector says which."""
    ns = "live-partial"
    a, b = _frontend_exporter(prometheus_server, ns), _frontend_exporter(prometheus_server, ns)
    try:
        c = collector(prometheus_server, ns, frontend_targets_selector=f'namespace="{ns}"')
        # Two scrapes of each: increase() over the interval needs two samples, else the frontend queries are empty.
        prometheus_server.wait_for_series(f'count(count_over_time(up{{namespace="{ns}"}}[1m]) >= 2) == 2')
        both = c.collect(now_s=time.time(), interval_s=60.0, history_intervals=1)
        assert both.coverage == (ScrapeCoverage("frontend targets", 2, 2, ""),)
        b.close()
        prometheus_server.wait_for_series(f'up{{namespace="{ns}",instance="{b.address}"}} == 0')
        one = c.collect(now_s=time.time(), interval_s=60.0, history_intervals=1)
        assert one.stale_reasons == ()
        assert one.coverage == (ScrapeCoverage("frontend targets", 2, 1, f"down: {b.address}"),)
        fleet = FleetState(prefill=PoolState(2, 2), decode=PoolState(4, 4))
        sizing = {p: PoolSizing(p, 1) for p in ("prefill", "decode")}
        held = decide(sizing=sizing, saturation=None, fleet=fleet, obs=one,
                      cfg=DecisionConfig(scale_down_min_history_intervals=0), now_s=time.time())
        assert (held.prefill_replicas, held.decode_replicas) == (2, 4), held.codes()
        assert any(r.code.value == "hold_partial_metrics" and f"1 of 2 frontend targets missing (down: {b.address})"
                   in r.message for r in held.reasons), held.reasons
    finally:
        for exporter in (a, b):
            prometheus_server.remove_scrape_target(exporter.address)
        a.close()


# -- length histograms (planner.signals.length_shape) ----------------------------------------------------


def test_a_real_frontends_length_histograms_over_the_window(collect_data):
    """The kit's real ISL/OSL histograms (Dynamo 1.6.1's own buckets) read over the 1800 s window: the bounds as
    exported, every bucket in the kit's proportions, the sum placing the mean, and the CVs the core reads from them."""
    from planner.signals.length_shape import (
        DYNAMO_ISL_BOUNDS_TOKENS,
        DYNAMO_OSL_BOUNDS_TOKENS,
        histogram_from_buckets,
        measure_length_shape,
    )
    from tests.support.fixtures_prometheus import kit_series

    obs = collector(collect_data, "collect-kit").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    for hist, metric, bounds in ((obs.isl_histogram, "dynamo_frontend_input_sequence_tokens", DYNAMO_ISL_BOUNDS_TOKENS),
                                 (obs.osl_histogram, "dynamo_frontend_output_sequence_tokens", DYNAMO_OSL_BOUNDS_TOKENS)):
        kit = histogram_from_buckets({labels["le"]: v for labels, v in kit_series(f"{metric}_bucket")},
                                     sum_tokens=kit_series(f"{metric}_sum")[0][1], window_s=1800.0)
        assert hist.upper_bounds_tokens == bounds == kit.upper_bounds_tokens
        assert hist.window_s == 1800.0
        # increase() extrapolates every bucket of one scrape alike: proportions and mean are the kit's.
        scale = hist.count / kit.count
        assert hist.cumulative_counts == pytest.approx([c * scale for c in kit.cumulative_counts], rel=1e-9)
        assert hist.sum_tokens / hist.count == pytest.approx(kit.sum_tokens / kit.count, rel=1e-9)
    shape, note = measure_length_shape(obs.isl_histogram, obs.osl_histogram, min_requests=1)
    kit_shape, _ = measure_length_shape(
        *(histogram_from_buckets({labels["le"]: v for labels, v in kit_series(f"{m}_bucket")},
                                 sum_tokens=kit_series(f"{m}_sum")[0][1], window_s=1800.0)
          for m in ("dynamo_frontend_input_sequence_tokens", "dynamo_frontend_output_sequence_tokens")),
        min_requests=1)
    assert shape.isl_cv == pytest.approx(kit_shape.isl_cv, rel=1e-9)
    assert shape.decode_context_cv == pytest.approx(kit_shape.decode_context_cv, rel=1e-9)
    assert not any("buckets" in n for n in obs.notes + obs.length_notes)


def test_no_length_histograms_is_a_note_and_the_configured_cvs(collect_data):
    # collect-burst exports only the request counters.
    obs = collector(collect_data, "collect-burst").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert obs.isl_histogram is None and obs.osl_histogram is None
    assert any(n.startswith("isl_buckets: no bucket series at t=") and n.endswith("configured length CVs used")
               for n in obs.length_notes)
    assert not any("buckets" in n for n in obs.notes)
    assert not any("buckets" in r for r in obs.stale_reasons)
    off = collector(collect_data, "collect-kit", queries=QueryTemplates(isl_buckets="")).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert off.isl_histogram is None and "isl_buckets: query empty; configured length CVs used" in off.length_notes


@pytest.mark.parametrize("field, query, message", [
    ("isl_window_sum", "increase(dynamo_frontend_input_sequence_tokens_sum{${frontend_selector}}[${length_window}])",
     r"metrics.queries.isl_window_sum: expected at most one series, got [2-9]"),
    ("isl_buckets",
     "increase(dynamo_frontend_input_sequence_tokens_bucket{${frontend_selector}}[${length_window}])",
     r"metrics.queries.isl_buckets: \d+ series for \d+ `le` bounds .*aggregate it, e.g. sum by \(le\)"),
])
def test_unaggregated_length_query_is_rejected(collect_data, field, query, message):
    # Two frontends: per-frontend series would otherwise overwrite one another (buckets) or be dropped (the
    # sum, leaving the +Inf bucket at its lower bound) without a word.
    with pytest.raises(ValueError, match=message):
        collector(collect_data, "collect-kit-two", queries=QueryTemplates(**{field: query})).collect(
            now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    both = collector(collect_data, "collect-kit-two").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    one = collector(collect_data, "collect-kit").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert both.isl_histogram.cumulative_counts == pytest.approx([2 * c for c in one.isl_histogram.cumulative_counts])


def test_length_window_renders_into_the_bucket_query(collect_data):
    c = collector(collect_data, "collect-kit", length_window_s=600.0)
    assert c.render("isl_buckets", interval_s=60.0) == (
        'sum by (le) (increase(dynamo_frontend_input_sequence_tokens_bucket{namespace="collect-kit"}[600s]))'
    )


def _kit_latency_histogram(collect_data, kind: str, metric: str, bounds: tuple[float, ...]):
    """The collected `kind` histogram of the kit's scrape, checked bucket by bucket against the kit's own counts."""
    from tests.support.fixtures_prometheus import kit_series

    obs = collector(collect_data, "collect-kit").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    kit = {labels["le"]: v for labels, v in kit_series(f"{metric}_bucket")}
    h = getattr(obs, f"{kind}_histogram")
    assert h.upper_bounds_s == bounds and getattr(obs, f"{kind}_note") is None
    scale = h.count / kit["+Inf"]
    assert h.cumulative_counts == pytest.approx([kit[f"{b:g}"] * scale for b in bounds] + [h.count])
    return h


def test_a_real_frontends_ttft_histogram_over_the_interval(collect_data):
    """The kit's TTFT buckets (Dynamo 1.6.1's bounds) over the interval, and the share of them within a target."""
    from planner.signals.slo_attainment import DYNAMO_TTFT_BOUNDS_S, share_within

    h = _kit_latency_histogram(collect_data, "ttft", "dynamo_frontend_time_to_first_token_seconds",
                               DYNAMO_TTFT_BOUNDS_S)
    # 47 of the kit's 51 first tokens within 22 ms, 51 within 47 ms: 30 ms reads between the two.
    at_30ms = share_within(h, 0.030)
    assert (at_30ms.at_least, at_30ms.at_most) == pytest.approx((47 / 51, 1.0))
    assert 47 / 51 < at_30ms.share < 1.0 and at_30ms.bucket_s == (0.022, 0.047)
    assert share_within(h, 0.2).share == 1.0


def test_a_real_frontends_itl_histogram_over_the_interval(collect_data):
    """The kit's inter-token latency buckets (one per token gap, Dynamo 1.6.1's bounds) and the share within 10 ms."""
    from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, share_within

    h = _kit_latency_histogram(collect_data, "itl", "dynamo_frontend_inter_token_latency_seconds",
                               DYNAMO_ITL_BOUNDS_S)
    # 3484 of the kit's 3485 gaps within 1.8 ms, the last one within 5.9 ms: 10 ms holds them all
    within = share_within(h, 0.010)
    assert within.share == 1.0 and within.bucket_s == (0.0059, 0.011)
    assert share_within(h, 0.0018).share == pytest.approx(3484 / 3485)
    off = collector(collect_data, "collect-kit", queries=QueryTemplates(itl_buckets="")).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert off.itl_histogram is None and off.itl_note == "itl_buckets: query empty"


def test_the_slo_windows_histograms_are_read_over_metrics_slo_window_s(collect_data):
    """The same kit histograms over the trailing SLO window: the kit's counts in its proportions; the window renders."""
    from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, DYNAMO_TTFT_BOUNDS_S
    from tests.support.fixtures_prometheus import kit_series

    c = collector(collect_data, "collect-kit", slo_window_s=600.0)
    assert c.render("itl_window_buckets", interval_s=60.0) == (
        'sum by (le) (increase(dynamo_frontend_inter_token_latency_seconds_bucket{namespace="collect-kit"}[600s]))'
    )
    obs = c.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    w = obs.slo_window
    assert w.window_s == 600.0 and w.notes == ()
    for h, metric, bounds in ((w.ttft, "dynamo_frontend_time_to_first_token_seconds", DYNAMO_TTFT_BOUNDS_S),
                              (w.itl, "dynamo_frontend_inter_token_latency_seconds", DYNAMO_ITL_BOUNDS_S)):
        kit = {labels["le"]: v for labels, v in kit_series(f"{metric}_bucket")}
        scale = h.count / kit["+Inf"]
        assert h.upper_bounds_s == bounds and scale > 0
        assert h.cumulative_counts == pytest.approx([kit[f"{b:g}"] * scale for b in bounds] + [h.count])
    off = collector(collect_data, "collect-kit", queries=QueryTemplates(ttft_window_buckets="", itl_window_buckets=""))
    assert off.collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1).slo_window is None
    burst = collector(collect_data, "collect-burst").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert burst.slo_window.ttft is None and burst.slo_window.notes[0].startswith("ttft_window_buckets: no bucket")


def test_no_ttft_histogram_is_a_note(collect_data):
    obs = collector(collect_data, "collect-burst").collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert obs.ttft_histogram is None and obs.ttft_note.startswith("ttft_buckets: no bucket series at t=")
    off = collector(collect_data, "collect-kit", queries=QueryTemplates(ttft_buckets="")).collect(
        now_s=END_S, interval_s=INTERVAL_S, history_intervals=1)
    assert off.ttft_histogram is None and off.ttft_note == "ttft_buckets: query empty"
    assert not any("ttft_buckets" in r for r in obs.stale_reasons + off.stale_reasons)
    assert obs.itl_histogram is None and obs.itl_note.startswith("itl_buckets: no bucket series at t=")


@pytest.mark.parametrize("ns, clump, basis", [("collect-independent", 1, "mean"), ("collect-clumped", 8, "p90")])
def test_clumping_read_through_prometheus_picks_the_sizing_basis(collect_data, ns, clump, basis):
    """The peak-rate history a real Prometheus returns gives the clumping index the exact arrivals give."""
    from planner.signals.clumping import clumping_index, sizing_basis
    from planner.config import PredictorConfig
    from planner.predict import bin_requests
    from sim.replay import ReplaySettings, peak_rate_rps

    obs = collector(collect_data, ns).collect(now_s=END_S, interval_s=INTERVAL_S, history_intervals=N_STEADY)
    cfg = PredictorConfig()
    def index(history, quantile):
        return clumping_index(history, lookback_intervals=cfg.clumping_lookback_intervals,
                              min_intervals=cfg.clumping_min_intervals, quantile=quantile)[0]

    # The same from the arrivals themselves, windows counted exactly.
    arrivals = clumped_arrivals(clump)
    exact_history = bin_requests(arrivals, arrivals * 0, arrivals * 0, bin_s=INTERVAL_S,
                                 start_s=END_S - N_STEADY * INTERVAL_S, end_s=END_S)
    peaks = tuple(peak_rate_rps(arrivals, end_s=t, scenario=ReplaySettings()) for t in exact_history.t_s)
    exact_history = dataclasses.replace(exact_history, peak_rps=peaks, peak_window_s=15.0)
    assert obs.history.num_requests == pytest.approx(exact_history.num_requests)
    # The medians of the readings agree within a quarter; a low quantile lands on different readings
    # (clumps of eight: 7.1 through Prometheus against 4.4 from the exact arrivals) ...
    assert index(obs.history, 0.5) == pytest.approx(index(exact_history, 0.5), rel=0.25, abs=0.3)
    # ... and the default index picks the same sizing basis from either.
    for history in (obs.history, exact_history):
        assert sizing_basis("auto", index(history, cfg.clumping_quantile), max_index=cfg.clumping_max_index)[0] == basis
