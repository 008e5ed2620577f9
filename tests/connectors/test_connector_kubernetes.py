"""The Kubernetes connector, through the official client, against the fake API server.

The first group checks the fake server itself behaves as the Kubernetes API
does for a custom resource (the lead's flow and e2e tests rely on it too); the
rest drive the connector against a DGD seeded from the real Dynamo manifest.
"""

from __future__ import annotations

import datetime
import json
import shutil
import types

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config

from connectors.base import ConcurrentWriteError, ConnectorError, ConnectorUnavailableError, ResourceAccessError
from connectors.config import KubernetesConnectorConfig
from connectors.factory import make_connector
from connectors.kubernetes import KubernetesConnector
from planner.types import Decision
from tests.support.fixtures_net import free_port
from tests.support.k8s_fake_server import (
    GROUP,
    PLURAL,
    TEST_TOKEN,
    VERSION,
    FakeKubeApiServer,
    kube_api_client,
    load_manifest,
    make_self_signed_cert,
    merge_patch,
    seed_dgd,
)

T0_S = 1_700_000_000.0
DGD = "vllm-disagg"  # metadata.name in the real manifest


def decide(prefill: int, decode: int, *, apply: bool = True, recommended: tuple[int, int] | None = None) -> Decision:
    rp, rd = recommended if recommended is not None else (None, None)
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=(),
                    recommended_prefill_replicas=rp, recommended_decode_replicas=rd)


def connector(server: FakeKubeApiServer, namespace: str, **overrides) -> KubernetesConnector:
    cfg = KubernetesConnectorConfig(dgd_name=DGD, namespace=namespace, **overrides)
    return KubernetesConnector(cfg, api_client=kube_api_client(server))


def patches(server: FakeKubeApiServer):
    return [r for r in server.requests if r.method == "PATCH"]


# -- the fake server is faithful -----------------------------------------------

@pytest.mark.parametrize("target, patch, expected", [
    pytest.param({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}}, {"a": 1, "b": {"d": 3, "e": 4}},
                 id="RFC 7386: null deletes, objects merge"),
    pytest.param({"a": [1, 2]}, {"a": [3]}, {"a": [3]}, id="RFC 7386: arrays replace"),
    pytest.param({"a": {"b": 1}}, {"a": 5}, {"a": 5}, id="RFC 7386: scalar replaces object"),
])
def test_merge_patch_follows_rfc_7386(target, patch, expected):
    assert merge_patch(target, patch) == expected


def test_fake_server_speaks_kubernetes(fake_k8s_api, k8s_namespace, dgd_manifest):
    api = client.CustomObjectsApi(kube_api_client(fake_k8s_api))
    created = api.create_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, load_manifest(dgd_manifest))
    rv0, gen0 = created["metadata"]["resourceVersion"], created["metadata"]["generation"]

    # A merge patch that only touches annotations: new resourceVersion, same generation.
    out = api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD,
                                             {"metadata": {"annotations": {"a": "1"}}})
    assert int(out["metadata"]["resourceVersion"]) > int(rv0) and out["metadata"]["generation"] == gen0
    # A spec change bumps the generation; sibling fields of the patched service survive.
    out = api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD,
                                             {"spec": {"services": {"decode": {"replicas": 3}}}})
    assert out["metadata"]["generation"] == gen0 + 1
    assert out["spec"]["services"]["decode"]["replicas"] == 3
    assert out["spec"]["services"]["decode"]["envFromSecret"] == "hf-token-secret"
    # Stale resourceVersion in a patch: 409 Conflict as a Status.
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD,
                                           {"metadata": {"resourceVersion": rv0}, "spec": {}})
    status = json.loads(info.value.body)
    assert info.value.status == 409
    assert (status["kind"], status["apiVersion"], status["status"], status["reason"], status["code"]) == (
        "Status", "v1", "Failure", "Conflict", 409)
    assert "the object has been modified" in status["message"]
    # PUT with a stale resourceVersion: 409; without one: 422.
    stale = dict(out, metadata=dict(out["metadata"], resourceVersion=rv0))
    with pytest.raises(ApiException) as info:
        api.replace_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD, stale)
    assert info.value.status == 409
    no_rv = dict(out, metadata={k: v for k, v in out["metadata"].items() if k != "resourceVersion"})
    with pytest.raises(ApiException) as info:
        api.replace_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD, no_rv)
    assert info.value.status == 422
    # Writes to the main resource ignore status; /status ignores spec.
    api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD, {"status": {"state": "x"}})
    assert "status" not in api.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD)
    api.patch_namespaced_custom_object_status(GROUP, VERSION, k8s_namespace, PLURAL, DGD,
                                              {"status": {"state": "pending"}, "spec": {"services": {}}})
    got = api.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD)
    assert got["status"] == {"state": "pending"} and "prefill" in got["spec"]["services"]
    # List, then 404 in Status form.
    listed = api.list_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL)
    assert [i["metadata"]["name"] for i in listed["items"]] == [DGD]
    with pytest.raises(ApiException) as info:
        api.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, "nope")
    status = json.loads(info.value.body)
    assert (info.value.status, status["reason"], status["code"]) == (404, "NotFound", 404)
    assert status["details"] == {"name": "nope", "group": GROUP, "kind": PLURAL}
    assert status["message"] == f'{PLURAL}.{GROUP} "nope" not found'


