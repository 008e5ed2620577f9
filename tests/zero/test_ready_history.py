"""The ready counts a live planner measures startup times from: PrometheusCollector.ready_history on a real
Prometheus (backfilled workers' series), then planner.signals.startup_time on them."""

from __future__ import annotations

import pytest

from connectors.config import MetricsConfig
from connectors.prometheus import PrometheusCollector
from planner.signals.startup_time import startup_times
from tests.support.fixtures_prometheus import ANCHOR_S, OpenMetricsWriter, write_gauge

FLEET = "readyhist"
SCRAPE_S = 15.0


@pytest.fixture(scope="module")
def prometheus(prometheus_server):
    # prefill-0 and decode-0 answer all along; the scale-up decided at +1000 s brings decode-1, whose scrape
    # answers from +1050 s (50 s: its startup); another fleet's worker (other labels) must not count.
    writer = OpenMetricsWriter()
    times = [ANCHOR_S + SCRAPE_S * i for i in range(int(1800 / SCRAPE_S) + 1)]
    for pod, role, since in (("w0", "prefill", 0.0), ("w1", "decode", 0.0), ("w2", "decode", 1050.0)):
        # the worker's scrape target: down (0) until its metrics endpoint answers
        write_gauge(writer, name="up", labels={"instance": pod, "role": role, "fleet": FLEET},
                    points=[(t, 1.0 if t >= ANCHOR_S + since else 0.0) for t in times])
    write_gauge(writer, name="up", labels={"instance": "x", "role": "decode", "fleet": "other"},
                points=[(t, 1.0) for t in times])
    prometheus_server.backfill(writer.render())
    return prometheus_server


def metrics(url: str) -> MetricsConfig:
    return MetricsConfig.model_validate({
        "prometheus_url": url, "worker_selector": f'fleet="{FLEET}"',
        "pools": {"by": "label", "pool_label": "role", "pod_label": "instance",
                  "prefill_label_values": ["prefill"], "decode_label_values": ["decode"]}})


def test_ready_history_counts_workers_per_pool_where_they_change(prometheus):
    with PrometheusCollector(metrics(prometheus.url)) as collector:
        ready = collector.ready_history(now_s=ANCHOR_S + 1800.0, window_s=1800.0, step_s=5.0)
    # grid: ANCHOR + 5 + 5k; the first point, then the change at +1050 s
    assert ready == ((ANCHOR_S + 5.0, 1, 1), (ANCHOR_S + 1050.0, 1, 2))
    out = startup_times(applied=[(ANCHOR_S, 1, 1), (ANCHOR_S + 1000.0, 1, 2)], ready=ready, configured_s=60.0)
    assert (out["decode"].startup_s, out["decode"].source) == (50.0, "measured")
    assert out["prefill"].source == "configured"  # prefill never scaled up


def test_ready_history_keeps_one_range_query_under_prometheus_cap(prometheus):
    # six hours at 1 s would be 21,600 points: the step widens to 6 h / 10,000 = 2.16 s
    with PrometheusCollector(metrics(prometheus.url)) as collector:
        ready = collector.ready_history(now_s=ANCHOR_S + 1800.0, window_s=6 * 3600.0, step_s=1.0)
    # the first grid point at or after +1050 s: within one 2.16 s step
    assert ready[-1][1:] == (1, 2) and ANCHOR_S + 1050.0 <= ready[-1][0] < ANCHOR_S + 1050.0 + 2.16
