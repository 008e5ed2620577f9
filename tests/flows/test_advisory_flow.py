"""Advisory mode end to end: a scheduled planner run beside Dynamo's planner on a DGD writes nothing and compares.

A real Prometheus holds what the running autoscaler (Dynamo's planner, its gauges) set over three hours
and what earlier advisory runs published over the last hour; the DGD lives in the fake Dynamo cluster
(tests/support/k8s_dynamo_fake.py), which records every request. The run goes through the Kubernetes
connector with a kubeconfig, under Prefect's test harness.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from connectors.config import KubernetesConnectorConfig, MetricsConfig, PlannerMetricsConfig
from flows.config import PlannerRunConfig, ReplayInputs, load_run_config
from flows.report import artifact_key
from planner.config import PlannerConfig, ProfileConfig
from planner.types import LoadHistory, Observation, PodMetrics
from tests.connectors.test_k8s_dynamo import NAME, example_dgd, kubeconfig
from tests.support.fixtures_net import free_port
from tests.support.fixtures_prometheus import ANCHOR_S, OpenMetricsWriter, write_gauge
from tests.support.k8s_dynamo_fake import DGD, DGDSA, DynamoCluster
from tests.support.k8s_fake_server import TEST_TOKEN

NS = "advisory-test"
INTERVAL_S = 60.0
NOW_S = ANCHOR_S + 8 * 3600.0
SCRAPE_S = 15.0
# Dynamo's planner ran prefill 1 / decode 2 until half an hour ago, 3 / 4 since (what the DGD holds now).
SWITCH_S = NOW_S - 1800.0


def _observation(*, requests: float, now_s: float = NOW_S, replicas: tuple[int, int] = (3, 4)) -> Observation:
    """Half an hour of flat load up to now_s; every replica of the fleet (prefill, decode) reports its saturation
    gauges (none missing: no hold)."""
    n = 30
    hist = LoadHistory(t_s=tuple(now_s - INTERVAL_S * (n - i) for i in range(n)), num_requests=(requests,) * n,
                       avg_isl_tokens=(1000.0,) * n, avg_osl_tokens=(150.0,) * n, interval_s=INTERVAL_S)
    pods = tuple(PodMetrics(f"{pool}-{i}", pool, 0.2, 0.0)
                 for pool, count in zip(("prefill", "decode"), replicas) for i in range(count))
    return Observation(taken_at_s=now_s, interval_s=INTERVAL_S, num_requests=requests, avg_isl_tokens=1000.0,
                       avg_osl_tokens=150.0, avg_ttft_ms=60.0, avg_itl_ms=6.0, history=hist, pods=pods)


@pytest.fixture(scope="module")
def history(prometheus_server):
    """The autoscaler's three hours and the advisory's own last hour, backfilled."""
    writer = OpenMetricsWriter()
    times = [NOW_S - 3 * 3600.0 + SCRAPE_S * i for i in range(int(3 * 3600 / SCRAPE_S))]  # up to NOW_S - 15 s
    for pool, before, after in (("prefill", 1, 3), ("decode", 2, 4)):
        write_gauge(writer, name=f"dynamo_planner_num_{pool}_replicas", labels={"dynamo_namespace": NS},
                    points=[(t, before if t < SWITCH_S else after) for t in times])
        for gauge in ("sla_planner_advisory_replicas", "sla_planner_recommended_replicas"):
            write_gauge(writer, name=gauge, labels={"namespace": NS, "model": "default", "pool": pool},
                        points=[(t, 2) for t in times if t >= NOW_S - 3600.0])
    prometheus_server.backfill(writer.render())
    return prometheus_server


@pytest.fixture
def cluster():
    server = DynamoCluster(token=TEST_TOKEN).start()
    dgd = example_dgd(adapters=True)
    for comp in dgd["spec"]["components"]:
        comp["replicas"] = {"prefill": 3, "decode": 4}.get(comp["name"], comp["replicas"])
    server.create_dgd(dgd, namespace=NS)
    server.reconcile(NS, NAME)
    server.clear_requests()
    yield server
    server.stop()


def _latest_artifact(key: str):
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                               sort=ArtifactSort.CREATED_DESC, limit=1)

    return anyio.run(read)[0]


def _flow_run_name(flow_run_id) -> str:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).name


@pytest.mark.integration
def test_advisory_run_writes_nothing_and_compares_with_dynamos_planner(prefect_harness, history, cluster, tmp_path,
                                                                      h200_profile_dir, monkeypatch):
    import flows.planner_flow as planner_flow_module
    from connectors.planner_metrics import stop_endpoints
    from flows.charts import planner_chart_figure

    drawn = []
    real_png = planner_flow_module.planner_chart_png

    def recording_png(result, **kwargs):
        drawn.append((result, kwargs))
        return real_png(result, **kwargs)

    monkeypatch.setattr(planner_flow_module, "planner_chart_png", recording_png)
    port = free_port()
    config = PlannerRunConfig.model_validate({
        "planner": PlannerConfig(namespace=NS, mode="advisory", profile=ProfileConfig(dir=str(h200_profile_dir))),
        "metrics": MetricsConfig(prometheus_url=history.url),
        "connector": KubernetesConnectorConfig(dgd_name=NAME, namespace=NS,
                                               kubeconfig_path=str(kubeconfig(tmp_path, cluster))),
        "planner_metrics": PlannerMetricsConfig(port=port, addr="127.0.0.1"),
        "advisory": {"autoscaler": "dynamo-planner", "selector": f'dynamo_namespace="{NS}"', "label": "Dynamo planner"},
    })
    before = cluster.stored(DGD, NS, NAME)
    try:
        state = planner_flow_module.planner_flow(
            config=config, replay=ReplayInputs(observation=_observation(requests=600.0), now_s=NOW_S),
            return_state=True)
        gauges = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop_endpoints()
    out = state.result()

    # Nothing written: only reads reached the API server, and the DGD and its adapters are as they were.
    assert [r for r in cluster.requests if r.method not in ("GET",)] == []
    assert cluster.stored(DGD, NS, NAME)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert {n: cluster.stored(DGDSA, NS, f"{NAME}-{n}")["spec"]["replicas"] for n in ("prefill", "decode")} == \
        {"prefill": 3, "decode": 4}
    assert out["applied"] is False and out["decision_id"] is None

    # The comparison: ours now (this decision) against the DGD's 3 / 4; over the 3 h window, the intervals where
    # both are known are the advisory's last hour, 61 grid points (now - 3600 s .. now). There the advisory held
    # 2 + 2 = 4 GPUs (now: this decision), the autoscaler 3 + 4 = 7 at now - 1800 s .. now (31 points) and
    # 1 + 2 = 3 before (30 points): ours fewer in 30, more in 30, and the run's own point either way.
    p, d = out["decision"]["prefill_replicas"], out["decision"]["decode_replicas"]
    adv = out["advisory"]
    assert adv["autoscaler"] == "Dynamo planner"
    assert adv["now"] == {"prefill": {"advisory": p, "autoscaler": 3}, "decode": {"advisory": d, "autoscaler": 4}}
    assert adv["intervals"] == 61
    assert adv["more_intervals"] == 30 + (p + d > 7)
    assert adv["fewer_intervals"] == 30 + (p + d < 7)
    assert adv["advisory_gpu_hours"] == pytest.approx((60 * 4 + p + d) / 60)
    assert adv["autoscaler_gpu_hours"] == pytest.approx((31 * 7 + 30 * 3) / 60)

    # Named and explained as advisory, under the live keys (and on `sla-planner run`'s line).
    from planner_cli.run import run_line

    assert run_line(out).startswith(f"prefill 3 -> {p}, decode 4 -> {d} (advisory, nothing written; Dynamo planner "
                                    f"has prefill 3, decode 4); reasons: ")
    assert _flow_run_name(state.state_details.flow_run_id).endswith("(advisory)")
    assert state.message.startswith("advisory, ")
    rows = json.loads(_latest_artifact(artifact_key("decision", NS)).data)
    items = {r["item"]: r for r in rows if r["step"] == "advisory"}
    assert items["result"]["value"] == "advisory"
    assert items["prefill: ours vs Dynamo planner now"]["value"].startswith(f"{p} vs 3")
    assert items["GPU-hours over 3 h: ours vs Dynamo planner"]["value"] == \
        f"{(60 * 4 + p + d) / 60:.2f} vs {(31 * 7 + 30 * 3) / 60:.2f}"
    assert not any(r["step"] == "apply" for r in rows)
    summary = _latest_artifact(artifact_key("summary", NS)).data
    assert "advisory: nothing applied" in summary and "**Advisory vs Dynamo planner**" in summary
    assert _latest_artifact(artifact_key("chart", NS)).type == "image"
    # Both series, a row where either changes on the grid (NOW_S is 2023-11-15 08:00 UTC; the 3 h window's first
    # point 05:01): ours unknown until 07:00, 2 / 2 then, this run's targets at 08:00; theirs 1 / 2, 3 / 4 from 07:30.
    series = json.loads(_latest_artifact(artifact_key("advisory", NS)).data)
    assert [(r["time (UTC)"], r["ours prefill"], r["ours decode"], r["theirs prefill"], r["theirs decode"])
            for r in series] == [("2023-11-15 05:01", "", "", 1, 2), ("2023-11-15 07:00", 2, 2, 1, 2),
                                 ("2023-11-15 07:30", 2, 2, 3, 4), ("2023-11-15 08:00", p, d, 3, 4)]

    # The chart draws both lines per pool: the autoscaler's actual replicas and ours.
    (result, kwargs), = drawn
    ax = planner_chart_figure(result, **kwargs).axes[1]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert set(lines["prefill Dynamo planner (actual)"]) == {1, 3}
    assert set(lines["decode Dynamo planner (actual)"]) == {2, 4}
    assert set(lines["prefill ours (advisory)"]) == {2, p} and set(lines["decode ours (advisory)"]) == {2, d}

    # The gauges: ours on sla_planner_advisory_replicas, no desired replicas a KEDA ScaledObject could apply.
    assert f'sla_planner_advisory_replicas{{model="default",namespace="{NS}",pool="prefill"}} {float(p)}' in gauges
    assert "sla_planner_desired_replicas{" not in gauges
    assert f'sla_planner_current_replicas{{model="default",namespace="{NS}",pool="decode"}} 4.0' in gauges


def test_an_unknown_mode_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "planner.yaml"
    bad.write_text("planner:\n  profile: {dir: x}\n  mode: recommend\n")
    with pytest.raises(ValueError) as err:
        load_run_config(bad)
    assert str(err.value) == f"{bad}: planner.mode: Input should be 'apply' or 'advisory' (got 'recommend')"


@pytest.mark.parametrize("advisory, message", [
    ({"autoscaler": "hpa", "decode_object": "dec"},
     "advisory: prefill_object: the hpa autoscaler's query names the prefill pool's object; set it"),
    ({"autoscaler": "custom", "prefill_query": "max(x)"},
     "advisory: decode_query: the custom autoscaler needs both prefill_query and decode_query"),
    ({"prefill_query": "max(x{${pod}})"}, "advisory: prefill_query: unknown or invalid placeholder(s)"),
    ({"selector": "{a=\"b\"}"}, "advisory.selector: give label matchers without braces"),
    ({"window_s": 600}, "advisory.window_s (600 s) is shorter than planner.adjustment_interval_s (900 s)"),
])
def test_bad_advisory_settings_are_one_line_each(tmp_path, advisory, message):
    import yaml

    bad = tmp_path / "planner.yaml"
    bad.write_text(yaml.safe_dump({"planner": {"profile": {"dir": "x"}, "mode": "advisory", "adjustment_interval_s": 900},
                                   "planner_metrics": {"pushgateway_url": "http://127.0.0.1:9091"},
                                   "advisory": advisory}))
    with pytest.raises(ValueError) as err:
        load_run_config(bad)
    assert len(str(err.value).splitlines()) == 1 and message in str(err.value)


def test_the_recording_rule_compares_the_advisory_with_the_running_autoscaler(tmp_path):
    import subprocess

    import yaml

    rules = Path(__file__).resolve().parents[2] / "stack" / "prometheus-rules.yml"
    labels = 'namespace="dynamo", model="m", job="planner", instance="pg", pool="decode"'
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f"sla_planner_advisory_replicas{{{labels}}}", "values": "2 3 5"},
                         {"series": f"sla_planner_current_replicas{{{labels}}}", "values": "4 4 4"}],
        # At 2m: ours 5, theirs 4.
        "promql_expr_test": [{"expr": "sla_planner:advisory_minus_current_replicas", "eval_time": "2m",
                              "exp_samples": [{"labels": f"sla_planner:advisory_minus_current_replicas{{{labels}}}",
                                               "value": 1}]}],
    }]}
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump(tests))
    run = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.integration
def test_advisory_run_beside_hpas_on_llm_d_reads_and_never_writes(prefect_harness, prometheus_server, tmp_path,
                                                                  h200_profile_dir):
    """llm-d's P/D Deployments, each scaled by an HPA (which an applying run refuses to fight): the advisory's
    first run (no history of its own yet) reads the HPAs' desired replicas from kube-state-metrics' series."""
    from kubernetes import client as k8s

    from connectors.config import LlmdConnectorConfig
    from connectors.planner_metrics import stop_endpoints
    from connectors.factory import make_connector
    from connectors.base import ConnectorError
    from flows.planner_flow import planner_flow
    from planner.types import Decision
    from tests.connectors.test_llmd_connector import DECODE, NS as LLMD_NS, POOL, PREFILL, seed
    from tests.support.k8s_fake_server import kube_api_client
    from tests.support.k8s_llmd_fake import LlmdCluster

    now_s = NOW_S + 3600.0
    writer = OpenMetricsWriter()
    for name, value in (("prefill-hpa", 2), ("decode-hpa", 2)):
        write_gauge(writer, name="kube_horizontalpodautoscaler_status_desired_replicas",
                    labels={"namespace": LLMD_NS, "horizontalpodautoscaler": name},
                    points=[(now_s - 1800.0 + SCRAPE_S * i, value) for i in range(int(1800 / SCRAPE_S))])
    prometheus_server.backfill(writer.render())
    cluster = LlmdCluster(token=TEST_TOKEN).start()
    try:
        seed(cluster)
        api = kube_api_client(cluster)
        for dep, hpa in ((PREFILL, "prefill-hpa"), (DECODE, "decode-hpa")):
            k8s.AppsV1Api(api).patch_namespaced_deployment_scale(dep, LLMD_NS, {"spec": {"replicas": 2}})
            k8s.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(LLMD_NS, {
                "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": hpa},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": dep},
                         "minReplicas": 1, "maxReplicas": 8}})
        cluster.reconcile(LLMD_NS)
        connector = LlmdConnectorConfig(inference_pool=POOL, namespace=LLMD_NS,
                                        kubeconfig_path=str(kubeconfig(tmp_path, cluster)))
        with pytest.raises(ConnectorError, match="is scaled by HorizontalPodAutoscaler"):
            make_connector(connector).apply(Decision(3, 3, apply=True, reasons=()), now_s=now_s)
        cluster.clear_requests()
        config = PlannerRunConfig.model_validate({
            "planner": PlannerConfig(namespace=LLMD_NS, mode="advisory", profile=ProfileConfig(dir=str(h200_profile_dir))),
            "metrics": MetricsConfig(prometheus_url=prometheus_server.url),
            "connector": connector,
            "planner_metrics": PlannerMetricsConfig(port=free_port(), addr="127.0.0.1"),
            "advisory": {"autoscaler": "hpa", "prefill_object": "prefill-hpa", "decode_object": "decode-hpa"},
        })
        obs = _observation(requests=600.0, now_s=now_s, replicas=(2, 2))
        out = planner_flow(config=config, replay=ReplayInputs(observation=obs, now_s=now_s))
        sent = [(r.method, r.path) for r in cluster.requests if r.method != "GET"]
    finally:
        cluster.stop()
        stop_endpoints()

    assert sent == []
    assert out["applied"] is False
    p, d = out["decision"]["prefill_replicas"], out["decision"]["decode_replicas"]
    adv = out["advisory"]
    assert adv["now"] == {"prefill": {"advisory": p, "autoscaler": 2}, "decode": {"advisory": d, "autoscaler": 2}}
    # No advisory history yet: only this run's own point is compared, one minute of GPUs each; llm-d's decode
    # servers are TP4 (4 GPUs a replica), prefill TP1: theirs 2 x 1 + 2 x 4 = 10 GPUs.
    assert adv["intervals"] == 1
    assert adv["autoscaler_gpu_hours"] == pytest.approx(10 / 60)
    assert adv["advisory_gpu_hours"] == pytest.approx((p + 4 * d) / 60)
    summary = _latest_artifact(artifact_key("summary", LLMD_NS)).data
    assert "**Advisory vs hpa**" in summary and "only this run has both sides" in summary


def test_the_docs_example_configuration_loads_and_reads_dynamos_planner():
    """docs/advisory.md's YAML, with a profile where it says "the rest", is a valid run configuration."""
    import re

    import yaml

    root = Path(__file__).resolve().parents[2]
    block = re.search(r"```yaml\n(.*?)```", (root / "docs" / "advisory.md").read_text(), re.S).group(1)
    block = block.replace("  # ... the rest as for an applying planner\n",
                          f"  profile: {{dir: {root / 'data' / 'profiles' / 'h200_llama8b_fp8_tp1'}}}\n")
    cfg = PlannerRunConfig.model_validate(yaml.safe_load(block))
    assert cfg.planner.mode == "advisory" and cfg.advisory.window_s == 10800
    assert cfg.advisory.query("decode", namespace=cfg.planner.namespace) == \
        'max(dynamo_planner_num_decode_replicas{namespace="dynamo"})'


