"""Advisory mode's read-back against a real Prometheus: each autoscaler preset's PromQL on kube-state-metrics' series."""

from __future__ import annotations

import pytest

from connectors.autoscaler_history import read_advisory_history
from connectors.config import AdvisoryConfig, MetricsConfig
from tests.support.fixtures_dynamo import dynamo_python  # noqa: F401  (fixture)
from tests.support.fixtures_prometheus import ANCHOR_S, OpenMetricsWriter, write_gauge

NS = "autoscaler-history"
NOW_S = ANCHOR_S + 12 * 3600.0
INTERVAL_S = 60.0
# Ten minutes of history, a sample every 15 s: replicas step up at NOW_S - 300 s.
TIMES = [NOW_S - 600.0 + 15.0 * i for i in range(40)]  # NOW_S - 600 .. NOW_S - 15


def _steps(before: int, after: int) -> list[tuple[float, float]]:
    return [(t, before if t < NOW_S - 300.0 else after) for t in TIMES]


@pytest.fixture(scope="module")
def prometheus(prometheus_server):
    writer = OpenMetricsWriter()
    for kind, metric, label in (("hpa", "kube_horizontalpodautoscaler_status_desired_replicas", "horizontalpodautoscaler"),
                                ("deployment", "kube_deployment_spec_replicas", "deployment"),
                                ("leaderworkerset", "kube_statefulset_replicas", "statefulset")):
        write_gauge(writer, name=metric, labels={"namespace": NS, label: f"{kind}-prefill"}, points=_steps(1, 3))
        write_gauge(writer, name=metric, labels={"namespace": NS, label: f"{kind}-decode"}, points=_steps(2, 5))
        # Another namespace's object of the same name: the namespace matcher keeps it out.
        write_gauge(writer, name=metric, labels={"namespace": "other", label: f"{kind}-prefill"}, points=_steps(9, 9))
    for gauge, value in (("sla_planner_advisory_replicas", 4), ("sla_planner_recommended_replicas", 6)):
        for pool in ("prefill", "decode"):
            write_gauge(writer, name=gauge, labels={"namespace": NS, "model": "m", "pool": pool},
                        points=[(t, value) for t in TIMES if t >= NOW_S - 180.0])
    prometheus_server.backfill(writer.render())
    return prometheus_server


def _read(prometheus, advisory: AdvisoryConfig, *, recommendation_window_s: float = 300.0):
    return read_advisory_history(MetricsConfig(prometheus_url=prometheus.url), advisory, namespace=NS, model_id="m",
                                 now_s=NOW_S, interval_s=INTERVAL_S, recommendation_window_s=recommendation_window_s)


@pytest.mark.parametrize("kind", ["hpa", "deployment", "leaderworkerset"])
def test_each_preset_reads_the_objects_replicas_per_interval(prometheus, kind):
    advisory = AdvisoryConfig(autoscaler=kind, prefill_object=f"{kind}-prefill", decode_object=f"{kind}-decode",
                              window_s=600.0)
    history = _read(prometheus, advisory)
    # Grid NOW_S - 540 .. NOW_S (10 points; the first sample is at NOW_S - 600, so NOW_S - 600 is not on it);
    # 1 / 2 before NOW_S - 300, 3 / 5 from it; each point is the newest sample at or before it.
    want = [(NOW_S - 60.0 * k, 1 if k > 5 else 3, 2 if k > 5 else 5) for k in range(9, -1, -1)]
    assert history.autoscaler == tuple(want)
    assert history.queries[0] == (f"{kind} prefill", advisory.query("prefill", namespace=NS))


def test_the_advisorys_own_targets_and_recommendations_come_back_as_replicas(prometheus):
    history = _read(prometheus, AdvisoryConfig(autoscaler="hpa", prefill_object="hpa-prefill",
                                               decode_object="hpa-decode", window_s=600.0))
    # Published from NOW_S - 180: grid points NOW_S - 180 .. NOW_S hold them (4 each); earlier ones have none.
    assert history.advisory == tuple((NOW_S - 60.0 * k, 4, 4) for k in range(3, -1, -1))
    # The recommendations over the 300 s window: 6 points asked (NOW_S - 300 .. NOW_S), the last 4 hold 6.
    assert history.recommended == tuple((NOW_S - 60.0 * k, 6, 6) for k in range(3, -1, -1))
    assert _read(prometheus, AdvisoryConfig(autoscaler="hpa", prefill_object="hpa-prefill",
                                            decode_object="hpa-decode"), recommendation_window_s=0.0).recommended == ()


def test_a_query_with_several_series_names_its_field(prometheus):
    advisory = AdvisoryConfig(autoscaler="custom", window_s=600.0,
                              prefill_query="kube_deployment_spec_replicas{deployment=\"deployment-prefill\"}",
                              decode_query="max(kube_deployment_spec_replicas{deployment=\"deployment-decode\"})")
    with pytest.raises(ValueError, match=r"^advisory.prefill_query: expected at most one series in the history range "
                                         r"query, got 2; aggregate it"):
        _read(prometheus, advisory)


DYNAMO_EXPORTER = """
import sys, time
from prometheus_client import REGISTRY, start_http_server
from dynamo.planner.monitoring.planner_metrics import PlannerPrometheusMetrics
metrics = PlannerPrometheusMetrics()
metrics.num_prefill_replicas.set(3)
metrics.num_decode_replicas.set(4)
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=REGISTRY)
print("serving", flush=True)
time.sleep(120)
"""


@pytest.mark.integration
def test_the_dynamo_planner_preset_reads_what_dynamos_own_planner_metrics_export(prometheus_server, dynamo_python):  # noqa: F811
    """Dynamo 1.6.1's PlannerPrometheusMetrics, in its own environment, scraped live by a real Prometheus."""
    import subprocess
    import time

    from tests.support.fixtures_net import free_port, stop_process

    port = free_port()
    proc = subprocess.Popen([str(dynamo_python), "-c", DYNAMO_EXPORTER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        assert proc.stdout.readline().strip() == "serving"
        prometheus_server.add_scrape_target(address, labels={"namespace": "dynamo-live"})
        prometheus_server.wait_for_series('dynamo_planner_num_decode_replicas{namespace="dynamo-live"}', timeout_s=30)
        advisory = AdvisoryConfig(autoscaler="dynamo-planner", selector='namespace="dynamo-live"', window_s=600.0)
        history = read_advisory_history(MetricsConfig(prometheus_url=prometheus_server.url), advisory,
                                        namespace="dynamo-live", model_id="m", now_s=time.time(), interval_s=INTERVAL_S,
                                        recommendation_window_s=0.0)
    finally:
        prometheus_server.remove_scrape_target(address)
        stop_process(proc, timeout_s=10.0)
    # Scraped for a few seconds only: the run's own grid point (now) holds Dynamo's 3 prefill, 4 decode.
    assert history.autoscaler[-1][1:] == (3, 4)
