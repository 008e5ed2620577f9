"""`import dgd` against Dynamo 1.6.1's own planner start-up: the same DGD, the same settings.

Every 1.x DGD in tests/data/migrate, and inputs built from them that exercise each
parsing rule, go through Dynamo 1.6.1's entry point in .venv-dynamo (one subprocess
for the batch, tests/support/import_dynamo_driver.py: argparse `--config`, then
`PlannerConfig.from_config_arg` under the planner container's environment and mounted
ConfigMap files, then the GPU-count path of start-up) and through `sla-planner import
dgd`. Each setting Dynamo runs with is compared with what the import wrote, mapped by
hand here; a difference passes only when it is one of DIFFERENCES (the docs' table)
and a stderr line names it. Each input Dynamo refuses, the import refuses too: exit 2
and one line naming the setting. The pre-1.0 DGD starts a different planner,
`planner_sla`: Dynamo 1.6.1 refuses its flags, the import reads them by that
planner's rules (tests/connectors/test_import.py checks those).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from connectors.migrate.dynamo import DIFFERENCES
from connectors.migrate.table import differences_table
from planner_cli.main import main
from tests.conftest import PROJECT_ROOT

DATA = Path(__file__).resolve().parents[1] / "data" / "migrate"
DYNAMO_PYTHON = PROJECT_ROOT / ".venv-dynamo" / "bin" / "python"
DRIVER = Path(__file__).resolve().parents[1] / "support" / "import_dynamo_driver.py"
THROUGHPUT = yaml.safe_load((DATA / "dynamo-1.6.1-disagg_planner_throughput.yaml").read_text())
PROFILER_DGD, PROFILER_CM = yaml.safe_load_all(
    (DATA / "dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml").read_text())
CONFIG_PATH = "/workspace/planner_config/planner_config.json"
SLA = {"environment": "kubernetes", "optimization_target": "sla", "pre_deployment_sweeping_mode": "none",
       "throughput_adjustment_interval_seconds": 60}


# -- building inputs -------------------------------------------------------------------------------


def _planner(obj: dict) -> dict:
    """The planner's main container (v1alpha1 services or v1beta1 components)."""
    if "services" in obj["spec"]:
        return obj["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]
    comp = next(c for c in obj["spec"]["components"] if c.get("type") == "planner")
    return comp["podTemplate"]["spec"]["containers"][0]


def inline(config: dict | str, *, extra_args: tuple[str, ...] = (), env: dict | None = None,
           worker_gpus: str | None = None) -> dict:
    """The throughput example (v1alpha1) with this inline --config, planner env and workers' GPU limit."""
    obj = copy.deepcopy(THROUGHPUT)
    main_c = _planner(obj)
    main_c["args"] = ["--config", config if isinstance(config, str) else json.dumps(config), *extra_args]
    main_c["env"] = [{"name": k, "value": v} for k, v in (env or {}).items()]
    if worker_gpus is not None:
        for name in ("prefill", "decode"):
            obj["spec"]["services"][name]["resources"] = {"limits": {"gpu": worker_gpus}}
    return obj


def mounted(text: str, *, key: str = "planner_config.json") -> list[dict]:
    """The profiler's v1beta1 DGD reading --config from a mounted ConfigMap file `key` holding `text`."""
    obj, cm = copy.deepcopy(PROFILER_DGD), copy.deepcopy(PROFILER_CM)
    _planner(obj)["args"] = ["--config", f"/workspace/planner_config/{key}"]
    cm["data"] = {key: text}
    return [obj, cm]


def shipped(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DATA / name).read_text()) if d]


