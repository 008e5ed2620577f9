"""The llm-d connector on a fake cluster serving the kit's CRDs: it scales an InferencePool's prefill and decode
model servers (Deployments, LeaderWorkerSets, DisaggregatedSet role scalers) through /scale, and nothing else.

The cluster is tests/k8s_llmd_fake.LlmdCluster; its built-in kinds are first driven with
the official client's typed API (apps/v1 Deployment scale, autoscaling/v2 HPA), which
deserializes every answer into its models, so the fake answers as the real server does.
The workloads are llm-d's own example manifests (../shared/llmd/examples).
"""

from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes import client as k8s

from connectors.kube import keda
from connectors.base import ConnectorError, ResourceAccessError
from connectors.config import LlmdConnectorConfig
from connectors.factory import make_connector
from connectors.llmd import LlmdConnector
from planner.types import Decision
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from tests.support.k8s_fake_server import TEST_TOKEN, kube_api_client
from tests.support.k8s_llmd_fake import LlmdCluster, example, pool_manifest

NS, POOL = "llm-d-pd", "pd-pool"
GUIDE = {"llm-d.ai/guide": "pd-disaggregation"}
PREFILL, DECODE = "pd-disaggregation-nvidia-gpu-vllm-prefill", "pd-disaggregation-nvidia-gpu-vllm-decode"
T0_S = 1_700_000_000.0


def decide(prefill: int, decode: int) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=True, reasons=())


@pytest.fixture
def cluster():
    server = LlmdCluster(token=TEST_TOKEN).start()
    yield server
    server.stop()


def pd_deployments() -> list[dict]:
    """llm-d's P/D guide: prefill 8 x TP1, decode 2 x TP4 Deployments."""
    return [d for d in example("llm-d-pd-deployments.rendered.yaml") if d["kind"] == "Deployment"]


def bystander() -> dict:
    """A Deployment in the same namespace that the pool does not select (another model's servers)."""
    other = copy.deepcopy(pd_deployments()[0])
    other["metadata"]["name"] = "another-model-decode"
    for labels in (other["metadata"]["labels"], other["spec"]["selector"]["matchLabels"],
                   other["spec"]["template"]["metadata"]["labels"]):
        labels["llm-d.ai/guide"] = "another-guide"
    return other


