"""deploy/kubernetes/components/llmd and llmd-keda: the llm-d connector's Role and the KEDA ScaledObjects.

Both components are built with kustomize into an overlay, as a user adds them. The Role
is enforced by the fake llm-d cluster: the connector's whole cycle (Deployments, a
LeaderWorkerSet, DisaggregatedSet role scalers, a paused ScaledObject) passes under it
and fails when any verb is taken away. Each shipped ScaledObject, rendered as llm-d's
guides render theirs (envsubst), is stored through the kit's KEDA CRD without a pruned
field, and its query is evaluated on a real Prometheus scraping the planner's gauge
after a planner run: the replica count KEDA's formula gives is the planner's decision.
"""

from __future__ import annotations

import shutil
import string
import subprocess

import pytest
import yaml
from kubernetes import client as k8s

from connectors.kube import keda
from connectors.config import LlmdConnectorConfig
from connectors.llmd import LlmdConnector
from planner.types import Decision
from tests.support.fixtures_net import free_port, stop_process, wait_http_ok
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from tests.support.fixtures_prometheus import PrometheusServer, prometheus_server  # noqa: F401  (fixture)
from tests.support.k8s_fake_server import TEST_TOKEN, kube_api_client
from tests.support.k8s_llmd_fake import LlmdCluster
from tests.connectors.test_deploy_kubernetes import (
    DEPLOY, by_kind, deserialize, kustomize, passes_only_in_its_namespace, refused_setups, roles_one_verb_short,
)
from tests.connectors.test_llmd_connector import (
    DECODE, NS, POOL, PREFILL, llmd_decode_scaled_object, replicas, seed, seed_disaggregated,
)

PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
PUSHGATEWAY_BIN = "/usr/bin/prometheus-pushgateway"


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> list[dict]:
    """An overlay with both components, built as `kubectl apply -k` would."""
    tree = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(DEPLOY, tree, ignore=shutil.ignore_patterns("tokens.env", "data-token.env"))
    overlay = tree / "overlays" / "llmd"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": NS,
        "components": ["../../components/llmd", "../../components/llmd-keda"]}))
    return kustomize(overlay)


def rendered_scaled_objects(manifests: list[dict]) -> dict[str, dict]:
    """The ScaledObjects with their ${...} placeholders filled (envsubst), by role."""
    values = {"NAMESPACE": NS, "INFERENCE_POOL": POOL, "PREFILL_TARGET": PREFILL, "DECODE_TARGET": DECODE,
              "PROMETHEUS_URL": PROMETHEUS_URL}
    out = {}
    for so in by_kind(manifests, "ScaledObject").values():
        text = string.Template(yaml.safe_dump(so)).substitute(values)  # a placeholder left unfilled raises
        obj = yaml.safe_load(text)
        out[obj["metadata"]["labels"]["llm-d.ai/role"]] = obj
    return out


def decide(prefill: int, decode: int) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=True, reasons=())


# -- the Role --------------------------------------------------------------------------------


def cycle(setup: str, role: dict) -> None:
    """The connector's whole cycle under `role`: validate, read, scale up, the controllers act, read, scale down."""
    cluster = LlmdCluster(token=TEST_TOKEN).start()
    try:
        if setup == "disaggregatedset":
            seed_disaggregated(cluster)
        else:
            seed(cluster, "lws" if setup == "lws" else "deployments")
        if setup == "pause":
            cluster.create(llmd_decode_scaled_object(), namespace=NS)
        cluster.enforce_role(role)
        conn = LlmdConnector(LlmdConnectorConfig(inference_pool=POOL, namespace=NS, on_autoscaler="pause"),
                             api_client=kube_api_client(cluster))
        conn.validate()
        conn.read_fleet(now_s=1e9)
        assert conn.apply(decide(9, 3), now_s=1e9) is not None
        cluster.reconcile(NS)
        assert conn.last_decision_done(now_s=1e9 + 60)
        assert conn.apply(decide(2, 2), now_s=1e9 + 1000) is not None
        cluster.reconcile(NS)
        fleet = conn.read_fleet(now_s=1e9 + 1060)
        assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (2, 2)
    finally:
        cluster.stop()


