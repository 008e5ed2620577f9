"""`sla-planner import`: Dynamo planner settings and WVA ConfigMaps become our run configuration.

The inputs are Dynamo 1.6.1's own example DGDs, a DGD its profiler generated, a
pre-1.0 example with flags, and WVA's shipped ConfigMaps (tests/data/migrate,
README there). Each mapped value is checked against the source file read here
independently; what cannot be mapped is listed on stderr one line each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from connectors.migrate.dynamo_settings import LEGACY_FLAGS
from connectors.migrate.dynamo import DYNAMO_FIELDS
from connectors.migrate.table import mapping_table
from flows.config import load_run_config
from planner_cli.main import main
from tests.conftest import PROJECT_ROOT
from tests.support.k8s_dynamo_fake import CRD_DIR, DynamoCluster
from tests.support.k8s_fake_server import TEST_TOKEN, ApiError
from tests.connectors.test_k8s_dynamo import kubeconfig

DATA = Path(__file__).resolve().parents[1] / "data" / "migrate"
SLA_PLANNER = PROJECT_ROOT / ".venv" / "bin" / "sla-planner"


def run_import(capsys, *args: str) -> tuple[int, dict | None, list[str]]:
    """Run the command in-process: exit code, the YAML written to stdout, the stderr lines."""
    code = main(["import", *args])
    captured = capsys.readouterr()
    data = yaml.safe_load(captured.out) if captured.out else None
    return code, data, [line for line in captured.err.splitlines() if line]


def planner_json(path: Path) -> dict:
    """The inline --config JSON of the DGD's Planner, read by hand."""
    services = yaml.safe_load(path.read_text())["spec"]["services"]
    args = services["Planner"]["extraPodSpec"]["mainContainer"]["args"]
    return json.loads(args[args.index("--config") + 1])


@pytest.mark.parametrize("name", ["dynamo-1.6.1-disagg_planner_throughput.yaml",
                                  "dynamo-1.6.1-disagg_8b_planner.yaml",
                                  "dynamo-1.6.1-disagg_planner_load.yaml"])
def test_dynamo_1_6_1_examples_map_every_value_from_their_config(capsys, tmp_path, name):
    src = planner_json(DATA / name)
    out = tmp_path / "planner.yaml"
    code, _, err = run_import(capsys, "dgd", str(DATA / name), "--namespace", "dyn", "-o", str(out))
    assert code == 0, err
    cfg = load_run_config(out)  # loads through our models
    p = cfg.planner
    # absent keys take Dynamo 1.6.1's defaults: ttft 500 ms, itl 50 ms, throughput interval 180 s, budget 8
    assert p.slo.ttft_ms == src.get("ttft_ms", 500.0) and p.slo.itl_ms == src.get("itl_ms", 50.0)
    assert p.adjustment_interval_s == src.get("throughput_adjustment_interval_seconds", 180)
    assert p.profile.dir == src.get("profile_results_dir", str(out.parent / "profiling_results"))
    assert p.predictor.name == src.get("load_predictor", "arima")
    assert cfg.planner.decision.max_gpu_budget == 8
    assert (p.decision.prefill.min_replicas, p.decision.prefill.max_replicas) == (1, 8)  # 8 GPUs / 1 per engine
    assert p.decision.max_step_replicas == 8
    assert p.model_id == "nvidia/Llama-3.1-8B-Instruct-FP8"  # the decode worker's --model, as Dynamo reads it
    assert cfg.metrics.frontend_selector == 'model="nvidia/Llama-3.1-8B-Instruct-FP8"'
    assert cfg.metrics.prometheus_url == "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"
    assert (cfg.connector.kind, cfg.connector.dgd_name, cfg.connector.namespace) == ("kubernetes", "vllm-disagg-planner", "dyn")
    port = src.get("metric_reporting_prometheus_port")
    assert (cfg.planner_metrics.enabled, cfg.planner_metrics.port) == ((True, port) if port else (False, None))
    assert any("profile_results_dir" in line and "inside the planner's container" in line for line in err)