def decode_lws() -> dict:
    """llm-d's multi-host decode LeaderWorkerSet (2 pods a group), labelled into the pool as overlays do, 4 GPUs a pod."""
    (lws,) = example("llm-d-recipe-multihost-decode-lws.yaml")
    lws["metadata"]["name"] = DECODE
    template = lws["spec"]["leaderWorkerTemplate"]
    labels = {**GUIDE, "llm-d.ai/role": "decode"}
    for part in ("leaderTemplate", "workerTemplate"):
        template[part].setdefault("metadata", {})["labels"] = dict(labels)
        for container in template[part]["spec"]["containers"]:
            container["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    return lws


def seed(cluster: LlmdCluster, variant: str = "deployments", *, pool_labels: dict = GUIDE) -> LlmdCluster:
    cluster.create(pool_manifest(POOL, pool_labels), namespace=NS)
    cluster.create(bystander(), namespace=NS)
    for dep in pd_deployments():
        if variant == "lws" and dep["metadata"]["name"] == DECODE:
            continue
        cluster.create(dep, namespace=NS)
    if variant == "lws":
        cluster.create(decode_lws(), namespace=NS)
    cluster.reconcile(NS)
    cluster.clear_requests()
    return cluster


def seed_disaggregated(cluster: LlmdCluster) -> LlmdCluster:
    """What LWS's controller makes of llm-d's DisaggregatedSet (slices 2, roles with scaling.mode External):
    a role scaler per role and one LeaderWorkerSet per slice and role, made ready."""
    (ds,) = example("llm-d-pd-disaggregatedset.yaml")
    cluster.create(pool_manifest(POOL, GUIDE), namespace=NS)
    for role in ds["spec"]["roles"]:
        cluster.create({"apiVersion": "disaggregatedset.x-k8s.io/v1", "kind": "DisaggregatedSetRoleScaler",
                        "metadata": {"name": f"pd-disagg-{role['name']}"},
                        "spec": {"replicas": role["spec"]["replicas"]}}, namespace=NS)
        for slice_ in ("0", "1"):
            cluster.create({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                            "metadata": {"name": f"pd-disagg-{slice_}-7f9c-{role['name']}", "labels": {
                                "disaggregatedset.x-k8s.io/name": "pd-disagg", "disaggregatedset.x-k8s.io/role":
                                    role["name"], "disaggregatedset.x-k8s.io/slice": slice_}},
                            "spec": {"replicas": role["spec"]["replicas"],
                                     "leaderWorkerTemplate": role["spec"]["leaderWorkerTemplate"]}}, namespace=NS)
    cluster.reconcile(NS)
    cluster.clear_requests()
    return cluster


def ours(cluster: LlmdCluster, **config) -> LlmdConnector:
    return LlmdConnector(LlmdConnectorConfig(inference_pool=POOL, namespace=NS, **config),
                         api_client=kube_api_client(cluster))


def writes(cluster: LlmdCluster) -> list[tuple[str, object]]:
    return [(r.path.split(f"/namespaces/{NS}/")[1], r.body) for r in cluster.requests if r.method != "GET"]


def replicas(cluster: LlmdCluster, plural: str, name: str) -> int:
    return cluster.stored(plural, NS, name)["spec"]["replicas"]


# -- the fake, proven with the official client's typed API ------------------------------------


@pytest.mark.integration
def test_the_official_clients_typed_api_reads_and_scales_deployments_and_hpas_on_the_fake(cluster):
    seed(cluster)
    api = kube_api_client(cluster)
    apps, autoscaling = k8s.AppsV1Api(api), k8s.AutoscalingV2Api(api)
    listed = apps.list_namespaced_deployment(NS)
    assert sorted(d.metadata.name for d in listed.items) == sorted(["another-model-decode", PREFILL, DECODE])
    decode = apps.read_namespaced_deployment(DECODE, NS)
    assert decode.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    assert decode.status.ready_replicas == 2
    scale = apps.read_namespaced_deployment_scale(DECODE, NS)
    assert isinstance(scale, k8s.V1Scale) and scale.spec.replicas == 2 and "llm-d.ai/role=decode" in scale.status.selector
    # kubectl scale and an HPA send a strategic merge patch to /scale; the typed client a merge patch as we send it.
    apps.patch_namespaced_deployment_scale(DECODE, NS, {"spec": {"replicas": 3}})
    assert apps.read_namespaced_deployment(DECODE, NS).spec.replicas == 3
    hpa = k8s.V2HorizontalPodAutoscaler(
        metadata=k8s.V1ObjectMeta(name="decode-hpa"),
        spec=k8s.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=k8s.V2CrossVersionObjectReference(api_version="apps/v1", kind="Deployment", name=DECODE),
            min_replicas=1, max_replicas=4,
            metrics=[k8s.V2MetricSpec(type="External", external=k8s.V2ExternalMetricSource(
                metric=k8s.V2MetricIdentifier(name="wva_desired_replicas"),
                target=k8s.V2MetricTarget(type="AverageValue", average_value="1")))]))
    autoscaling.create_namespaced_horizontal_pod_autoscaler(NS, hpa)
    (read,) = autoscaling.list_namespaced_horizontal_pod_autoscaler(NS).items
    assert read.spec.scale_target_ref.name == DECODE and read.spec.metrics[0].external.target.average_value == "1"
    assert cluster.pruned == []  # llm-d's manifests and the client's objects hold only declared fields
    cluster.create({**pool_manifest("x", GUIDE), "spec": {**pool_manifest("x", GUIDE)["spec"], "bogus": 1}},
                   namespace=NS)
    assert cluster.pruned == ["spec.bogus"]  # the kit's InferencePool CRD prunes what it does not declare