def test_fake_server_rejects_other_patch_types_and_bad_tokens(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    api = client.CustomObjectsApi(kube_api_client(fake_k8s_api))
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD, [{"op": "test"}],
                                           _content_type="application/json-patch+json")
    assert info.value.status == 415
    wrong = client.CustomObjectsApi(kube_api_client(fake_k8s_api, token="wrong"))
    with pytest.raises(ApiException) as info:
        wrong.get_namespaced_custom_object(GROUP, VERSION, k8s_namespace, PLURAL, DGD)
    assert info.value.status == 401


# -- the connector ---------------------------------------------------------------

def test_validate_and_read_fleet_from_the_real_manifest(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)
    conn.validate()  # the manifest has no subComponentType: falls back to the names prefill/decode

    fleet = conn.read_fleet(now_s=T0_S)

    assert (fleet.prefill.current_replicas, fleet.prefill.ready_replicas, fleet.prefill.gpus_per_replica) == (1, 1, 1)
    assert (fleet.decode.current_replicas, fleet.decode.ready_replicas, fleet.decode.gpus_per_replica) == (1, 1, 1)
    assert fleet.last_decision is None and fleet.recent_targets == ()
    assert conn.last_decision_done() is True


def test_services_found_by_sub_component_type_before_names(fake_k8s_api, k8s_namespace, dgd_manifest):
    manifest = load_manifest(dgd_manifest)
    services = manifest["spec"]["services"]
    # Realistic naming: the keys say nothing; subComponentType does.
    services["VllmPrefillWorker"] = dict(services.pop("prefill"), subComponentType="prefill")
    services["VllmDecodeWorker"] = dict(services.pop("decode"), subComponentType="decode")
    services["VllmDecodeWorker"]["replicas"] = 2
    services["VllmDecodeWorker"]["resources"]["limits"]["gpu"] = "2"
    fake_k8s_api.create(manifest, namespace=k8s_namespace)
    fake_k8s_api.reconcile(k8s_namespace, DGD)
    conn = connector(fake_k8s_api, k8s_namespace)

    record = conn.apply(decide(3, 4), now_s=T0_S)

    obj = fake_k8s_api.get(k8s_namespace, DGD)
    assert obj["spec"]["services"]["VllmPrefillWorker"]["replicas"] == 3
    assert obj["spec"]["services"]["VllmDecodeWorker"]["replicas"] == 4
    assert "prefill" not in obj["spec"]["services"]
    assert record.decision_id == 1
    assert conn.read_fleet(now_s=T0_S).decode.gpus_per_replica == 2


