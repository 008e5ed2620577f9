"""The Kubernetes connector on a Dynamo 1.6.1 cluster: the fake proven by Dynamo's own connector, then ours.

The cluster is tests/k8s_dynamo_fake.DynamoCluster, built from the CRDs Dynamo
ships. First Dynamo 1.6.1's own KubernetesConnector (its environment, unmodified)
runs against it and must send exactly the requests recorded from it against a
recording server (../shared/dynamo/k8s-requests.jsonl), with the scaling adapters
present and absent, and the objects must end as Dynamo meant them. Then our
connector runs the same scenarios, plus a pre-1.3 (v1alpha1-only) cluster: it
changes the adapters' replicas and nothing the operator would revert.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from connectors.base import ConnectorError, FleetChangedError, ResourceAccessError
from connectors.config import KubernetesConnectorConfig
from connectors.factory import make_connector
from connectors.kubernetes import KubernetesConnector
from planner.types import Decision
from tests.support.fixtures_dynamo import dynamo_python, shared_dynamo  # noqa: F401
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from tests.support.k8s_dynamo_fake import CRD_DIR, DGD, DGDSA, DynamoCluster
from tests.support.k8s_fake_server import TEST_TOKEN, kube_api_client, load_manifest

NS, NAME = "sla-test", "vllm-disagg"  # as in the recording
DRIVER = Path(__file__).resolve().parents[1] / "support" / "dynamo_drivers" / "k8s_drive.py"
T0_S = 1_700_000_000.0


def decide(prefill: int, decode: int) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=True, reasons=())


def example_dgd(*, adapters: bool) -> dict:
    obj = yaml.safe_load((CRD_DIR / "example-dgd-vllm-disagg-planner.v1beta1.yaml").read_text())
    if not adapters:
        for comp in obj["spec"]["components"]:
            comp.pop("scalingAdapter", None)
    # The component order of the DGD the recording was made against (the JSON patch names indices).
    order = ["Frontend", "prefill", "decode"]
    obj["spec"]["components"].sort(key=lambda c: order.index(c["name"]) if c["name"] in order else len(order))
    return obj


@pytest.fixture
def cluster(request):
    server = DynamoCluster(operator=getattr(request, "param", "current"), token=TEST_TOKEN).start()
    yield server
    server.stop()


def seeded(cluster: DynamoCluster, *, adapters: bool) -> DynamoCluster:
    cluster.create_dgd(example_dgd(adapters=adapters), namespace=NS)
    cluster.reconcile(NS, NAME)
    cluster.clear_requests()
    cluster.pruned.clear()
    return cluster


def kubeconfig(tmp_path: Path, cluster: DynamoCluster) -> Path:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
        "users": [{"name": "planner", "user": {"token": TEST_TOKEN}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "planner"}}],
    }))
    return path


def recorded(shared_dynamo: Path, mode: str) -> list[tuple]:  # noqa: F811
    rows = [json.loads(line) for line in (shared_dynamo / "k8s-requests.jsonl").read_text().splitlines()]
    return [(r["method"], r["path"], r["query"], r["content_type"], r["body"]) for r in rows
            if r.get("mode") == mode]


def sent(cluster: DynamoCluster) -> list[tuple]:
    from urllib.parse import urlencode

    return [(r.method, r.path, urlencode({k: v[0] for k, v in r.query.items()}) or None,
             r.content_type or "application/json", r.body) for r in cluster.requests]


def components(cluster: DynamoCluster) -> dict[str, int]:
    return {c["name"]: c.get("replicas") for c in cluster.stored(DGD, NS, NAME)["spec"]["components"]}


@pytest.mark.integration
@pytest.mark.parametrize("adapters, mode", [(True, "dgdsa"), (False, "nodgdsa")], ids=["adapters", "no adapters"])
def test_dynamos_own_connector_scales_the_fake_as_recorded(cluster, tmp_path, dynamo_python, shared_dynamo,  # noqa: F811
                                                           adapters, mode):
    seeded(cluster, adapters=adapters)
    done = subprocess.run(
        [str(dynamo_python), str(DRIVER), NS], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "KUBECONFIG": str(kubeconfig(tmp_path, cluster)), "DYN_PARENT_DGD_K8S_NAME": NAME},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps][:2] == ["validate_deployment", "get_model_name"]
    assert sent(cluster) == recorded(shared_dynamo, mode)
    if adapters:
        assert {n: cluster.stored(DGDSA, NS, f"{NAME}-{n}")["spec"]["replicas"] for n in ("prefill", "decode")} \
            == {"prefill": 3, "decode": 2}
        assert components(cluster)["prefill"] == 1  # the operator copies it over on its next reconcile
        cluster.reconcile(NS, NAME)
    assert components(cluster) == {"Frontend": 1, "decode": 2, "prefill": 3}
    assert cluster.pruned == []  # Dynamo sends only fields its CRD declares


@pytest.mark.integration
def test_a_direct_replicas_edit_under_an_adapter_is_put_back(cluster):
    seeded(cluster, adapters=True)
    client = kube_api_client(cluster)
    from kubernetes import client as k8s

    api = k8s.CustomObjectsApi(client)
    api.patch_namespaced_custom_object("nvidia.com", "v1beta1", NS, DGD, NAME,
                                       [{"op": "replace", "path": "/spec/components/2/replicas", "value": 7}],
                                       _content_type="application/json-patch+json")
    assert components(cluster)["decode"] == 7
    cluster.reconcile(NS, NAME)
    assert components(cluster)["decode"] == 1  # the adapter (still 1) wins


def ours(cluster: DynamoCluster, **config) -> KubernetesConnector:
    return KubernetesConnector(KubernetesConnectorConfig(dgd_name=NAME, namespace=NS, **config),
                               api_client=kube_api_client(cluster))


@pytest.mark.integration
def test_with_adapters_we_scale_the_adapters_and_nothing_is_reverted(cluster):
    seeded(cluster, adapters=True)
    conn = ours(cluster)
    conn.validate()
    assert conn.version == "v1beta1"
    before = conn.read_fleet(now_s=T0_S)
    assert (before.prefill.current_replicas, before.decode.current_replicas) == (1, 1)
    assert (before.prefill.gpus_per_replica, before.decode.gpus_per_replica) == (1, 1)

    record = conn.apply(decide(3, 2), now_s=T0_S)

    assert (record.decision_id, record.prefill_replicas, record.decode_replicas) == (1, 3, 2)
    scales = [r for r in cluster.requests if r.path.endswith("/scale") and r.method == "PATCH"]
    assert sorted((r.path.rsplit("/", 2)[1], r.body["spec"]["replicas"]) for r in scales) == [
        (f"{NAME}-decode", 2), (f"{NAME}-prefill", 3)]
    assert all(r.content_type == "application/merge-patch+json" for r in scales)
    dgd_patches = [r for r in cluster.requests if r.method == "PATCH" and r.path.endswith(f"/{DGD}/{NAME}")]
    assert len(dgd_patches) == 1 and dgd_patches[0].content_type == "application/json-patch+json"
    assert all(op["path"].startswith("/metadata/") for op in dgd_patches[0].body)  # annotations only
    assert cluster.pruned == []
    # The operator reconciles: the components follow the adapters; nothing of ours is put back.
    cluster.reconcile(NS, NAME)
    assert components(cluster) == {"Frontend": 1, "decode": 2, "prefill": 3}
    after = conn.read_fleet(now_s=T0_S + 60)
    assert (after.prefill.current_replicas, after.decode.current_replicas) == (3, 2)
    assert (after.prefill.ready_replicas, after.decode.ready_replicas) == (3, 2)
    assert after.last_decision.done and after.last_decision.decision_id == 1
    # A run that changes nothing writes nothing.
    cluster.clear_requests()
    assert conn.apply(decide(3, 2), now_s=T0_S + 60) is None
    assert [r.method for r in cluster.requests if r.method != "GET"] == []  # same recommendation in effect


@pytest.mark.integration
def test_not_done_until_the_operator_reports_the_adapters_replicas(cluster):
    seeded(cluster, adapters=True)
    conn = ours(cluster)
    conn.apply(decide(2, 4), now_s=T0_S)
    assert conn.last_decision_done() is False  # the operator has not reconciled
    cluster.reconcile(NS, NAME)
    cluster.set_component_status(NS, NAME, "decode", availableReplicas=3)
    assert conn.last_decision_done() is False  # one decode replica still starting
    cluster.set_component_status(NS, NAME, "decode", availableReplicas=4)
    assert conn.last_decision_done() is True


@pytest.mark.integration
def test_without_adapters_one_json_patch_as_dynamo_does(cluster):
    seeded(cluster, adapters=False)
    conn = ours(cluster)
    record = conn.apply(decide(3, 2), now_s=T0_S)
    assert record.decision_id == 1
    (patch,) = [r for r in cluster.requests if r.method == "PATCH"]
    assert patch.content_type == "application/json-patch+json"
    replica_ops = [op for op in patch.body if op["path"].startswith("/spec/")]
    assert replica_ops == [
        {"op": "test", "path": "/spec/components/1/name", "value": "prefill"},
        {"op": "add", "path": "/spec/components/1/replicas", "value": 3},
        {"op": "test", "path": "/spec/components/2/name", "value": "decode"},
        {"op": "add", "path": "/spec/components/2/replicas", "value": 2},
    ]
    assert [r for r in cluster.requests if "/scale" in r.path and r.method == "PATCH"] == []
    assert components(cluster) == {"Frontend": 1, "decode": 2, "prefill": 3}
    assert cluster.pruned == []


@pytest.mark.integration
def test_a_concurrent_writer_makes_us_reread_and_retry(cluster):
    seeded(cluster, adapters=False)
    conn = ours(cluster)
    conn.read_fleet(now_s=T0_S)  # discovery done
    cluster.before_next("PATCH", lambda: cluster.set_component_status(NS, NAME, "decode", availableReplicas=1))
    record = conn.apply(decide(2, 2), now_s=T0_S)
    assert record.decision_id == 1
    patches = [r for r in cluster.requests if r.method == "PATCH"]
    assert len(patches) == 2  # the first one's resourceVersion test failed (422), the re-read one landed
    assert components(cluster)["prefill"] == 2


@pytest.mark.integration
def test_after_a_conflict_the_old_decision_is_never_written_over_another_writers_replicas(cluster):
    """Decided from decode 1; before our patch lands an operator scales decode to 10 (our
    resourceVersion test fails). The re-read sees 10: writing our decode 5 would undo a change
    nobody decided against, so the connector refuses and the flow decides again."""
    seeded(cluster, adapters=False)
    conn = ours(cluster)
    fleet = conn.read_fleet(now_s=T0_S)
    decision = Decision(prefill_replicas=1, decode_replicas=5, apply=True, reasons=(),
                        based_on=(fleet.prefill.current_replicas, fleet.decode.current_replicas))

    def operator_scales_decode():
        obj = cluster.stored(DGD, NS, NAME)
        next(c for c in obj["spec"]["components"] if c["name"] == "decode")["replicas"] = 10
        cluster._write(DGD, NS, NAME, obj)

    cluster.before_next("PATCH", operator_scales_decode)
    with pytest.raises(FleetChangedError, match=r"decode 1 -> 10\); the decision \(prefill 1, decode 5\)"):
        conn.apply(decision, now_s=T0_S)
    assert components(cluster)["decode"] == 10
    assert len([r for r in cluster.requests if r.method == "PATCH"]) == 1  # the conflicting one, no retry


@pytest.mark.integration
@pytest.mark.parametrize("cluster", ["v1alpha1"], indirect=True)
def test_a_pre_1_3_operator_gets_a_merge_patch_of_spec_services(cluster, shared_data):
    manifest = load_manifest(shared_data / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D" / "disagg.yaml")
    name = manifest["metadata"]["name"]
    cluster.create(manifest, namespace=NS)
    cluster.reconcile(NS, name)
    conn = KubernetesConnector(KubernetesConnectorConfig(dgd_name=name, namespace=NS),
                               api_client=kube_api_client(cluster))
    conn.validate()
    assert conn.version == "v1alpha1"
    conn.apply(decide(2, 3), now_s=T0_S)
    (patch,) = [r for r in cluster.requests if r.method == "PATCH"]
    assert patch.content_type == "application/merge-patch+json"
    assert {k: v["replicas"] for k, v in patch.body["spec"]["services"].items()} in (
        {"prefill": 2, "decode": 3}, {"VllmPrefillWorker": 2, "VllmDecodeWorker": 3})


@pytest.mark.integration
def test_v1alpha1_on_a_current_cluster_is_converted(cluster):
    seeded(cluster, adapters=False)
    conn = ours(cluster, api="v1alpha1")
    fleet = conn.read_fleet(now_s=T0_S)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (1, 1)
    conn.apply(decide(2, 2), now_s=T0_S)
    assert components(cluster) == {"Frontend": 1, "decode": 2, "prefill": 2}


@pytest.mark.integration
@pytest.mark.parametrize("cluster", ["none"], indirect=True)
def test_a_cluster_without_dynamos_crds_is_one_clear_line(cluster):
    with pytest.raises(ResourceAccessError) as info:
        ours(cluster).validate()
    text = str(info.value)
    assert "serves none of the known dynamographdeployments.nvidia.com versions (v1beta1, v1alpha1)" in text
    assert "\n" not in text


@pytest.mark.integration
def test_a_dgd_without_prefill_and_decode_components_is_one_clear_line(cluster):
    obj = example_dgd(adapters=False)
    obj["spec"]["components"] = [c for c in obj["spec"]["components"] if c["type"] == "frontend"]
    cluster.create_dgd(obj, namespace=NS)
    with pytest.raises(ResourceAccessError) as info:
        ours(cluster).validate()
    text = str(info.value)
    assert "0 components of type 'prefill'" in text and "0 components of type 'decode'" in text
    assert "components: ['Frontend']" in text and "\n" not in text


@pytest.mark.integration
def test_a_refused_adapter_scale_names_the_grant_it_needs(cluster):
    seeded(cluster, adapters=True)
    cluster.forbid_on("dynamographdeploymentscalingadapters/scale", "patch")
    with pytest.raises(ConnectorError) as info:
        ours(cluster).apply(decide(2, 2), now_s=T0_S)
    text = str(info.value)
    assert "403 Forbidden" in text and "dynamographdeploymentscalingadapters.nvidia.com/scale" in text


def test_factory_builds_the_kubernetes_connector_with_api_auto():
    assert KubernetesConnectorConfig(dgd_name="x").api == "auto"
    with pytest.raises(ValueError):
        KubernetesConnectorConfig(dgd_name="x", api="v2")
    assert make_connector  # the factory is exercised by tests/connectors/test_connector_kubernetes.py


@pytest.mark.integration
def test_a_planner_run_scales_the_adapters_and_the_operator_keeps_it(prefect_harness, cluster, tmp_path,  # noqa: F811
                                                                       h200_profile_dir):
    """The planner flow itself (Prefect harness), Kubernetes connector through a kubeconfig, adapters present."""
    from flows.config import PlannerRunConfig, ReplayInputs
    from flows.planner_flow import planner_flow
    from planner.config import PlannerConfig, ProfileConfig
    from tests.flows.test_flow_planner import _observation

    seeded(cluster, adapters=True)
    config = PlannerRunConfig(
        planner=PlannerConfig(namespace=NS, profile=ProfileConfig(dir=str(h200_profile_dir))),
        connector=KubernetesConnectorConfig(dgd_name=NAME, namespace=NS,
                                            kubeconfig_path=str(kubeconfig(tmp_path, cluster))),
    )
    out = planner_flow(config=config, replay=ReplayInputs(observation=_observation(requests=3000.0), now_s=1800.0))

    assert out["applied"] is True
    want = {"prefill": out["decision"]["prefill_replicas"], "decode": out["decision"]["decode_replicas"]}
    assert want["prefill"] > 1
    adapters = {n: cluster.stored(DGDSA, NS, f"{NAME}-{n}")["spec"]["replicas"] for n in ("prefill", "decode")}
    assert adapters == want
    writes = [r for r in cluster.requests if r.method == "PATCH" and not r.path.endswith("/scale")]
    assert all(op["path"].startswith("/metadata/") for r in writes for op in r.body)  # no replicas on the DGD
    cluster.reconcile(NS, NAME)
    assert components(cluster) == {"Frontend": 1, **want}  # the operator followed the adapters; nothing put back
    assert cluster.pruned == []