# -- a planner run ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["deployments", "lws"])
def test_a_planner_run_scales_the_pools_prefill_and_decode_and_nothing_else(prefect_harness, cluster, tmp_path,  # noqa: F811
                                                                          h200_profile_dir, variant):
    """The planner flow (Prefect harness) through a kubeconfig: llm-d's P/D Deployments, or a multi-host decode LWS."""
    from flows.config import PlannerRunConfig, ReplayInputs
    from flows.planner_flow import planner_flow
    from planner.config import PlannerConfig, ProfileConfig
    from tests.flows.test_flow_planner import _observation
    from tests.connectors.test_k8s_dynamo import kubeconfig

    seed(cluster, variant)
    apps = k8s.AppsV1Api(kube_api_client(cluster))
    for name in (PREFILL, DECODE) if variant == "deployments" else (PREFILL,):
        apps.patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": 1}})  # one server each, as the replay
    cluster.reconcile(NS)
    decode_kind = "leaderworkersets" if variant == "lws" else "deployments"
    config = PlannerRunConfig(
        planner=PlannerConfig(namespace=NS, profile=ProfileConfig(dir=str(h200_profile_dir))),
        connector=LlmdConnectorConfig(inference_pool=POOL, namespace=NS,
                                      kubeconfig_path=str(kubeconfig(tmp_path, cluster))),
    )
    fleet = make_connector(config.connector).read_fleet(now_s=1800.0)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (1, 1)
    assert (fleet.prefill.gpus_per_replica, fleet.decode.gpus_per_replica) == (1, 8 if variant == "lws" else 4)
    cluster.clear_requests()

    out = planner_flow(config=config, replay=ReplayInputs(observation=_observation(requests=3000.0), now_s=1800.0))

    assert out["applied"] is True
    want = {"prefill": out["decision"]["prefill_replicas"], "decode": out["decision"]["decode_replicas"]}
    assert want["prefill"] > 1
    assert {"prefill": replicas(cluster, "deployments", PREFILL), "decode": replicas(cluster, decode_kind, DECODE)} \
        == want
    written = writes(cluster)
    scale_paths = sorted(p for p, _ in written if p.endswith("/scale"))
    expected = sorted(p for p, n in ((f"deployments/{PREFILL}/scale", True),
                                     (f"{decode_kind}/{DECODE}/scale", want["decode"] != 1)) if n)
    assert scale_paths == expected
    # Besides /scale, only the pool's annotations (the decision and the recommendation history).
    others = [(p, b) for p, b in written if not p.endswith("/scale")]
    assert [p for p, _ in others] == [f"inferencepools/{POOL}"]
    assert set(others[0][1]) == {"metadata"} and set(others[0][1]["metadata"]) == {"resourceVersion", "annotations"}
    assert replicas(cluster, "deployments", "another-model-decode") == 2  # the bystander is untouched
    cluster.reconcile(NS)
    done = make_connector(config.connector).read_fleet(now_s=1860.0)
    assert done.last_decision.done and (done.prefill.ready_replicas, done.decode.ready_replicas) == \
        (want["prefill"], want["decode"])


@pytest.mark.integration
def test_a_disaggregated_sets_roles_are_scaled_through_their_role_scalers_per_slice(cluster):
    """llm-d's DisaggregatedSet variant: slices 2, scaling.mode External; the controller made one LWS per slice
    and role and a role scaler per role; one scaler replica is one group in each slice."""
    seed_disaggregated(cluster)
    assert cluster.pruned == []
    conn = ours(cluster)
    conn.validate()
    fleet = conn.read_fleet(now_s=T0_S)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (8, 2)  # 4 and 1 per slice
    assert (fleet.prefill.gpus_per_replica, fleet.decode.gpus_per_replica) == (1, 4)
    cluster.clear_requests()

    record = conn.apply(decide(5, 4), now_s=T0_S)

    assert (record.prefill_replicas, record.decode_replicas) == (6, 4)  # 5 rounds up to 3 a slice
    assert sorted(p for p, _ in writes(cluster) if p.endswith("/scale")) == [
        "disaggregatedsetrolescalers/pd-disagg-decode/scale", "disaggregatedsetrolescalers/pd-disagg-prefill/scale"]
    assert replicas(cluster, "disaggregatedsetrolescalers", "pd-disagg-prefill") == 3
    assert not conn.last_decision_done()
    cluster.reconcile(NS)  # the DisaggregatedSet controller applies the scalers to every slice
    assert replicas(cluster, "leaderworkersets", "pd-disagg-1-7f9c-prefill") == 3
    after = conn.read_fleet(now_s=T0_S + 60)
    assert (after.prefill.ready_replicas, after.decode.ready_replicas) == (6, 4) and after.last_decision.done
    cluster.clear_requests()
    assert conn.apply(decide(5, 4), now_s=T0_S + 60) is None  # 5 is still 3 a slice: nothing to write
    assert [p for p, _ in writes(cluster) if p.endswith("/scale")] == []


# -- other autoscalers -----------------------------------------------------------------------


def llmd_decode_scaled_object() -> dict:
    """llm-d's token-aware decode ScaledObject (on vLLM's KV usage), as its guide applies it."""
    (so,) = example("keda-token-aware-pd-decode-scaledobject.yaml")
    return so


@pytest.mark.integration
def test_a_conflicting_hpa_is_refused_in_one_line_naming_it(cluster):
    seed(cluster)
    k8s.AutoscalingV2Api(kube_api_client(cluster)).create_namespaced_horizontal_pod_autoscaler(NS, {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "decode-hpa"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DECODE},
                 "minReplicas": 1, "maxReplicas": 8}})
    cluster.clear_requests()
    with pytest.raises(ConnectorError) as info:
        ours(cluster).apply(decide(8, 3), now_s=T0_S)
    text = str(info.value)
    assert f"decode target deployments.apps/{DECODE} is scaled by HorizontalPodAutoscaler {NS}/decode-hpa" in text
    assert "\n" not in text and writes(cluster) == []