@pytest.mark.parametrize("drop, message", [
    pytest.param(["decode"], r"no decode service: none has subComponentType 'decode' and spec.services has no 'decode' key",
                 id="decode missing"),
    pytest.param(["prefill", "decode"], r"no prefill service.*no decode service", id="both missing"),
])
def test_validate_names_missing_services(fake_k8s_api, k8s_namespace, dgd_manifest, drop, message):
    manifest = load_manifest(dgd_manifest)
    for name in drop:
        del manifest["spec"]["services"][name]
    fake_k8s_api.create(manifest, namespace=k8s_namespace)
    with pytest.raises(ResourceAccessError, match=message) as info:
        connector(fake_k8s_api, k8s_namespace).validate()
    assert f"{DGD} in namespace {k8s_namespace}" in str(info.value)


def test_validate_uses_configured_service_names(fake_k8s_api, k8s_namespace, dgd_manifest):
    manifest = load_manifest(dgd_manifest)
    services = manifest["spec"]["services"]
    services["pf"], services["dc"] = services.pop("prefill"), services.pop("decode")
    fake_k8s_api.create(manifest, namespace=k8s_namespace)
    connector(fake_k8s_api, k8s_namespace, prefill_service="pf", decode_service="dc").validate()


def test_missing_dgd_is_a_clear_404(fake_k8s_api, k8s_namespace):
    with pytest.raises(ResourceAccessError, match=rf"get {PLURAL}.{GROUP}/{DGD} in namespace {k8s_namespace}: "
                                                  rf"404 Not Found: .*not found"):
        connector(fake_k8s_api, k8s_namespace).validate()


@pytest.mark.parametrize("verb, call", [
    pytest.param("get", lambda c: c.validate(), id="get forbidden: validate"),
    pytest.param("patch", lambda c: c.apply(decide(2, 2), now_s=T0_S), id="patch forbidden: apply"),
])
def test_forbidden_names_resource_and_verb(fake_k8s_api, k8s_namespace, dgd_manifest, verb, call):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    fake_k8s_api.forbid(verb)
    with pytest.raises(ResourceAccessError) as info:
        call(connector(fake_k8s_api, k8s_namespace))
    text = str(info.value)
    assert text.startswith(f"{verb} {PLURAL}.{GROUP}/{DGD} in namespace {k8s_namespace}: 403 Forbidden")
    assert f'cannot {verb} resource "{PLURAL}"' in text


def test_apply_merge_patches_replicas_and_annotations(fake_k8s_api, k8s_namespace, dgd_manifest):
    seeded = seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)

    record = conn.apply(decide(2, 3), now_s=T0_S)

    (request,) = patches(fake_k8s_api)
    assert request.content_type == "application/merge-patch+json"
    assert request.body["metadata"]["resourceVersion"] == seeded["metadata"]["resourceVersion"]
    assert request.body["spec"] == {"services": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}}}
    obj = fake_k8s_api.get(k8s_namespace, DGD)
    ann = obj["metadata"]["annotations"]
    assert ann["sla-planner/decision-id"] == "1"
    assert float(ann["sla-planner/decided-at-s"]) == T0_S
    assert json.loads(ann["sla-planner/targets"]) == {"prefill": 2, "decode": 3}
    # Everything else in the manifest is untouched.
    original = load_manifest(dgd_manifest)["spec"]["services"]
    assert obj["spec"]["services"]["Frontend"] == original["Frontend"]
    assert {k: v for k, v in obj["spec"]["services"]["decode"].items() if k != "replicas"} == {
        k: v for k, v in original["decode"].items() if k != "replicas"}
    assert (record.decision_id, record.prefill_replicas, record.decode_replicas, record.done) == (1, 2, 3, False)


def test_done_follows_operator_status(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)
    conn.apply(decide(2, 3), now_s=T0_S)

    fleet = conn.read_fleet(now_s=T0_S + 5)
    assert (fleet.prefill.current_replicas, fleet.prefill.ready_replicas) == (2, 1)
    assert fleet.last_decision.done is False and conn.last_decision_done() is False

    # Ready counts match but the operator has not observed the new generation yet.
    fake_k8s_api.set_ready(k8s_namespace, DGD, "prefill", ready=2)
    fake_k8s_api.set_ready(k8s_namespace, DGD, "decode", ready=3)
    assert conn.last_decision_done() is False

    fake_k8s_api.reconcile(k8s_namespace, DGD)
    fleet = conn.read_fleet(now_s=T0_S + 60)
    assert fleet.last_decision.done is True
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (2, 3)
    assert fleet.recent_targets == ((T0_S + 60, 2, 3),)  # recommended at T0, still in effect at T0 + 60