def test_the_throughput_example_lists_exactly_what_it_cannot_map(capsys):
    code, _, err = run_import(capsys, "dgd", str(DATA / "dynamo-1.6.1-disagg_planner_throughput.yaml"),
                              "--namespace", "dyn")
    assert code == 0
    assert [line.split(": ", 2)[2].split(":")[0] for line in err] == [
        "config profile_results_dir='/workspace/components/src/dynamo/planner/tests/data/profiling_results/H200_TP1P_TP1D'",
        "config pre_deployment_sweeping_mode='none'",
    ]  # load_adjustment_interval_seconds 5 is Dynamo's default: nothing lost


def test_the_load_example_reports_load_based_scaling(capsys):
    code, _, err = run_import(capsys, "dgd", str(DATA / "dynamo-1.6.1-disagg_planner_load.yaml"), "--namespace", "d")
    assert code == 0
    keys = [line.split("not mapped: ")[1].split("=")[0] for line in err if "not mapped: " in line]
    assert "config enable_throughput_scaling" in keys and "config enable_load_scaling" in keys
    assert "config load_min_observations" not in keys  # 5 is Dynamo's default: nothing lost


def test_the_profilers_v1beta1_dgd_reads_the_mounted_configmap(capsys, tmp_path):
    docs = list(yaml.safe_load_all((DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml").read_text()))
    src = json.loads(docs[1]["data"]["planner_config.json"])
    code, data, err = run_import(capsys, "dgd", str(DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml"),
                                 "--namespace", "dyn", "--profile-dir", str(tmp_path))
    assert code == 0, err
    p = data["planner"]
    assert p["slo"] == {"ttft_ms": src["ttft_ms"], "itl_ms": src["itl_ms"]} == {"ttft_ms": 300.0, "itl_ms": 20.0}
    assert p["adjustment_interval_s"] == src["throughput_adjustment_interval_seconds"] == 60
    assert p["decision"]["max_gpu_budget"] == src["max_gpu_budget"] == 12
    assert p["decision"]["prefill"] == {"min_replicas": src["min_endpoint"], "max_replicas": 12}
    assert p["decision"]["decode"] == {"min_replicas": src["decode_min_endpoint"], "max_replicas": 12}
    assert p["decision"]["max_step_replicas"] == src["max_throughput_scaling_replicas"] == 4
    assert p["predictor"] == {"name": "kalman", "params": {"kalman": {"min_points": src["kalman_min_points"]}},
                              "warmup_trace_path": src["load_predictor_warmup_trace"]}
    assert p["profile"] == {"dir": str(tmp_path)}  # --profile-dir replaces the in-cluster path
    assert p["model_id"] == src["model_name"]
    assert data["planner_metrics"] == {"enabled": True, "port": src["metric_reporting_prometheus_port"]}
    assert data["connector"] == {"kind": "kubernetes", "dgd_name": "vllm-disagg", "namespace": "dyn"}
    # the ConfigMap dumps every key: only the ones that differ from Dynamo's defaults are listed
    assert [line.split("not mapped: ")[1].split("=")[0] for line in err] == [
        "config load_predictor_warmup_trace", "config pre_deployment_sweeping_mode", "config kalman_q_level"]


def test_without_its_configmap_the_config_file_is_reported(capsys, tmp_path):
    dgd_only = tmp_path / "dgd.yaml"
    docs = list(yaml.safe_load_all((DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml").read_text()))
    dgd_only.write_text(yaml.safe_dump(docs[0]))
    code, data, err = run_import(capsys, "dgd", str(dgd_only), "--namespace", "dyn")
    assert code == 0
    assert err[0].startswith("sla-planner import: not mapped: --config='/workspace/planner_config/planner_config.json': "
                             "a file inside the planner's container (ConfigMap planner-config-")
    assert data["planner"]["slo"] == {"ttft_ms": 500.0, "itl_ms": 50.0}  # Dynamo's defaults


def test_pre_1_0_flags_in_a_shell_command(capsys):
    code, data, err = run_import(capsys, "dgd", str(DATA / "dynamo-0.x-vllm-disagg_planner.yaml"), "--namespace", "n")
    assert code == 0
    # exec python3 -m planner_sla --environment=kubernetes --backend=vllm --adjustment-interval=60
    # --profile-results-dir=/data/profiling_results
    assert data["planner"]["adjustment_interval_s"] == 60
    assert data["planner"]["profile"] == {"dir": "/data/profiling_results"}
    assert "max_step_replicas" not in data["planner"]["decision"]  # the pre-1.0 planner had no step limit
    # that era's Prometheus: <DYNAMO_NAMESPACE env>-prometheus in the planner's namespace, port 9090
    assert data["metrics"]["prometheus_url"] == "http://vllm-disagg-planner-prometheus.n.svc.cluster.local:9090"
    assert err == ["sla-planner import: note: pre-1.0 Prometheus default (from DYNAMO_NAMESPACE and PROMETHEUS_PORT): "
                   "http://vllm-disagg-planner-prometheus.n.svc.cluster.local:9090",
                   "sla-planner import: not mapped: --profile-results-dir='/data/profiling_results': a path inside "
                   "the planner's container (PVC planner-pvc at /data): copy the profiler output "
                   "(selected_prefill_interpolation/, selected_decode_interpolation/) here and pass --profile-dir"]


def flags_dgd(tmp_path: Path, *args: str) -> Path:
    obj = yaml.safe_load((DATA / "dynamo-0.x-vllm-disagg_planner.yaml").read_text())
    obj["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"] = {
        "command": ["python3", "-m", "planner_sla"], "args": list(args)}
    path = tmp_path / "flags.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def test_flags_as_dynamos_docs_write_them_including_the_warmup_trace(capsys, tmp_path):
    path = flags_dgd(tmp_path, "--load-predictor arima", "--load-predictor-warmup-trace /data/trace.jsonl",
                     "--load-predictor-log1p", "--ttft", "150", "--itl=8", "--max-gpu-budget", "-1",
                     "--min-endpoint", "0", "--no-correction", "--kalman-r", "3")
    code, data, err = run_import(capsys, "dgd", str(path), "--namespace", "n")
    assert code == 0, err
    p = data["planner"]
    assert p["predictor"] == {"name": "arima", "log1p": True, "warmup_trace_path": "/data/trace.jsonl"}
    assert p["slo"] == {"ttft_ms": 150.0, "itl_ms": 8.0}
    assert p["decision"]["max_gpu_budget"] is None and p["decision"]["allow_scale_to_zero"] is True
    assert p["decision"]["prefill"] == {"min_replicas": 0, "max_replicas": 16}
    assert p["correction"] == {"enabled": False}
    keys = [line.split("not mapped: ")[1].split("=")[0] for line in err if "not mapped: " in line]
    assert keys == ["profile_results_dir (Dynamo default)", "--load-predictor-warmup-trace", "--max-gpu-budget",
                    "--kalman-r"]
    assert [line.split(": ")[2] for line in err if ": note: " in line] == ["pre-1.0 Prometheus default (from "
                                                                          "DYNAMO_NAMESPACE and PROMETHEUS_PORT)"]


def test_the_seconds_era_of_pre_1_0_ttft_and_itl(capsys, tmp_path):
    # the early planner_sla took --ttft/--itl in seconds (its defaults 0.5 and 0.05)
    code, data, err = run_import(capsys, "dgd", str(flags_dgd(tmp_path, "--ttft=0.2", "--itl", "0.02")),
                                 "--namespace", "n")
    assert code == 0, err
    assert data["planner"]["slo"] == {"ttft_ms": 200.0, "itl_ms": 20.0}
    notes = [line.split(": note: ")[1] for line in err if ": note: " in line]
    assert notes[:2] == ["--ttft=0.2: below 10, read as seconds (the pre-1.0 planner's unit then): ttft_ms 200",
                         "--itl=0.02: below 10, read as seconds (the pre-1.0 planner's unit then): itl_ms 20"]


def test_older_pre_1_0_flags_map_and_that_eras_prometheus_default(capsys, tmp_path):
    path = flags_dgd(tmp_path, "--load-predictor=constant", "--load-prediction-window-size=30",
                     "--prometheus-port=9085", "--isl=3000")
    obj = yaml.safe_load(path.read_text())
    obj["spec"]["envs"] = [{"name": "DYNAMO_NAMESPACE", "value": "team-a"},
                           {"name": "PROMETHEUS_PORT", "value": "9091"}]
    path.write_text(yaml.safe_dump(obj))
    code, data, err = run_import(capsys, "dgd", str(path))  # no namespace: that planner's fallback
    assert code == 0, err
    assert data["planner"]["predictor"] == {"name": "constant", "history_intervals": 30}
    assert data["planner_metrics"] == {"enabled": True, "port": 9085}
    assert data["metrics"]["prometheus_url"] == "http://team-a-prometheus.default.svc.cluster.local:9091"
    assert ("sla-planner import: note: the pre-1.0 planner in namespace 'default' queried the bare host "
            "'team-a-prometheus' (not a URL): written as http://team-a-prometheus.default.svc.cluster.local:9091"
            in err)


def test_an_unknown_pre_1_0_flag_stops_that_planner_and_the_import(capsys, tmp_path):
    path = flags_dgd(tmp_path, "--adjustment-interval=60", "--max-replicas", "6")
    code, data, err = run_import(capsys, "dgd", str(path), "--namespace", "n")
    assert (code, data, len(err)) == (2, None, 1)
    assert "Planner --max-replicas='6': not a flag of the pre-1.0 planner (nor a 1.6.1 setting)" in err[0]
    code, data, err = run_import(capsys, "dgd", str(path), "--namespace", "n", "--lenient")
    assert code == 0 and data["planner"]["adjustment_interval_s"] == 60
    assert any(line.endswith("skipped (--lenient)") and "--max-replicas='6'" in line for line in err)
    # a predictor that planner did not have failed its lookup at start
    code, data, err = run_import(capsys, "dgd", str(flags_dgd(tmp_path, "--load-predictor", "ets")), "--namespace", "n")
    assert (code, len(err)) == (2, 1) and "--load-predictor='ets': the pre-1.0 planner knew constant" in err[0]


@pytest.mark.parametrize("content, message", [
    pytest.param("kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n",
                 "not a DynamoGraphDeployment (kind 'ConfigMap')", id="not a DGD"),
    pytest.param("spec: [unclosed\n", "not valid YAML", id="unparsable YAML"),
    pytest.param(None, "has no planner component (components: ['Frontend', 'decode', 'prefill'])", id="no planner"),
    pytest.param("apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeployment\nmetadata: {name: x}\nspec:\n"
                 "  services:\n    Planner:\n      componentType: planner\n      extraPodSpec:\n        mainContainer:\n"
                 "          args: [--ttft, fast]\n", "planner argument --ttft: expected a float, got 'fast'",
                 id="bad flag value"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "in.yaml"
    path.write_text(content if content is not None else (CRD_DIR / "example-dgd-vllm-disagg-planner.v1beta1.yaml").read_text())
    done = subprocess.run([str(SLA_PLANNER), "import", "dgd", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


# -- WVA --------------------------------------------------------------------------------------------


def test_wvas_shipped_saturation_configmap(capsys, tmp_path):
    src = yaml.safe_load(yaml.safe_load((DATA / "wva-configmap-saturation-scaling.yaml").read_text())["data"]["default"])
    code, data, err = run_import(capsys, "wva", str(DATA / "wva-configmap-saturation-scaling.yaml"))
    assert code == 0
    assert data["planner"]["saturation"]["default"] == {
        "kv_cache_threshold": src["kvCacheThreshold"], "queue_length_threshold": src["queueLengthThreshold"],
        "kv_spare_trigger": src["kvSpareTrigger"], "queue_spare_trigger": src["queueSpareTrigger"]}
    # enableLimiter: false changes nothing; the profile is not WVA's to give
    assert err == ["sla-planner import: not mapped: planner.profile.dir=None: not in "
                   f"{DATA / 'wva-configmap-saturation-scaling.yaml'}: set it to the profiler output (written as "
                   "PROFILE_DIR), or pass --base with a configuration that has it"]


def test_wva_overrides_the_controller_configmap_and_a_base(capsys, tmp_path, h200_profile_dir):
    # WVA's own examples of overrides (commented out in the shipped file), uncommented.
    shipped = (DATA / "wva-configmap-saturation-scaling.yaml").read_text()
    path = tmp_path / "cm.yaml"
    path.write_text(re.sub(r"^  # (granite-override|llama-production): \|$", r"  \1: |", shipped, flags=re.M)
                    .replace("  #   ", "    "))
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"planner": {"profile": {"dir": str(h200_profile_dir)}, "model_id": "m"}}))
    out = tmp_path / "planner.yaml"
    code, _, err = run_import(capsys, "wva", str(path), str(DATA / "wva-variantautoscaling-config.yaml"),
                              "--base", str(base), "-o", str(out))
    assert code == 0, err
    cfg = load_run_config(out)
    sat = cfg.planner.saturation
    assert sat.overrides["ibm/granite-13b#lab-namespace"].model_dump() == {
        "kv_cache_threshold": 0.75, "queue_length_threshold": 10, "kv_spare_trigger": 0.15, "queue_spare_trigger": 5}
    # llama-production leaves two out: WVA reads 0 there, we the recommended values (reported)
    assert sat.overrides["meta/llama-70b#production"].queue_length_threshold == 5.0
    assert cfg.planner.model_id == "m" and cfg.planner.profile.dir == str(h200_profile_dir)
    # controller: PROMETHEUS_BASE_URL, PROMETHEUS_TLS_INSECURE_SKIP_VERIFY "true", GLOBAL_OPT_INTERVAL "60s"
    assert cfg.metrics.prometheus_url == ("https://kube-prometheus-stack-prometheus.workload-variant-autoscaler-"
                                          "monitoring.svc.cluster.local:9090")
    assert cfg.metrics.verify_tls is False and cfg.planner.adjustment_interval_s == 60.0
    keys = [line.split("not mapped: ")[1].split("=")[0] for line in err if "not mapped: " in line]
    assert "wva-saturation-scaling-config/llama-production.queueLengthThreshold" in keys
    assert "wva-variantautoscaling-config/WVA_SCALE_TO_ZERO" in keys
    assert "wva-variantautoscaling-config/PROMETHEUS_METRICS_CACHE_TTL" in keys


def test_a_wva_entry_our_checks_refuse_is_reported_and_left_out(capsys, tmp_path):
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sat"}, "data": {
        "default": "kvCacheThreshold: 0.8\nqueueLengthThreshold: 5\nkvSpareTrigger: 0.8\nqueueSpareTrigger: 3\n"}}))
    code, data, err = run_import(capsys, "wva", str(path))
    assert code == 0 and "default" not in data["planner"]["saturation"]
    assert "sat/default=" in err[0] and "kv_spare_trigger (0.8) must be < kv_cache_threshold (0.8)" in err[0]


def test_a_wva_file_without_saturation_settings_is_bad_input(tmp_path):
    path = tmp_path / "cm.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\ndata: {greeting: hello}\n")
    done = subprocess.run([str(SLA_PLANNER), "import", "wva", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "no WVA saturation entry" in done.stderr


# -- --live against the fake Dynamo cluster --------------------------------------------------------

CONFIGMAP_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/configmaps/(?P<name>[^/]+)$")


class ClusterWithConfigMaps(DynamoCluster):
    """The fake Dynamo cluster, also serving GET of core ConfigMaps."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.configmaps: dict[tuple[str, str], dict] = {}

    def handle(self, method, raw_path, headers, body_bytes):
        from urllib.parse import urlsplit

        match = CONFIGMAP_PATH.match(urlsplit(raw_path).path)
        if match is None:
            return super().handle(method, raw_path, headers, body_bytes)
        token = self.record(method, urlsplit(raw_path), headers, body_bytes)[0]
        if self.tokens is not None and token not in self.tokens:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        obj = self.configmaps.get((match["ns"], match["name"]))
        if obj is None:
            raise ApiError(404, "NotFound", f'configmaps "{match["name"]}" not found', name=match["name"])
        return 200, obj


@pytest.fixture
def cluster():
    server = ClusterWithConfigMaps(token=TEST_TOKEN).start()
    yield server
    server.stop()


def test_live_reads_the_dgd_and_its_planner_configmap_from_the_cluster(capsys, tmp_path, cluster):
    dgd, cm = yaml.safe_load_all((DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml").read_text())
    cluster.create_dgd(dgd, namespace="prod")
    cluster.configmaps[("prod", cm["metadata"]["name"])] = {**cm, "metadata": {**cm["metadata"], "namespace": "prod"}}
    code, data, err = run_import(capsys, "dgd", "--live", "vllm-disagg", "--namespace", "prod",
                                 "--kubeconfig", str(kubeconfig(tmp_path, cluster)))
    assert code == 0, err
    assert data["connector"] == {"kind": "kubernetes", "dgd_name": "vllm-disagg", "namespace": "prod"}
    assert data["planner"]["slo"] == {"ttft_ms": 300.0, "itl_ms": 20.0}  # from the ConfigMap, not defaults
    assert [r.path for r in cluster.requests][-1] == f"/api/v1/namespaces/prod/configmaps/{cm['metadata']['name']}"
    # the planner component is all schema (the kit's older CRD prunes only scalingAdapter.enabled)
    assert [p for p in cluster.pruned if "scalingAdapter" not in p] == []


def test_live_of_a_missing_dgd_is_one_line(capsys, tmp_path, cluster):
    code, data, err = run_import(capsys, "dgd", "--live", "nope", "--namespace", "prod",
                                 "--kubeconfig", str(kubeconfig(tmp_path, cluster)))
    assert code == 2 and data is None and len(err) == 1
    assert "404 Not Found" in err[0] and "nope" in err[0]


def test_live_wva_configmap(capsys, tmp_path, cluster):
    cm = yaml.safe_load((DATA / "wva-configmap-saturation-scaling.yaml").read_text())
    cluster.configmaps[("wva-system", cm["metadata"]["name"])] = cm
    code, data, err = run_import(capsys, "wva", "--live", cm["metadata"]["name"], "--namespace", "wva-system",
                                 "--kubeconfig", str(kubeconfig(tmp_path, cluster)))
    assert code == 0, err
    assert data["planner"]["saturation"]["default"]["kv_cache_threshold"] == 0.8


# -- the mapping table cannot drift ----------------------------------------------------------------


def test_every_dynamo_1_6_1_planner_setting_and_pre_1_0_flag_is_in_the_table():
    keys = json.loads((DATA / "dynamo-1.6.1-planner-config-keys.json").read_text())
    assert sorted(set(keys) - set(DYNAMO_FIELDS)) == []
    assert set(LEGACY_FLAGS.values()) <= set(DYNAMO_FIELDS)


def test_the_docs_show_the_generated_table():
    docs = (PROJECT_ROOT / "docs" / "dynamo.md").read_text()
    assert mapping_table() in docs, "docs/dynamo.md: paste `python -c 'from connectors.migrate.table import " \
                                    "mapping_table; print(mapping_table())'` into the migration section"


if __name__ == "__main__":  # print the table for the docs
    sys.stdout.write(mapping_table())