SETUPS = ("deployments", "lws", "disaggregatedset", "pause")


def test_the_role_grants_only_namespaced_verbs_on_what_the_connector_touches(manifests):
    for doc in manifests:
        if doc["kind"] in ("Role", "RoleBinding"):
            deserialize(doc)  # the client's own models, no unknown field
    role = by_kind(manifests, "Role")["sla-planner-llmd"]
    assert role["metadata"]["namespace"] == NS
    assert not [d for d in manifests if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert not [g for g in granted if "*" in g]
    assert not [g for g in granted if g[2] in ("create", "delete", "update", "watch")]
    (binding,) = [b for b in by_kind(manifests, "RoleBinding").values() if b["roleRef"]["name"] == "sla-planner-llmd"]
    assert [s["name"] for s in binding["subjects"]] == ["sla-planner"]  # the planner's flow runs only


@pytest.mark.integration
def test_the_connectors_whole_cycle_passes_under_the_shipped_role(manifests):
    passes_only_in_its_namespace(cycle, SETUPS, by_kind(manifests, "Role")["sla-planner-llmd"])


@pytest.mark.integration
def test_taking_any_verb_away_from_the_role_breaks_the_cycle(manifests):
    for verb, rule, smaller in roles_one_verb_short(by_kind(manifests, "Role")["sla-planner-llmd"]):
        # One refusal shows the verb is used; stopping there keeps the test lean (~1 s a cycle).
        assert refused_setups(cycle, SETUPS, smaller, verb, first_only=True), \
            f"the cycle passed without {verb} on {rule['resources']}: the Role grants more than it uses"


# -- the ScaledObjects -------------------------------------------------------------------------


@pytest.mark.parametrize("value, current, low, high, tolerance, expected", [
    pytest.param(5.0, 2, 1, 64, 0.0, 5, id="ceil(5 / 1) = 5"),
    pytest.param(4.2, 2, 1, 64, 0.0, 5, id="ceil(4.2 / 1) = 5"),
    pytest.param(9.0, 10, 1, 64, 0.1, 10, id="default tolerance: 9/10 is within 10%, 10 stays"),
    pytest.param(9.0, 10, 1, 64, 0.0, 9, id="tolerance 0: 9"),
    pytest.param(80.0, 10, 1, 64, 0.0, 64, id="clamped to max 64"),
    pytest.param(0.0, 3, 1, 64, 0.0, 1, id="0 with min 1: 1"),
    pytest.param(0.0, 3, 0, 64, 0.0, 0, id="0 with min 0: KEDA deactivates, 0"),
])
def test_kedas_formula_for_an_average_value_trigger(value, current, low, high, tolerance, expected):
    assert keda.keda_replicas(value, threshold=1.0, current=current, min_replicas=low, max_replicas=high,
                              tolerance_up=tolerance, tolerance_down=tolerance) == expected


def test_the_shipped_scaled_objects_are_what_the_connector_accepts(manifests):
    objs = rendered_scaled_objects(manifests)
    assert set(objs) == {"prefill", "decode"}
    for role, so in objs.items():
        assert keda.planner_trigger_problem(so, pool_namespace=NS, pool=POOL, role=role) is None
        assert keda.scale_target(so) == ("apps", "Deployment", PREFILL if role == "prefill" else DECODE)
        assert keda.behavior_tolerance(so, "scaleUp") == keda.behavior_tolerance(so, "scaleDown") == 0.0
        (trigger,) = so["spec"]["triggers"]
        assert trigger["metadata"]["ignoreNullValues"] == "false"
        assert trigger["metadata"]["query"] == keda.planner_query(pool_namespace=NS, pool=POOL, role=role)
    other = keda.planner_trigger_problem(objs["decode"], pool_namespace=NS, pool=POOL, role="prefill")
    assert "{'role': 'decode'} instead of {'role': 'prefill'}" in other


@pytest.mark.integration
def test_kedas_replica_count_from_the_shipped_scaled_objects_is_the_planners_decision(
        prefect_harness, prometheus_server: PrometheusServer, manifests, tmp_path, h200_profile_dir):  # noqa: F811
    """A planner run (actuation keda) pushes its gauge to a real Pushgateway, as flow-run pods do; Prometheus
    scrapes it; each shipped ScaledObject's query, read as KEDA's prometheus scaler reads it, gives through
    KEDA's formula the planner's replicas."""
    from flows.config import PlannerRunConfig, ReplayInputs
    from flows.planner_flow import planner_flow
    from planner.config import PlannerConfig, ProfileConfig
    from connectors.config import PlannerMetricsConfig
    from tests.flows.test_flow_planner import _observation
    from tests.connectors.test_k8s_dynamo import kubeconfig

    objs = rendered_scaled_objects(manifests)
    cluster = LlmdCluster(token=TEST_TOKEN).start()
    port = free_port()
    pushgateway = subprocess.Popen([PUSHGATEWAY_BIN, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/-/ready", timeout_s=30, proc=pushgateway, what="prometheus-pushgateway")
        seed(cluster)
        apps = k8s.AppsV1Api(kube_api_client(cluster))
        for name in (PREFILL, DECODE):
            apps.patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": 1}})
        cluster.reconcile(NS)
        for so in objs.values():
            cluster.create(so, namespace=NS)
        assert cluster.pruned == []  # every field the ScaledObjects set is one KEDA v2.20.2's CRD declares
        cluster.clear_requests()
        config = PlannerRunConfig(
            planner=PlannerConfig(namespace=NS, profile=ProfileConfig(dir=str(h200_profile_dir))),
            connector=LlmdConnectorConfig(inference_pool=POOL, namespace=NS, actuation="keda",
                                          kubeconfig_path=str(kubeconfig(tmp_path, cluster))),
            planner_metrics=PlannerMetricsConfig(enabled=True, pushgateway_url=f"http://127.0.0.1:{port}"),
        )
        prometheus_server.add_scrape_target(f"127.0.0.1:{port}")

        out = planner_flow(config=config, replay=ReplayInputs(observation=_observation(requests=3000.0), now_s=1800.0))

        want = {"prefill": out["decision"]["prefill_replicas"], "decode": out["decision"]["decode_replicas"]}
        assert out["applied"] is True and want["prefill"] > 1
        assert [r for r in cluster.requests if r.path.endswith("/scale")] == []  # KEDA applies, not the planner
        for role, so in objs.items():
            (trigger,) = so["spec"]["triggers"]
            meta = trigger["metadata"]
            prometheus_server.wait_for_series(f'{meta["query"]} == {want[role]}')
            value = keda.query_value(prometheus_server.query(meta["query"]),
                                     ignore_null_values=meta["ignoreNullValues"] == "true", source=so["metadata"]["name"])
            low, high = keda.replica_bounds(so)
            target = keda.scale_target(so)[2]
            got = keda.keda_replicas(value, threshold=float(meta["threshold"]),
                                     current=replicas(cluster, "deployments", target), min_replicas=low,
                                     max_replicas=high, tolerance_up=keda.behavior_tolerance(so, "scaleUp"),
                                     tolerance_down=keda.behavior_tolerance(so, "scaleDown"))
            assert got == want[role], (role, value)
            apps.patch_namespaced_deployment_scale(target, NS, {"spec": {"replicas": got}})  # KEDA's HPA writes it
        # No series (another pool, or the planner never published): with ignoreNullValues false KEDA
        # reports an error and the HPA keeps the replicas, instead of reading 0 and dropping to min.
        empty = keda.planner_query(pool_namespace=NS, pool="no-such-pool", role="decode")
        assert keda.query_value(prometheus_server.query(empty), ignore_null_values=False) is None
        cluster.reconcile(NS)
        fleet = LlmdConnector(config.connector, api_client=kube_api_client(cluster)).read_fleet(now_s=1860.0)
        assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (want["prefill"], want["decode"])
        assert fleet.last_decision.done
    finally:
        prometheus_server.remove_scrape_target(f"127.0.0.1:{port}")
        stop_process(pushgateway, timeout_s=10.0)
        cluster.stop()