@pytest.mark.integration
def test_a_conflicting_scaled_object_is_refused_or_paused_as_configured(cluster):
    seed(cluster)
    so = llmd_decode_scaled_object()
    cluster.create(so, namespace=NS)
    # The HPA KEDA makes for it (keda-hpa-<name>, owned by the ScaledObject) is reported as the ScaledObject.
    cluster.create({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {
        "name": f"keda-hpa-{so['metadata']['name']}", "ownerReferences": [{
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": so["metadata"]["name"], "uid": "u1"}]},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DECODE},
                 "minReplicas": 1, "maxReplicas": 10}}, namespace=NS)
    with pytest.raises(ConnectorError) as info:
        ours(cluster).validate()
    text = str(info.value)
    assert (f"is scaled by KEDA ScaledObject {NS}/pd-disaggregation-nvidia-gpu-vllm-decode-token-aware" in text
            and "on_autoscaler: pause" in text and "\n" not in text)
    cluster.clear_requests()

    record = ours(cluster, on_autoscaler="pause").apply(decide(8, 3), now_s=T0_S)

    assert record.decode_replicas == 3 and replicas(cluster, "deployments", DECODE) == 3
    so = cluster.stored("scaledobjects", NS, "pd-disaggregation-nvidia-gpu-vllm-decode-token-aware")
    assert so["metadata"]["annotations"][keda.PAUSED_REPLICAS] == "3"
    order = [p.split("/")[0] for p, _ in writes(cluster)]
    assert order == ["inferencepools", "scaledobjects", "deployments"]  # paused before /scale is written


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_pool_whose_servers_carry_no_role_label_is_one_line_naming_the_pool(cluster):
    cluster.create(pool_manifest(POOL, GUIDE), namespace=NS)
    for dep in pd_deployments():
        for labels in (dep["metadata"]["labels"], dep["spec"]["selector"]["matchLabels"],
                       dep["spec"]["template"]["metadata"]["labels"]):
            labels.pop("llm-d.ai/role")
        cluster.create(dep, namespace=NS)
    with pytest.raises(ResourceAccessError) as info:
        ours(cluster).validate()
    text = str(info.value)
    assert text.startswith(f"InferencePool {NS}/{POOL}: none of its model servers") and "llm-d.ai/role" in text
    assert "\n" not in text


@pytest.mark.integration
@pytest.mark.parametrize("labels, expected", [
    ({"llm-d.ai/guide": "nothing-runs-this"}, "no Deployment or LeaderWorkerSet in its namespace has pods"),
    ({**GUIDE, "llm-d.ai/role": "prefill"}, "no decode model server (none with llm-d.ai/role=decode)"),
], ids=["selects nothing", "selects only prefill"])
def test_a_pool_whose_roles_match_nothing_is_one_line_naming_the_pool(cluster, labels, expected):
    seed(cluster, pool_labels=labels)
    with pytest.raises(ResourceAccessError) as info:
        ours(cluster).validate()
    assert str(info.value).startswith(f"InferencePool {NS}/{POOL}: ") and expected in str(info.value)


@pytest.mark.integration
def test_a_combined_prefill_decode_server_is_named(cluster):
    seed(cluster)
    both = copy.deepcopy(pd_deployments()[0])
    both["metadata"]["name"] = "aggregated"
    for labels in (both["spec"]["selector"]["matchLabels"], both["spec"]["template"]["metadata"]["labels"]):
        labels["llm-d.ai/role"] = "both"  # llm-d's deprecated alias of prefill-decode
    cluster.create(both, namespace=NS)
    with pytest.raises(ResourceAccessError, match=r"deployments.apps/aggregated serve both roles"):
        ours(cluster).validate()


@pytest.mark.integration
def test_keda_actuation_names_a_scaled_object_on_another_metric(cluster):
    seed(cluster)
    cluster.create(llmd_decode_scaled_object(), namespace=NS)
    prefill = copy.deepcopy(llmd_decode_scaled_object())
    prefill["metadata"]["name"] = "planner-prefill"
    prefill["spec"]["scaleTargetRef"]["name"] = PREFILL
    prefill["spec"]["triggers"] = [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
        "serverAddress": "http://prometheus:9090", "threshold": "1",
        "query": keda.planner_query(pool_namespace=NS, pool=POOL, role="prefill")}}]
    cluster.create(prefill, namespace=NS)
    with pytest.raises(ConnectorError) as info:
        ours(cluster, actuation="keda").validate()
    text = str(info.value)
    assert f"ScaledObject {NS}/pd-disaggregation-nvidia-gpu-vllm-decode-token-aware does not apply" in text
    assert "another metric (decode-kv-utilization: sum(vllm:kv_cache_usage_perc" in text and "\n" not in text