@pytest.mark.parametrize("status_entry, ready", [
    pytest.param({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}, 2, id="readyReplicas"),
    pytest.param({"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}, 1,
                 id="PodCliqueScalingGroup: availableReplicas only"),
    pytest.param({"replicas": 2, "updatedReplicas": 2}, 0, id="neither reported: 0"),
])
def test_ready_replicas_tolerate_status_shapes(fake_k8s_api, k8s_namespace, dgd_manifest, status_entry, ready):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace, ready=False)
    fake_k8s_api.patch(k8s_namespace, DGD, {"status": {"services": {"decode": status_entry}}}, subresource="status")
    fleet = connector(fake_k8s_api, k8s_namespace).read_fleet(now_s=T0_S)
    assert fleet.decode.ready_replicas == ready
    assert fleet.prefill.ready_replicas == 0  # no status for prefill at all


def test_runs_that_change_nothing_write_nothing(fake_k8s_api, k8s_namespace, dgd_manifest):
    seeded = seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)

    def run(decision, t_s):  # a planner run: a fresh connector instance
        return connector(fake_k8s_api, k8s_namespace).apply(decision, now_s=T0_S + t_s)

    assert run(decide(1, 1), 0) is None  # the manifest has 1 and 1: only the first recommendation is recorded
    (first,) = patches(fake_k8s_api)
    assert set(first.body["metadata"]["annotations"]) == {"sla-planner/recommendations"}
    rv = fake_k8s_api.get(k8s_namespace, DGD)["metadata"]["resourceVersion"]

    fake_k8s_api.clear_requests()
    for t_s in (60, 120, 180, 240, 300):
        assert run(decide(1, 1), t_s) is None
    assert run(decide(1, 1, recommended=(1, 1)), 300) is None  # a retried run
    assert run(decide(4, 4, apply=False, recommended=(1, 1)), 360) is None  # a hold, same recommendation
    assert patches(fake_k8s_api) == []
    obj = fake_k8s_api.get(k8s_namespace, DGD)
    assert obj["metadata"]["resourceVersion"] == rv  # no event for the operator, 7 runs long

    # A new recommendation whose targets are held: exactly one patch, annotations only.
    assert run(decide(1, 1, recommended=(1, 0)), 420) is None
    (held,) = patches(fake_k8s_api)
    assert set(held.body) == {"metadata"}
    assert set(held.body["metadata"]["annotations"]) == {"sla-planner/recommendations"}
    assert held.body["metadata"]["resourceVersion"] == rv
    # New targets: exactly one patch, spec and decision together.
    fake_k8s_api.clear_requests()
    assert run(decide(3, 2), 480).decision_id == 1
    (scaled,) = patches(fake_k8s_api)
    assert scaled.body["spec"] == {"services": {"prefill": {"replicas": 3}, "decode": {"replicas": 2}}}
    assert {"sla-planner/recommendations", "sla-planner/decision-id"} <= set(scaled.body["metadata"]["annotations"])
    fake_k8s_api.clear_requests()
    for t_s in (540, 600):
        assert run(decide(3, 2), t_s) is None
    assert patches(fake_k8s_api) == []

    obj = fake_k8s_api.get(k8s_namespace, DGD)
    assert obj["metadata"]["generation"] == seeded["metadata"]["generation"] + 1  # one spec change
    assert json.loads(obj["metadata"]["annotations"]["sla-planner/recommendations"]) == [
        {"t_s": T0_S, "prefill": 1, "decode": 1},
        {"t_s": T0_S + 420, "prefill": 1, "decode": 0},
        {"t_s": T0_S + 480, "prefill": 3, "decode": 2},
    ]
    # Each recommendation is stamped with the last time it was in effect: until the next one, or now.
    fleet = connector(fake_k8s_api, k8s_namespace).read_fleet(now_s=T0_S + 660)
    assert fleet.recent_targets == ((T0_S + 420, 1, 1), (T0_S + 480, 1, 0), (T0_S + 660, 3, 2))


