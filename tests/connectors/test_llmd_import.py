"""`sla-planner import llmd`: llm-d's KEDA ScaledObjects and WVA VariantAutoscalings as our run configuration.

The inputs are llm-d's own token-aware P/D ScaledObjects (../shared/llmd/examples), the
ScaledObjects this project ships, and a VariantAutoscaling with the fields of WVA's CRD
(llmd.ai/v1alpha1). Expected values are read off the files by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner_cli.main import main
from tests.support.k8s_llmd_fake import EXAMPLES
from tests.connectors.test_import import run_import

TOKEN_AWARE = [str(EXAMPLES / f"keda-token-aware-pd-{role}-scaledobject.yaml") for role in ("prefill", "decode")]
SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "components" / "llmd-keda"


def test_llmds_token_aware_scaled_objects_become_bounds_cadence_and_stabilization(capsys):
    code, data, err = run_import(capsys, "llmd", *TOKEN_AWARE, "--pool", "pd-pool")
    assert code == 0
    # Both files: minReplicaCount 1, maxReplicaCount 10, pollingInterval 15, scaleDown window 300 s.
    assert data["planner"]["decision"] == {"prefill": {"min_replicas": 1, "max_replicas": 10},
                                           "decode": {"min_replicas": 1, "max_replicas": 10},
                                           "scale_down_stabilization_s": 300.0}
    assert data["planner"]["adjustment_interval_s"] == 15.0
    assert data["connector"] == {"kind": "llmd", "inference_pool": "pd-pool"}
    unmapped = [line for line in err if "not mapped:" in line]
    assert any("prefill-token-aware.triggers.prefill-backlog-seconds" in line and "llm_d_epp_inflight_tokens" in line
               and "(threshold 1.5)" in line for line in unmapped)
    assert any("decode-token-aware.triggers.decode-kv-utilization" in line and "(threshold 0.8)" in line
               for line in unmapped)
    assert sum("policies" in line for line in unmapped) == 4  # scaleUp and scaleDown of each


def test_without_a_pool_the_connector_is_reported_not_guessed(capsys):
    code, data, err = run_import(capsys, "llmd", *TOKEN_AWARE)
    assert code == 0 and "connector" not in data
    assert any("not mapped: connector=None: name the InferencePool" in line for line in err)


def test_a_variant_autoscaling_gives_the_model_and_reports_what_has_no_equivalent(capsys, tmp_path):
    va = {"apiVersion": "llmd.ai/v1alpha1", "kind": "VariantAutoscaling",
          "metadata": {"name": "llama-decode", "namespace": "llm-d-pd"},
          "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llama-8b-decode"},
                   "modelID": "meta-llama/Llama-3.1-8B-Instruct", "variantID": "meta-llama/Llama-3.1-8B-Instruct-H100-1",
                   "accelerator": "H100", "acceleratorCount": 1, "variantCost": "10.0"}}
    path = tmp_path / "va.yaml"
    path.write_text(yaml.safe_dump(va))
    code, data, err = run_import(capsys, "llmd", str(path), "--pool", "llama")
    assert code == 0
    assert data["planner"]["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert data["connector"] == {"kind": "llmd", "inference_pool": "llama", "namespace": "llm-d-pd"}
    skipped = {line.split("not mapped: ")[1].split("=")[0] for line in err if "not mapped:" in line}
    assert {f"VariantAutoscaling llm-d-pd/llama-decode.spec.{k}" for k in
            ("acceleratorCount", "accelerator", "variantID", "variantCost")} <= skipped
    assert any("targets Deployment/llama-8b-decode (decode)" in line for line in err)


def test_the_shipped_scaled_objects_are_recognized_as_applying_the_planner(capsys):
    code, data, err = run_import(capsys, "llmd", *(str(p) for p in sorted(SHIPPED.glob("scaledobject-*.yaml"))))
    assert code == 0
    assert data["planner"]["decision"]["prefill"] == {"min_replicas": 1, "max_replicas": 64}
    assert data["planner"]["decision"]["scale_down_stabilization_s"] == 0.0
    assert sum("already applies the planner's gauge: use connector.actuation keda" in line for line in err) == 2


DECODE_SO = yaml.safe_load(Path(TOKEN_AWARE[1]).read_text())


@pytest.mark.parametrize("docs, expected", [
    ([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}],
     "no KEDA ScaledObject, WVA VariantAutoscaling or HorizontalPodAutoscaler in it"),
    ([DECODE_SO, DECODE_SO], "a second autoscaler for the decode role: give one per role"),
], ids=["a ConfigMap", "two for one role"])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, docs, expected):
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["import", "llmd", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err


@pytest.mark.integration
def test_live_reads_the_scaled_objects_of_the_pools_targets(capsys, tmp_path):
    """--live: the pool's targets found as the connector finds them, and only the ScaledObjects that scale them."""
    from tests.support.k8s_fake_server import TEST_TOKEN
    from tests.support.k8s_llmd_fake import LlmdCluster
    from tests.connectors.test_k8s_dynamo import kubeconfig
    from tests.connectors.test_llmd_connector import DECODE, NS, POOL, PREFILL, seed

    cluster = LlmdCluster(token=TEST_TOKEN).start()
    try:
        seed(cluster)
        for doc in (yaml.safe_load(Path(p).read_text()) for p in TOKEN_AWARE):
            target = {"prefill": PREFILL, "decode": DECODE}[doc["metadata"]["labels"]["llm-d.ai/role"]]
            doc["spec"]["scaleTargetRef"]["name"] = target
            doc["spec"]["maxReplicaCount"] = 12 if target == PREFILL else 6
            cluster.create(doc, namespace=NS)
        other = yaml.safe_load(Path(TOKEN_AWARE[1]).read_text())
        other["metadata"]["name"] = "another-models-decode"
        other["spec"]["scaleTargetRef"]["name"] = "another-model-decode"  # the bystander: not the pool's
        cluster.create(other, namespace=NS)
        code, data, err = run_import(capsys, "llmd", "--live", "--pool", POOL, "--namespace", NS,
                                     "--kubeconfig", str(kubeconfig(tmp_path, cluster)))
    finally:
        cluster.stop()
    assert code == 0, err
    assert data["planner"]["decision"]["prefill"] == {"min_replicas": 1, "max_replicas": 12}
    assert data["planner"]["decision"]["decode"] == {"min_replicas": 1, "max_replicas": 6}
    assert data["connector"] == {"kind": "llmd", "inference_pool": POOL, "namespace": NS}
    assert not any("another-models-decode" in line for line in err)