def test_the_factory_builds_the_llmd_connector_and_the_config_checks_its_label():
    assert LlmdConnectorConfig(inference_pool="p").role_label == "llm-d.ai/role"
    with pytest.raises(ValueError, match="not a Kubernetes label key"):
        LlmdConnectorConfig(inference_pool="p", role_label="bad key!")
    assert yaml.safe_dump(LlmdConnectorConfig(inference_pool="p").model_dump())  # plain data, for the UI form


def planner_scaled_object(role: str, *, kind: tuple[str, str], target: str, query: str) -> dict:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": f"planner-{role}"},
            "spec": {"scaleTargetRef": {"apiVersion": kind[0], "kind": kind[1], "name": target},
                     "minReplicaCount": 1, "maxReplicaCount": 16,
                     "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                         "serverAddress": "http://prometheus:9090", "threshold": "1", "query": query}}]}}


@pytest.mark.integration
def test_keda_actuation_on_role_scalers_divides_by_the_slices_and_writes_no_scale(cluster):
    seed_disaggregated(cluster)
    kind = ("disaggregatedset.x-k8s.io/v1", "DisaggregatedSetRoleScaler")
    for role in ("prefill", "decode"):
        cluster.create(planner_scaled_object(role, kind=kind, target=f"pd-disagg-{role}",
                                             query=keda.planner_query(pool_namespace=NS, pool=POOL, role=role)),
                       namespace=NS)
    with pytest.raises(ConnectorError, match=r"apply in each of 2 slices, so its query must end with / 2"):
        ours(cluster, actuation="keda").validate()
    for role in ("prefill", "decode"):
        so = cluster.stored("scaledobjects", NS, f"planner-{role}")
        so["spec"]["triggers"][0]["metadata"]["query"] += " / 2"
        cluster._write("scaledobjects", NS, f"planner-{role}", so)
    conn = ours(cluster, actuation="keda")
    conn.validate()
    cluster.clear_requests()
    record = conn.apply(decide(5, 4), now_s=T0_S)
    assert (record.prefill_replicas, record.decode_replicas) == (6, 4)
    assert [p for p, _ in writes(cluster)] == [f"inferencepools/{POOL}"]  # KEDA writes the scalers, not us
    # KEDA's formula on the published 5 prefill: ceil((5 / 2) / 1) = 3 a slice, 6 in all, the recorded target.
    assert keda.keda_replicas(5 / 2, threshold=1.0, current=4, min_replicas=1, max_replicas=16,
                              tolerance_up=0.0, tolerance_down=0.0) * 2 == record.prefill_replicas


@pytest.mark.integration
def test_a_cluster_without_leaderworkersets_or_keda_reads_as_none_of_them():
    """Only InferencePools and the built-in kinds served: the LWS and ScaledObject lists answer 404, read as empty."""
    cluster = LlmdCluster(token=TEST_TOKEN, kinds=("inferencepools", "deployments", "horizontalpodautoscalers")).start()
    try:
        seed(cluster)
        conn = ours(cluster)
        conn.validate()
        assert conn.apply(decide(4, 3), now_s=T0_S).decode_replicas == 3
        assert (replicas(cluster, "deployments", PREFILL), replicas(cluster, "deployments", DECODE)) == (4, 3)
        assert {r.path.rsplit("/", 1)[1] for r in cluster.requests if r.method == "GET"} >= {
            "leaderworkersets", "scaledobjects"}  # asked, answered 404
    finally:
        cluster.stop()


def test_keda_actuation_without_a_published_gauge_is_refused_by_the_run_configuration(h200_profile_dir):
    from flows.config import PlannerRunConfig
    from planner.config import PlannerConfig, ProfileConfig

    planner = PlannerConfig(namespace=NS, profile=ProfileConfig(dir=str(h200_profile_dir)))
    connector = LlmdConnectorConfig(inference_pool=POOL, actuation="keda")
    with pytest.raises(ValueError, match="planner_metrics must be enabled with a pushgateway_url or a port"):
        PlannerRunConfig(planner=planner, connector=connector)
    config = PlannerRunConfig(planner=planner, connector=connector,
                              planner_metrics={"enabled": True, "pushgateway_url": "http://pushgateway:9091"})
    assert config.llmd_inference_pool == (NS, POOL)  # the connector's namespace defaults to the planner's