def test_recommendation_rides_in_the_decision_patch(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)
    conn.apply(decide(1, 1), now_s=T0_S)

    record = conn.apply(decide(3, 2, recommended=(3, 1)), now_s=T0_S + 60)

    first, second = patches(fake_k8s_api)
    assert second.body["spec"] == {"services": {"prefill": {"replicas": 3}, "decode": {"replicas": 2}}}
    assert json.loads(second.body["metadata"]["annotations"]["sla-planner/recommendations"]) == [
        {"t_s": T0_S, "prefill": 1, "decode": 1},
        {"t_s": T0_S + 60, "prefill": 3, "decode": 1},
    ]
    assert second.body["metadata"]["annotations"]["sla-planner/decision-id"] == "1"
    assert record.decision_id == 1


def test_recording_retries_after_409_and_keeps_the_other_write(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)
    conn.apply(decide(1, 1), now_s=T0_S)
    # Another planner run records its recommendation between our GET and our PATCH.
    fake_k8s_api.before_next("PATCH", lambda: connector(fake_k8s_api, k8s_namespace).apply(
        decide(1, 1, recommended=(2, 2)), now_s=T0_S + 30))

    assert conn.apply(decide(1, 1, recommended=(1, 0)), now_s=T0_S + 31) is None

    assert len(patches(fake_k8s_api)) == 4  # our first record, the other run's, ours (409), ours again
    fleet = conn.read_fleet(now_s=T0_S + 40)
    assert fleet.recent_targets == ((T0_S + 30, 1, 1), (T0_S + 31, 2, 2), (T0_S + 40, 1, 0))


def test_concurrent_writer_causes_409_then_reread_succeeds(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace)
    # Another controller scales the Frontend between our GET and our PATCH.
    fake_k8s_api.before_next("PATCH", lambda: fake_k8s_api.patch(
        k8s_namespace, DGD, {"spec": {"services": {"Frontend": {"replicas": 2}}}}))

    record = conn.apply(decide(2, 5), now_s=T0_S)

    first, second = patches(fake_k8s_api)
    assert int(second.body["metadata"]["resourceVersion"]) > int(first.body["metadata"]["resourceVersion"])
    gets = [r for r in fake_k8s_api.requests if r.method == "GET" and "/namespaces/" in r.path]  # after discovery
    assert len(gets) == 2  # read, 409, read again
    obj = fake_k8s_api.get(k8s_namespace, DGD)
    assert obj["spec"]["services"]["Frontend"]["replicas"] == 2  # the other writer's change survives
    assert (obj["spec"]["services"]["prefill"]["replicas"], obj["spec"]["services"]["decode"]["replicas"]) == (2, 5)
    assert record.decision_id == 1


def test_conflicts_beyond_the_retry_budget_raise(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace, conflict_retries=2)
    calls = {"n": 0}

    def every_patch():
        calls["n"] += 1
        fake_k8s_api.patch(k8s_namespace, DGD, {"metadata": {"labels": {"writer": str(calls['n'])}}})
        if calls["n"] < 3:
            fake_k8s_api.before_next("PATCH", every_patch)

    # Another writer gets in before each of our 3 PATCHes (1 try + 2 retries).
    fake_k8s_api.before_next("PATCH", every_patch)
    with pytest.raises(ConcurrentWriteError, match=r"kept conflicting .*3 attempts, conflict_retries=2.*409 Conflict"):
        conn.apply(decide(2, 2), now_s=T0_S)
    assert fake_k8s_api.get(k8s_namespace, DGD)["spec"]["services"]["prefill"]["replicas"] == 1