def test_a_fleet_file_refuses_an_advisory_deployment_in_one_line(tmp_path):
    """The fleet run applies every grant: a recommend-only deployment in it is refused before any run."""
    from flows.fleet_config import load_fleet

    root = Path(__file__).resolve().parents[2]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"budget: {{gpus: 8}}\ndeployments:\n"
                     f"  - {{name: chat, priority: 1, config: {root / 'configs' / 'planner.yaml'}, "
                     f"overrides: {{planner: {{namespace: chat, mode: advisory}}, "
                     f"planner_metrics: {{pushgateway_url: 'http://127.0.0.1:9091'}}}}}}\n")
    with pytest.raises(ValueError) as err:
        load_fleet(fleet)
    assert str(err.value) == (f"{fleet}: deployment 'chat' has planner.mode advisory, which a fleet run does not "
                              f"honour (it applies every grant); run it as its own planner deployment")


def test_advisory_without_published_gauges_is_one_line(tmp_path):
    bad = tmp_path / "planner.yaml"
    bad.write_text("planner:\n  profile: {dir: x}\n  mode: advisory\n")
    with pytest.raises(ValueError) as err:
        load_run_config(bad)
    assert str(err.value).startswith(f"{bad}: (top level): planner.mode advisory: its own history (the chart's line, "
                                     "the comparison, the stabilization window) comes back from its published gauges, "
                                     "so planner_metrics must be enabled with a pushgateway_url or a port")
    assert "\n" not in str(err.value)