def test_live_needs_a_pool(capsys):
    assert main(["import", "llmd", "--live"]) == 2
    assert "--live reads the ScaledObjects of an InferencePool: give --pool NAME" in capsys.readouterr().err


def test_wvas_legacy_hpa_on_its_desired_replicas_gives_bounds_and_stabilization(capsys, tmp_path):
    """The shape of llm-d's optimized-baseline hpa.yaml (WVA era): External wva_desired_replicas, AverageValue 1."""
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "decode-hpa", "namespace": "llm-d-pd"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "optimized-baseline-nvidia-gpu-vllm-decode"},
                    "maxReplicas": 10,
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 120}},
                    "metrics": [{"type": "External", "external": {
                        "metric": {"name": "wva_desired_replicas", "selector": {"matchLabels": {
                            "variant_name": "optimized-baseline-nvidia-gpu-vllm-decode"}}},
                        "target": {"type": "AverageValue", "averageValue": "1"}}},
                        {"type": "Resource", "resource": {"name": "cpu", "target": {
                            "type": "Utilization", "averageUtilization": 80}}}]}}
    path = tmp_path / "hpa.yaml"
    path.write_text(yaml.safe_dump(hpa))
    code, data, err = run_import(capsys, "llmd", str(path), "--pool", "baseline")
    assert code == 0, err
    # minReplicas unset: the HPA's default 1; maxReplicas 10; scale-down window 120 s; no polling interval.
    assert data["planner"]["decision"] == {"decode": {"min_replicas": 1, "max_replicas": 10},
                                           "scale_down_stabilization_s": 120.0}
    assert "adjustment_interval_s" not in data["planner"]
    assert any("applies WVA's wva_desired_replicas: the planner's decision takes its place" in line for line in err)
    assert any("not mapped: HorizontalPodAutoscaler llm-d-pd/decode-hpa.metrics.cpu=" in line for line in err)