def test_decision_ids_continue_across_connector_instances(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    ids = [connector(fake_k8s_api, k8s_namespace).apply(decide(n, n), now_s=T0_S + 60 * n).decision_id
           for n in (2, 3, 4)]
    assert ids == [1, 2, 3]
    fleet = connector(fake_k8s_api, k8s_namespace, history_max_entries=2).read_fleet(now_s=T0_S + 300)
    assert fleet.recent_targets == ((T0_S + 180, 2, 2), (T0_S + 240, 3, 3), (T0_S + 300, 4, 4))
    connector(fake_k8s_api, k8s_namespace, history_max_entries=2).apply(decide(5, 5), now_s=T0_S + 300)
    fleet = connector(fake_k8s_api, k8s_namespace).read_fleet(now_s=T0_S + 360)
    assert fleet.recent_targets == ((T0_S + 300, 4, 4), (T0_S + 360, 5, 5))  # 2 kept
    ann = fake_k8s_api.get(k8s_namespace, DGD)["metadata"]["annotations"]
    assert [e["id"] for e in json.loads(ann["sla-planner/recent-targets"])] == [3, 4]  # applied decisions: 2 kept


def test_recommendations_superseded_longer_ago_than_max_age_are_dropped(fake_k8s_api, k8s_namespace, dgd_manifest):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    conn = connector(fake_k8s_api, k8s_namespace, history_max_age_s=100.0)
    for t, rec in ((0.0, (1, 1)), (60.0, (2, 2)), (120.0, (3, 3)), (180.0, (3, 3)), (250.0, (4, 4))):
        conn.apply(decide(1, 1, recommended=rec), now_s=T0_S + t)
    # At 250 s the cutoff is 250 - 100 = 150 s: 1 (superseded at 60) and 2 (at 120) go; 3, in effect
    # until 250, stays.
    assert conn.read_fleet(now_s=T0_S + 250).recent_targets == ((T0_S + 250, 3, 3), (T0_S + 250, 4, 4))
    # The recommendation in effect is kept however old: 4, recorded at 250, superseded at 1000 > 1000 - 100.
    conn.apply(decide(1, 1, recommended=(5, 5)), now_s=T0_S + 1000)
    assert conn.read_fleet(now_s=T0_S + 1000).recent_targets == ((T0_S + 1000, 4, 4), (T0_S + 1000, 5, 5))


@pytest.mark.parametrize("annotations, message", [
    pytest.param({"sla-planner/decision-id": "seven"},
                 r"annotation sla-planner/decision-id must be a non-negative integer, got 'seven'", id="bad id"),
    pytest.param({"sla-planner/recommendations": '[{"t_s": "x", "prefill": 1, "decode": 1}]'},
                 r"annotation sla-planner/recommendations: recommendation history is not", id="bad recommendations"),
])
def test_bad_annotation_is_named(fake_k8s_api, k8s_namespace, dgd_manifest, annotations, message):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)
    fake_k8s_api.patch(k8s_namespace, DGD, {"metadata": {"annotations": annotations}})
    with pytest.raises(ConnectorError, match=message):
        connector(fake_k8s_api, k8s_namespace).validate()


def test_kubeconfig_auth(fake_k8s_api, k8s_namespace, dgd_manifest, tmp_path):
    seed_dgd(fake_k8s_api, dgd_manifest, namespace=k8s_namespace)

    def kubeconfig(token: str):
        path = tmp_path / f"kubeconfig-{token}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "fake", "cluster": {"server": fake_k8s_api.url}}],
            "users": [{"name": "planner", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "planner"}}],
        }))
        return str(path)

    cfg = KubernetesConnectorConfig(dgd_name=DGD, auth="kubeconfig", kubeconfig_path=kubeconfig(TEST_TOKEN))
    conn = make_connector(cfg, default_namespace=k8s_namespace)
    conn.validate()
    assert conn.apply(decide(2, 2), now_s=T0_S).decision_id == 1

    bad = KubernetesConnectorConfig(dgd_name=DGD, auth="kubeconfig", kubeconfig_path=kubeconfig("wrong"))
    with pytest.raises(ResourceAccessError, match=r"401 Unauthorized"):
        make_connector(bad, default_namespace=k8s_namespace).validate()

    missing = KubernetesConnectorConfig(dgd_name=DGD, auth="kubeconfig", kubeconfig_path=str(tmp_path / "nope"))
    with pytest.raises(ConnectorError, match=r"Kubernetes auth from kubeconfig .*nope failed"):
        make_connector(missing, default_namespace=k8s_namespace)