OK = {
    "shipped throughput example": shipped("dynamo-1.6.1-disagg_planner_throughput.yaml"),
    "shipped load example": shipped("dynamo-1.6.1-disagg_planner_load.yaml"),
    "shipped 8b example": shipped("dynamo-1.6.1-disagg_8b_planner.yaml"),
    "shipped profiler DGD + ConfigMap": shipped("dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml"),
    "aliases: ttft_ms, itl_ms and the interval win in either order": [inline(
        {**SLA, "ttft": 100, "ttft_ms": 200, "itl_ms": 30, "itl": 5,
         "throughput_adjustment_interval": 30, "throughput_adjustment_interval_seconds": 90})],
    "GPUs: the worker's count before the config's": [inline({**SLA, "prefill_engine_num_gpu": 2,
                                                             "decode_engine_num_gpu": 4}, worker_gpus="1")],
    "GPUs: the config's when the workers have none": [inline({**SLA, "prefill_engine_num_gpu": 2,
                                                              "decode_engine_num_gpu": 4}, worker_gpus="0")],
    "GPUs: multi-GPU workers": [inline(SLA, worker_gpus="4")],
    "kalman_min_points 1 (ours needs 2)": [inline({**SLA, "load_predictor": "kalman", "kalman_min_points": 1})],
    "no_correction in a 1.x config is ignored": [inline({**SLA, "no_correction": True, "bogus_key": 3})],
    "lax values: strings and whole floats": [inline({**SLA, "max_gpu_budget": "16", "min_endpoint": 0,
                                                      "decode_min_endpoint": "2", "ttft_ms": "250",
                                                      "max_throughput_scaling_replicas": 3.0,
                                                      "load_predictor_log1p": "yes"})],
    "env: PROMETHEUS_SSL_VERIFY=on reads as false, the rest parsed": [inline(SLA, env={
        "PROMETHEUS_SSL_VERIFY": "on", "PROMETHEUS_ENDPOINT": "https://prom.example:9090",
        "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS": "30", "PLANNER_PROMETHEUS_PORT": "9091",
        "PROMETHEUS_TOKEN_FILE": "/var/run/token"})],
    "env: PROMETHEUS_SSL_VERIFY=yes; an https URL": [inline(SLA, env={
        "PROMETHEUS_SSL_VERIFY": "yes", "PROMETHEUS_ENDPOINT": "https://prom.example:9090"})],
    "env: an https URL and no PROMETHEUS_SSL_VERIFY (we verify)": [inline(SLA, env={
        "PROMETHEUS_ENDPOINT": "https://prom.example:9090"})],
    "env: PROMETHEUS_EXTRA_QUERY_PARAMS (no equivalent: reported)": [inline(SLA, env={
        "PROMETHEUS_EXTRA_QUERY_PARAMS": "namespace=team-a&tenant=b"})],
    "env below the config's value": [inline({**SLA, "metric_pulling_prometheus_endpoint": "http://cfg:9090",
                                             "metric_pulling_prometheus_ssl_verify": True},
                                            env={"PROMETHEUS_ENDPOINT": "http://env:9090",
                                                 "PROMETHEUS_SSL_VERIFY": "false"})],
    "virtual environment: DYN_NAMESPACE and the config's GPUs": [inline(
        {**SLA, "environment": "virtual", "prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 1},
        env={"DYN_NAMESPACE": "team-a"})],
    "minimum endpoints exactly on the GPU budget": [inline({**SLA, "max_gpu_budget": 8, "min_gpu_budget": 8},
                                                           worker_gpus="4")],
    "prophet window": [inline({**SLA, "load_predictor": "prophet", "prophet_window_size": 24})],
    "a .yaml ConfigMap file": mounted(yaml.safe_dump({**SLA, "ttft_ms": 300, "itl_ms": 25}), key="planner.yaml"),
    "a suffixless ConfigMap file holding YAML": mounted(yaml.safe_dump({**SLA, "ttft_ms": 320}), key="planner"),
    "--config=JSON and an abbreviation": [inline(SLA)],
}
OK["--config=JSON and an abbreviation"][0]["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"] = [
    "--conf=" + json.dumps({**SLA, "ttft_ms": 180})]

REFUSED = {  # id: (input, the setting our one line names, what Dynamo's refusal says)
    "an unknown flag beside --config": ([inline(SLA, extra_args=("--log-level", "debug"))], "--log-level",
                                        "unrecognized arguments: --log-level"),
    "a pre-1.0 flag beside --config": ([inline(SLA, extra_args=("--ttft", "100"))], "--ttft",
                                       "unrecognized arguments: --ttft"),
    "no --config": ([inline(SLA)], "--config", "required: --config"),
    "--config '[1, 2]'": ([inline("[1, 2]")], "--config", "valid dictionary"),
    "--config not JSON": ([inline("{ttft_ms: 200}")], "--config", "neither a valid file path nor valid JSON"),
    "YAML in a .json ConfigMap file": (mounted(yaml.safe_dump({**SLA, "ttft_ms": 300})), "--config",
                                       "JSONDecodeError"),
    "a ConfigMap without the file": (mounted("{}", key="other.json"), "--config",
                                     "neither a valid file path nor valid JSON"),
    "load_predictor ets": ([inline({**SLA, "load_predictor": "ets"})], "load_predictor", "load_predictor:"),
    "prefill_min_endpoint 0": ([inline({**SLA, "prefill_min_endpoint": 0})], "prefill_min_endpoint",
                               "prefill_min_endpoint:"),
    "max_throughput_scaling_replicas 0": ([inline({**SLA, "max_throughput_scaling_replicas": 0})],
                                          "max_throughput_scaling_replicas", "max_throughput_scaling_replicas:"),
    "ttft_ms 0": ([inline({**SLA, "ttft_ms": 0})], "ttft_ms", "ttft_ms must be > 0"),
    "an interval of 7.5 s": ([inline({**SLA, "throughput_adjustment_interval_seconds": 7.5})],
                             "throughput_adjustment_interval_seconds", "throughput_adjustment_interval_seconds:"),
    "mode 'both'": ([inline({**SLA, "mode": "both"})], "mode", "mode:"),
    "fpm_sample_bucket_size 15 (not a square)": ([inline({**SLA, "fpm_sample_bucket_size": 15})],
                                                 "fpm_sample_bucket_size", "perfect square"),
    "no scaling mode left": ([inline({**SLA, "enable_throughput_scaling": False})], "enable_throughput_scaling",
                             "At least one scaling mode"),
    "load interval not shorter than throughput's": ([inline({**SLA, "enable_load_scaling": True,
                                                              "load_adjustment_interval_seconds": 60})],
                                                    "load_adjustment_interval_seconds", "must be shorter than"),
    "intervals off the scale interval": ([inline({**SLA, "scheduling": {"scale_interval_seconds": 7}})],
                                         "scheduling", "scale_interval_seconds must evenly divide"),
    "load target without thresholds": ([inline({"optimization_target": "load"})], "prefill_scale_up_queue_tokens",
                                       "requires prefill_scale_up_queue_tokens"),
    "env PLANNER_PROMETHEUS_PORT=metrics": ([inline(SLA, env={"PLANNER_PROMETHEUS_PORT": "metrics"})],
                                            "PLANNER_PROMETHEUS_PORT", "invalid literal for int()"),
    "env PROMETHEUS_EXTRA_QUERY_PARAMS not a query string": (
        [inline(SLA, env={"PROMETHEUS_EXTRA_QUERY_PARAMS": "tenant"})], "PROMETHEUS_EXTRA_QUERY_PARAMS",
        "bad query field"),
    "env DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS=0": (
        [inline(SLA, env={"DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS": "0"})],
        "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS", "metric_pulling_prometheus_request_timeout_seconds:"),
    "workers without GPUs and no engine GPUs in the config": ([inline(SLA, worker_gpus="0")],
                                                              "prefill_engine_num_gpu",
                                                              "Missing prefill_engine_num_gpu"),
    "minimum endpoints over the GPU budget": ([inline({**SLA, "max_gpu_budget": 6}, worker_gpus="4")],
                                              "max_gpu_budget", "exceeding max_gpu_budget=6"),
    "min_gpu_budget above max_gpu_budget": ([inline({**SLA, "min_gpu_budget": 10})], "min_gpu_budget",
                                            "min_gpu_budget=10 exceeds max_gpu_budget=8"),
    "virtual environment without engine GPUs": ([inline({**SLA, "environment": "virtual"})],
                                                "prefill_engine_num_gpu", "Missing prefill_engine_num_gpu"),
}
_planner(REFUSED["a ConfigMap without the file"][0][0])["args"] = ["--config", CONFIG_PATH]
REFUSED["no --config"][0][0]["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"] = []


# -- Dynamo's side ----------------------------------------------------------------------------------


def dynamo_case(case_id: str, docs: list[dict]) -> dict:
    """The planner pod as the kubelet starts it, and the DGD as Dynamo's planner reads it (v1beta1 + status)."""
    obj = next(d for d in docs if d["kind"] == "DynamoGraphDeployment")
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    main_c = _planner(obj)
    env = {e["name"]: e["value"] for e in (obj["spec"].get("envs") or []) + (main_c.get("env") or [])}
    files = {}
    if "components" in obj["spec"]:
        comps = obj["spec"]["components"]
        planner_comp = next(c for c in comps if c.get("type") == "planner")
        volumes = {v["name"]: v for v in planner_comp["podTemplate"]["spec"].get("volumes", [])}
        for m in main_c.get("volumeMounts", []):
            cm = volumes[m["name"]].get("configMap", {}).get("name")
            for key, text in configmaps.get(cm, {}).items():
                files[f"{m['mountPath']}/{key}"] = text
        workers = [(c["name"], c.get("type", ""), int(c["podTemplate"]["spec"]["containers"][0].get(
            "resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))) for c in comps]
    else:
        workers = [(n, s.get("subComponentType") or s.get("componentType", ""),
                    int((s.get("resources") or {}).get("limits", {}).get("gpu", 0)))
                   for n, s in obj["spec"]["services"].items()]
    deployment = {"metadata": {"name": obj["metadata"]["name"], "generation": 1},
                  "spec": {"components": [{"name": n, "type": t} for n, t, _ in workers]},
                  "status": {"observedGeneration": 1, "components": {  # the operator's projection of the pod spec
                      n: {"gpusPerEngine": g, "gpusPerReplica": g} for n, _, g in workers}}}
    args = main_c.get("args") or []
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    return {"id": case_id, "argv": args, "env": env, "files": files, "deployment": deployment}


@pytest.fixture(scope="module")
def dynamo():
    """Dynamo 1.6.1's start-up parsing of every input, in one subprocess."""
    if not DYNAMO_PYTHON.exists():
        pytest.fail(f"{DYNAMO_PYTHON} is missing: run `bash scripts/install_dynamo.sh`")
    cases = [dynamo_case(i, docs) for i, docs in OK.items()]
    cases += [dynamo_case(i, docs) for i, (docs, _, _) in REFUSED.items()]
    legacy = dynamo_case(PRE_1_0, shipped("dynamo-0.x-vllm-disagg_planner.yaml"))
    script = shlex.split(_planner(shipped("dynamo-0.x-vllm-disagg_planner.yaml")[0])["args"][0])
    legacy["argv"] = script[script.index("planner_sla") + 1:]  # its flags, given to 1.6.1's entry point
    cases.append(legacy)
    clean = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}  # no PROMETHEUS_* from here
    done = subprocess.run([str(DYNAMO_PYTHON), str(DRIVER)], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=300, cwd=str(PROJECT_ROOT), env=clean)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# -- our side ---------------------------------------------------------------------------------------


def run_import(capsys, tmp_path: Path, docs: list[dict], *args: str) -> tuple[int, dict | None, list[str]]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code = main(["import", "dgd", str(path), "--namespace", "dyn", *args])
    captured = capsys.readouterr()
    return code, (yaml.safe_load(captured.out) if captured.out else None), captured.err.splitlines()


def ours_as_dynamo(d: dict, gpus: dict) -> dict:
    """Dynamo's settings as our configuration should carry them, mapped by hand (docs/dynamo.md's table)."""
    budget = d["max_gpu_budget"]
    prefill_min = d["prefill_min_endpoint"] if d["prefill_min_endpoint"] is not None else d["min_endpoint"]
    decode_min = d["decode_min_endpoint"] if d["decode_min_endpoint"] is not None else d["min_endpoint"]
    expected = {
        "planner.slo.ttft_ms": d["ttft_ms"],
        "planner.slo.itl_ms": d["itl_ms"],
        "planner.adjustment_interval_s": d["throughput_adjustment_interval_seconds"],
        "planner.decision.max_gpu_budget": budget if budget >= 0 else None,
        "planner.decision.prefill.min_replicas": prefill_min,
        "planner.decision.decode.min_replicas": decode_min,
        "planner.decision.max_step_replicas": d["max_throughput_scaling_replicas"],
        "planner.sizing.gpus_per_prefill_engine": gpus["prefill"],
        "planner.sizing.gpus_per_decode_engine": gpus["decode"],
        "planner.predictor.name": d["load_predictor"],
        "metrics.prometheus_url": d["metric_pulling_prometheus_endpoint"],
        "metrics.request_timeout_s": d["metric_pulling_prometheus_request_timeout_seconds"],
        "metrics.bearer_token_file": d["metric_pulling_prometheus_token_file"],
        "planner_metrics.port": d["metric_reporting_prometheus_port"] or None,
        "connector.kind": d["environment"],
        "planner.correction.enabled": True,  # Dynamo 1.6.1 has no correction factors to turn off
    }
    if d["load_predictor"] == "kalman":
        expected["planner.predictor.params.kalman.min_points"] = d["kalman_min_points"]
    if d["load_predictor"] == "prophet":
        expected["planner.predictor.history_intervals"] = d["prophet_window_size"]
    if d["load_predictor"] == "arima":
        expected["planner.predictor.log1p"] = d["load_predictor_log1p"]
    if d["metric_pulling_prometheus_endpoint"].startswith("https:"):  # over http verifying changes nothing
        expected["metrics.verify_tls"] = d["metric_pulling_prometheus_ssl_verify"]
    if d["model_name"]:
        expected["planner.model_id"] = d["model_name"]
    if d["environment"] == "virtual":
        expected["planner.namespace"] = d["namespace"]
    if budget > 0:
        expected["planner.decision.prefill.max_replicas"] = max(prefill_min, 1, budget // gpus["prefill"])
    return expected


DEFAULTS_OF_OURS = {"planner.sizing.gpus_per_prefill_engine": 1, "planner.sizing.gpus_per_decode_engine": 1,
                    "metrics.verify_tls": True, "metrics.request_timeout_s": 10.0, "metrics.bearer_token_file": None,
                    "planner_metrics.port": None, "planner.correction.enabled": True, "planner.predictor.log1p": False}
# Which DIFFERENCES entry allows a difference in which of our fields.
ALLOWED = {"metrics.verify_tls": "metric_pulling_prometheus_ssl_verify",
           "planner.predictor.params.kalman.min_points": "kalman_min_points"}


def written(data: dict, dotted: str):
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return DEFAULTS_OF_OURS.get(dotted, "<absent>")
        node = node[part]
    return node


# Dynamo settings ours_as_dynamo compares; every other one that differs from Dynamo's default must be a stderr line.
COMPARED = {"ttft_ms", "itl_ms", "throughput_adjustment_interval_seconds", "max_gpu_budget", "min_endpoint",
            "prefill_min_endpoint", "decode_min_endpoint", "max_throughput_scaling_replicas", "prefill_engine_num_gpu",
            "decode_engine_num_gpu", "load_predictor", "metric_pulling_prometheus_endpoint",
            "metric_pulling_prometheus_ssl_verify", "metric_pulling_prometheus_request_timeout_seconds",
            "metric_pulling_prometheus_token_file", "metric_reporting_prometheus_port", "environment",
            "kalman_min_points", "prophet_window_size", "load_predictor_log1p", "model_name"}
# Not the operator's to set: Dynamo's namespace on Kubernetes is injected by its operator (ours: the DGD's
# namespace), and the pipeline cadence is derived from the intervals unless the config sets it.
NOT_COMPARED = {"namespace", "scheduling", "plugin_registration"}
# The environment variable Dynamo 1.6.1 reads a key from when its config leaves the key out (a line may name either).
ENV_OF = {"metric_pulling_prometheus_endpoint": "PROMETHEUS_ENDPOINT",
          "metric_pulling_prometheus_token": "PROMETHEUS_TOKEN",
          "metric_pulling_prometheus_token_file": "PROMETHEUS_TOKEN_FILE",
          "metric_pulling_prometheus_ssl_verify": "PROMETHEUS_SSL_VERIFY",
          "metric_pulling_prometheus_extra_query_params": "PROMETHEUS_EXTRA_QUERY_PARAMS",
          "metric_pulling_prometheus_ca_bundle": "PROMETHEUS_CA_BUNDLE",
          "metric_pulling_prometheus_request_timeout_seconds": "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS",
          "metric_reporting_prometheus_port": "PLANNER_PROMETHEUS_PORT"}


@pytest.mark.parametrize("case_id", list(OK))
def test_import_writes_what_dynamo_runs_with(dynamo, capsys, tmp_path, case_id):
    result = dynamo[case_id]
    assert "refused" not in result, result
    code, data, err = run_import(capsys, tmp_path, OK[case_id])
    assert code == 0, err
    for key, value in result["settings"].items():  # nothing lost silently
        if key in COMPARED or key in NOT_COMPARED or value == dynamo["__defaults__"][key]:
            continue
        if key == "optimization_target" and value == "sla":  # what sla-planner does
            continue
        names = (key, ENV_OF.get(key, key))
        assert any(n in line for line in err for n in names), f"{case_id}: Dynamo runs with {key}={value!r}, " \
                                                               "no line says so"
    for dotted, value in ours_as_dynamo(result["settings"], result["gpus_per_engine"]).items():
        got = written(data, dotted)
        if got == value:
            continue
        key = ALLOWED.get(dotted)
        assert key in DIFFERENCES, f"{case_id}: {dotted} is {got!r}, Dynamo runs with {value!r}"
        assert any(": note: " in line and key in line for line in err), (case_id, dotted, err)


@pytest.mark.parametrize("case_id", list(REFUSED))
def test_what_dynamo_refuses_the_import_refuses(dynamo, capsys, tmp_path, case_id):
    docs, setting, dynamo_says = REFUSED[case_id]
    assert dynamo_says in dynamo[case_id].get("refused", ""), dynamo[case_id]
    code, data, err = run_import(capsys, tmp_path, docs)
    assert (code, data, len(err)) == (2, None, 1), err
    assert setting in err[0], (dynamo[case_id]["refused"], err[0])


PRE_1_0 = "shipped pre-1.0 DGD"


def test_the_pre_1_0_dgd_is_not_1_6_1_input_and_is_read_as_its_own_planner(dynamo, capsys, tmp_path):
    # Dynamo 1.6.1 cannot start from planner_sla's flags; the import reads them by that planner's rules
    assert "required: --config" in dynamo[PRE_1_0]["refused"], dynamo[PRE_1_0]
    code, data, err = run_import(capsys, tmp_path, shipped("dynamo-0.x-vllm-disagg_planner.yaml"))
    assert code == 0, err
    assert data["planner"]["adjustment_interval_s"] == 60  # --adjustment-interval=60
    assert any("pre-1.0 Prometheus default" in line for line in err)


def test_lenient_skips_and_lists_what_dynamo_refuses(capsys, tmp_path):
    docs = inline({**SLA, "load_predictor": "ets", "prefill_min_endpoint": 0, "ttft_ms": 150},
                  extra_args=("--log-level", "debug"))
    code, data, err = run_import(capsys, tmp_path, [docs], "--lenient")
    assert code == 0, err
    assert data["planner"]["slo"]["ttft_ms"] == 150.0
    assert data["planner"]["predictor"]["name"] == "arima"  # Dynamo's default in place of the refused value
    assert data["planner"]["decision"]["prefill"]["min_replicas"] == 1  # min_endpoint's 1, not 0
    skipped = [line for line in err if line.endswith("skipped (--lenient)")]
    assert [line.split("not mapped: ")[1].split("=")[0] for line in skipped] == [
        "argument --log-level", "config prefill_min_endpoint", "config load_predictor"]


def test_every_difference_is_in_the_docs_table():
    assert differences_table() in (PROJECT_ROOT / "docs" / "dynamo.md").read_text(), \
        "docs/dynamo.md: paste `python -c 'from connectors.migrate.table import differences_table; " \
        "print(differences_table())'` into the migration section"