def test_unreachable_api_server_is_retryable(k8s_namespace):
    cfg = client.Configuration(host=f"http://127.0.0.1:{free_port()}")
    cfg.retries = 0
    conn = KubernetesConnector(KubernetesConnectorConfig(dgd_name=DGD, namespace=k8s_namespace),
                               api_client=client.ApiClient(cfg))
    with pytest.raises(ConnectorUnavailableError, match=r"validating.*: Kubernetes API server http://127.0.0.1:\d+ unreachable"):
        conn.validate()


# -- auth over HTTPS: in-cluster service account, kubeconfig -------------------------------------


@pytest.fixture
def in_cluster(fake_k8s_api_tls, tmp_path, monkeypatch):
    """A pod's view of the HTTPS fake server: env vars, a token file and the CA file, as the kubelet mounts them."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    token_path, ca_path = sa / "token", sa / "ca.crt"
    token_path.write_text("token-1")
    shutil.copy(fake_k8s_api_tls.tls[0], ca_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")  # the certificate's IP SAN
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake_k8s_api_tls.port))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token_path))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca_path))
    fake_k8s_api_tls.accept_tokens("token-1")
    fake_k8s_api_tls.clear_requests()
    return types.SimpleNamespace(server=fake_k8s_api_tls, token_path=token_path, ca_path=ca_path)


def tokens_sent(server: FakeKubeApiServer) -> list[str | None]:
    return [r.token for r in server.requests]


@pytest.mark.parametrize("auth", ["in_cluster", "auto"])
def test_in_cluster_auth_over_https(in_cluster, k8s_namespace, dgd_manifest, auth):
    server = in_cluster.server
    seed_dgd(server, dgd_manifest, namespace=k8s_namespace)
    conn = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth=auth), default_namespace=k8s_namespace)

    conn.validate()
    assert conn.apply(decide(2, 3), now_s=T0_S).decision_id == 1
    assert conn.read_fleet(now_s=T0_S).prefill.current_replicas == 2

    assert conn._api.api_client.configuration.host == f"https://127.0.0.1:{server.port}"
    assert "in-cluster service account" in conn.auth_source and str(in_cluster.token_path) in conn.auth_source
    assert set(tokens_sent(server)) == {"token-1"}
    assert server.get(k8s_namespace, DGD)["spec"]["services"]["decode"]["replicas"] == 3


def test_in_cluster_token_rotation_keeps_working(in_cluster, k8s_namespace, dgd_manifest, monkeypatch):
    server = in_cluster.server
    seed_dgd(server, dgd_manifest, namespace=k8s_namespace)
    conn = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="in_cluster"), default_namespace=k8s_namespace)
    conn.validate()

    # The kubelet rotates the token; the API server accepts both until the old one expires.
    in_cluster.token_path.write_text("token-2")
    server.accept_tokens("token-1", "token-2")
    server.clear_requests()
    conn.validate()
    assert tokens_sent(server) == ["token-1"]  # the loader keeps a token for up to a minute

    class MinuteLater(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.now(tz) + datetime.timedelta(seconds=61)

    monkeypatch.setattr(incluster_config, "datetime", types.SimpleNamespace(
        datetime=MinuteLater, timedelta=datetime.timedelta))
    server.clear_requests()
    conn.validate()
    assert tokens_sent(server) == ["token-2"]  # re-read from the file by the loader's refresh hook

    # A token revoked before the loader's minute is up: the first 401 makes the connector read the file again.
    in_cluster.token_path.write_text("token-3")
    server.accept_tokens("token-3")
    server.clear_requests()
    assert conn.apply(decide(2, 2), now_s=T0_S).decision_id == 1
    assert tokens_sent(server)[:2] == ["token-2", "token-3"]  # 401, then the same GET with the new token
    assert set(tokens_sent(server)[1:]) == {"token-3"}
    # The next planner run (a fresh connector) starts from the file too.
    connector_next_run = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="in_cluster"),
                                        default_namespace=k8s_namespace)
    assert connector_next_run.read_fleet(now_s=T0_S + 60).last_decision.decision_id == 1


def test_in_cluster_401_names_the_auth_method(in_cluster, k8s_namespace, dgd_manifest):
    server = in_cluster.server
    seed_dgd(server, dgd_manifest, namespace=k8s_namespace)
    server.accept_tokens("someone-elses-token")
    # api pinned: no discovery request before the one this test counts
    conn = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="in_cluster", api="v1alpha1"),
                          default_namespace=k8s_namespace)

    with pytest.raises(ResourceAccessError) as info:
        conn.validate()

    text = str(info.value)
    assert text.startswith(f"get {PLURAL}.{GROUP}/{DGD} in namespace {k8s_namespace}: 401 Unauthorized")
    assert f"auth from the in-cluster service account (token {in_cluster.token_path}" in text
    assert "read again after a first 401" in text and "token is mounted, current and not revoked" in text
    assert tokens_sent(server) == ["token-1", "token-1"]  # one retry with the re-read file, no more


@pytest.mark.parametrize("missing, message", [
    pytest.param("token", r"Service token file does not exist", id="no token file"),
    pytest.param("ca", r"Service certification file does not exist", id="no CA file"),
])
def test_in_cluster_missing_mount_is_named(in_cluster, k8s_namespace, missing, message):
    (in_cluster.token_path if missing == "token" else in_cluster.ca_path).unlink()
    with pytest.raises(ConnectorError, match=r"Kubernetes auth from the in-cluster service account \(token .*"
                                             + message):
        make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="in_cluster"), default_namespace=k8s_namespace)


def kubeconfig_file(path, *, server_url: str, token: str, ca_path=None) -> str:
    cluster = {"server": server_url}
    if ca_path is not None:
        cluster["certificate-authority"] = str(ca_path)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "planner", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "planner"}}],
    }))
    return str(path)


def test_kubeconfig_bearer_token_over_https(fake_k8s_api_tls, k8s_namespace, dgd_manifest, tmp_path):
    server = fake_k8s_api_tls
    server.accept_tokens("kube-token-1")
    seed_dgd(server, dgd_manifest, namespace=k8s_namespace)
    path = tmp_path / "kubeconfig"
    kubeconfig_file(path, server_url=server.url, token="kube-token-1", ca_path=server.tls[0])
    conn = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="kubeconfig", kubeconfig_path=str(path)),
                          default_namespace=k8s_namespace)

    conn.validate()
    assert conn.apply(decide(2, 2), now_s=T0_S).decision_id == 1

    # The kubeconfig's token is replaced and the old one revoked: the first 401 re-reads the file.
    kubeconfig_file(path, server_url=server.url, token="kube-token-2", ca_path=server.tls[0])
    server.accept_tokens("kube-token-2")
    assert conn.read_fleet(now_s=T0_S).last_decision.decision_id == 1

    server.accept_tokens("revoked-for-everyone")
    with pytest.raises(ResourceAccessError, match=rf"401 Unauthorized: .*auth from kubeconfig {path}"):
        conn.validate()


def test_kubeconfig_with_the_wrong_ca_names_tls(fake_k8s_api_tls, k8s_namespace, tmp_path):
    other_ca, _ = make_self_signed_cert(tmp_path / "other")
    path = kubeconfig_file(tmp_path / "kubeconfig", server_url=fake_k8s_api_tls.url, token=TEST_TOKEN,
                           ca_path=other_ca)
    conn = make_connector(KubernetesConnectorConfig(dgd_name=DGD, auth="kubeconfig", kubeconfig_path=path),
                          default_namespace=k8s_namespace)
    conn._api.api_client.configuration.retries = 0
    with pytest.raises(ConnectorError, match=rf"TLS with the Kubernetes API server {fake_k8s_api_tls.url} failed "
                                             rf"\(auth from kubeconfig {path}; CA file {other_ca}\): .*CERTIFICATE_VERIFY_FAILED") as info:
        conn.validate()
    assert not isinstance(info.value, ConnectorUnavailableError)  # a retry will not fix a wrong CA
