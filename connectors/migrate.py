"""Dynamo planner arguments and llm-d WVA ConfigMaps as our run configuration: pure functions, no I/O.

Dynamo 1.6.1's planner (`python3 -m dynamo.planner --config <JSON | file>`) takes
one PlannerConfig; its file is usually a ConfigMap mounted into the Planner
component. Before 1.0 it took flags (`python3 -m planner_sla --adjustment-interval=60
...`, often inside `/bin/sh -c`). Both are read here: flags become the 1.6.1
keys they turned into, so one table (`DYNAMO_FIELDS`) maps every key to a field
of ours or says why it has none. Settings that are absent take Dynamo's
defaults, so the migrated planner starts from what Dynamo actually ran with;
a setting without an equivalent is reported only when it differs from Dynamo's
default (a default changes nothing). Environment variables the 1.6.1 planner
reads (PROMETHEUS_ENDPOINT, DYN_NAMESPACE, ...) count as settings.

WVA's saturation ConfigMap holds one YAML entry per key: `default`, and
per-model overrides carrying `model_id` and `namespace`; its controller
ConfigMap holds PROMETHEUS_BASE_URL, GLOBAL_OPT_INTERVAL and the like.

Every function returns our configuration as plain data plus the list of what
could not be mapped; validating it against our models and reading files or the
cluster are the caller's job.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import yaml
from pydantic import ValidationError

from connectors import dgd
from planner.config import SaturationThresholds

PROMETHEUS_DEFAULT = "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"

# Dynamo 1.6.1's PlannerConfig defaults (dynamo/planner/config/defaults.py and planner_config.py).
DYNAMO_DEFAULTS: dict[str, object] = {
    "environment": "kubernetes", "backend": "vllm", "mode": "disagg", "optimization_target": "throughput",
    "log_dir": None, "throughput_adjustment_interval_seconds": 180, "max_throughput_scaling_replicas": 8,
    "max_gpu_budget": 8, "min_gpu_budget": -1, "min_endpoint": 1, "prefill_min_endpoint": None,
    "decode_min_endpoint": None, "control_api_port": 9086, "decode_engine_num_gpu": None,
    "prefill_engine_num_gpu": None, "profile_results_dir": "profiling_results", "aic_interpolation": None,
    "ais_perf_model": None, "pre_deployment_sweeping_mode": "rapid", "ttft_ms": 500.0, "itl_ms": 50.0,
    "load_predictor": "arima", "load_predictor_log1p": False, "prophet_window_size": 50,
    "load_predictor_warmup_trace": None, "kalman_q_level": 1.0, "kalman_q_trend": 0.1, "kalman_r": 10.0,
    "kalman_min_points": 5, "metric_pulling_prometheus_endpoint": PROMETHEUS_DEFAULT,
    "metric_pulling_prometheus_token": None, "metric_pulling_prometheus_token_file": None,
    "metric_pulling_prometheus_ssl_verify": False, "metric_pulling_prometheus_extra_query_params": None,
    "metric_pulling_prometheus_ca_bundle": None, "metric_pulling_prometheus_request_timeout_seconds": 10.0,
    "metric_reporting_prometheus_port": 0, "throughput_metrics_source": "frontend", "model_name": None,
    "global_planner_namespace": None, "enable_throughput_scaling": True, "enable_load_scaling": False,
    "load_adjustment_interval_seconds": 5, "max_num_fpm_samples": 64, "fpm_sample_bucket_size": 16,
    "load_scaling_down_sensitivity": 80, "prefill_scale_up_queue_tokens": None,
    "prefill_scale_down_queue_tokens": None, "decode_scale_up_kv_rate": None, "decode_scale_down_kv_rate": None,
    "load_min_observations": 5, "speculative_nextn": 0, "advisory": False, "enable_power_awareness": False,
    "total_gpu_power_limit": None, "report_interval_hours": 24.0, "report_output_dir": "./planner_reports",
    "report_filename": None, "report_write_gzip_log": True, "live_dashboard_port": 8080, "namespace": "dynamo",
    "scheduling": None, "plugin_registration": None,
}

# Environment variables the 1.6.1 planner reads into its config (default_factory=os.environ.get(...)).
DYNAMO_ENV = {
    "DYN_NAMESPACE": "namespace",
    "PROMETHEUS_ENDPOINT": "metric_pulling_prometheus_endpoint",
    "PROMETHEUS_TOKEN": "metric_pulling_prometheus_token",
    "PROMETHEUS_TOKEN_FILE": "metric_pulling_prometheus_token_file",
    "PROMETHEUS_SSL_VERIFY": "metric_pulling_prometheus_ssl_verify",
    "PROMETHEUS_EXTRA_QUERY_PARAMS": "metric_pulling_prometheus_extra_query_params",
    "PROMETHEUS_CA_BUNDLE": "metric_pulling_prometheus_ca_bundle",
    "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS": "metric_pulling_prometheus_request_timeout_seconds",
    "PLANNER_PROMETHEUS_PORT": "metric_reporting_prometheus_port",
}

# Flags of the pre-1.0 planner (dynamo/planner/utils/planner_argparse.py) named differently from the 1.6.1 key.
LEGACY_FLAGS = {
    "adjustment_interval": "throughput_adjustment_interval_seconds",
    "throughput_adjustment_interval": "throughput_adjustment_interval_seconds",
    "load_adjustment_interval": "load_adjustment_interval_seconds",
    "ttft": "ttft_ms",
    "itl": "itl_ms",
    "no_operation": "advisory",
    "enable_loadbased_scaling": "enable_load_scaling",
    "loadbased_adjustment_interval": "load_adjustment_interval_seconds",
    "loadbased_scaling_down_sensitivity": "load_scaling_down_sensitivity",
    "loadbased_min_observations": "load_min_observations",
}
LEGACY_ONLY_DEFAULTS = {
    "disable_throughput_scaling": False, "no_correction": False, "loadbased_router_metrics_url": None,
    "loadbased_learning_window": 50, "loadbased_metric_samples": 10,
}
_SWITCHES = {"no_operation", "load_predictor_log1p", "no_correction", "enable_throughput_scaling",
             "disable_throughput_scaling", "enable_loadbased_scaling", "advisory", "enable_load_scaling"}
_INTS = {"decode_engine_num_gpu", "prefill_engine_num_gpu", "prefill_min_endpoint", "decode_min_endpoint",
         "total_gpu_power_limit", "prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens",
         "loadbased_learning_window", "loadbased_metric_samples"}
_FLOATS = {"decode_scale_up_kv_rate", "decode_scale_down_kv_rate", "report_interval_hours"}

# Component names the pre-1.0 planner found workers by, per backend (dynamo/planner/defaults.py).
LEGACY_WORKER_NAMES = {
    "vllm": ("VllmPrefillWorker", "VllmDecodeWorker"),
    "sglang": ("prefill", "decode"),
    "trtllm": ("TRTLLMPrefillWorker", "TRTLLMDecodeWorker"),
    "mocker": ("prefill", "decode"),
}

_NO_EQUIVALENT = "no equivalent"
# Every Dynamo 1.6.1 PlannerConfig key (and pre-1.0 flag) -> (our field, how). An empty field: not mapped.
DYNAMO_FIELDS: dict[str, tuple[str, str]] = {
    "environment": ("connector.kind", "kubernetes: `kind: kubernetes`, `dgd_name` and `namespace` from the DGD; "
                                      "virtual: `kind: virtual`; global-planner: not mapped"),
    "namespace": ("planner.namespace", "virtual: the Dynamo namespace (DYN_NAMESPACE); kubernetes: the DGD's "
                                       "Kubernetes namespace is used instead"),
    "backend": ("connector.prefill_service / decode_service", "the backend's pre-1.0 worker names when the "
                                                               "workers carry no type; sglang/trtllm: worker "
                                                               "metric queries read vLLM series (reported)"),
    "mode": ("", "disagg only: sla-planner plans both pools"),
    "optimization_target": ("sizing.mode: sla", "sla maps; throughput, latency and load (threshold "
                                                "scaling) are reported: the saturation guardrail is the nearest"),
    "throughput_adjustment_interval_seconds": ("planner.adjustment_interval_s", "as is (`--adjustment-interval`)"),
    "ttft_ms": ("planner.slo.ttft_ms", "as is (`--ttft`)"),
    "itl_ms": ("planner.slo.itl_ms", "as is (`--itl`)"),
    "max_gpu_budget": ("planner.decision.max_gpu_budget", "-1: none; also caps each pool's max_replicas "
                                                          "(budget / GPUs per engine)"),
    "min_endpoint": ("planner.decision.{prefill,decode}.min_replicas", "0 also sets allow_scale_to_zero"),
    "prefill_min_endpoint": ("planner.decision.prefill.min_replicas", "overrides min_endpoint"),
    "decode_min_endpoint": ("planner.decision.decode.min_replicas", "overrides min_endpoint"),
    "max_throughput_scaling_replicas": ("planner.decision.max_step_replicas", "as is (1.x only)"),
    "prefill_engine_num_gpu": ("planner.sizing.gpus_per_prefill_engine", "unset: the DGD's prefill GPUs"),
    "decode_engine_num_gpu": ("planner.sizing.gpus_per_decode_engine", "unset: the DGD's decode GPUs"),
    "profile_results_dir": ("planner.profile.dir", "a path inside the planner's container is reported; "
                                                   "`--profile-dir` gives the local copy"),
    "load_predictor": ("planner.predictor.name", "constant, arima, kalman, prophet: same names"),
    "load_predictor_log1p": ("planner.predictor.log1p", "ARIMA only here (reported for others)"),
    "prophet_window_size": ("planner.predictor.history_intervals", "with load_predictor prophet"),
    "load_predictor_warmup_trace": ("planner.predictor.warmup_trace_path", "same Mooncake JSONL; a path inside "
                                                                           "the container is reported"),
    "kalman_min_points": ("planner.predictor.params.kalman.min_points", "as is (at least 2)"),
    "kalman_q_level": ("", "our Kalman filter tunes its noise on the history"),
    "kalman_q_trend": ("", "our Kalman filter tunes its noise on the history"),
    "kalman_r": ("", "our Kalman filter tunes its noise on the history"),
    "metric_pulling_prometheus_endpoint": ("metrics.prometheus_url", "also PROMETHEUS_ENDPOINT"),
    "metric_pulling_prometheus_token_file": ("metrics.bearer_token_file", "also PROMETHEUS_TOKEN_FILE"),
    "metric_pulling_prometheus_ssl_verify": ("metrics.verify_tls", "only when set (PROMETHEUS_SSL_VERIFY): "
                                                                   "we verify by default"),
    "metric_pulling_prometheus_request_timeout_seconds": ("metrics.request_timeout_s", "as is"),
    "metric_pulling_prometheus_token": ("", "a token in the config: put it in a file, metrics.bearer_token_file"),
    "metric_pulling_prometheus_ca_bundle": ("", "verify against the system CA store or set it in the image"),
    "metric_pulling_prometheus_extra_query_params": ("", _NO_EQUIVALENT),
    "metric_reporting_prometheus_port": ("planner_metrics.port", "> 0: `enabled: true` and the port"),
    "model_name": ("planner.model_id, metrics.frontend_selector",
                   "unset: the worker's --served-model-name/--model-name/--model, as Dynamo reads it"),
    "throughput_metrics_source": ("", "frontend only: router metrics are not read"),
    "enable_throughput_scaling": ("", "true: the SLA sizing every interval; false is reported"),
    "enable_load_scaling": ("", "the fast load-based loop; the saturation guardrail is the nearest"),
    "load_adjustment_interval_seconds": ("", "load-based loop and FPM tuning: no equivalent (correction factors)"),
    "load_scaling_down_sensitivity": ("", "load-based loop"),
    "load_min_observations": ("", "load-based loop"),
    "prefill_scale_up_queue_tokens": ("", "load target: see the saturation guardrail"),
    "prefill_scale_down_queue_tokens": ("", "load target: see the saturation guardrail"),
    "decode_scale_up_kv_rate": ("", "load target: see saturation.default.kv_cache_threshold"),
    "decode_scale_down_kv_rate": ("", "load target: see the saturation guardrail"),
    "max_num_fpm_samples": ("", "FPM regression: no equivalent"),
    "fpm_sample_bucket_size": ("", "FPM regression: no equivalent"),
    "pre_deployment_sweeping_mode": ("", "profiles come from planner.profile"),
    "aic_interpolation": ("", "AIConfigurator in-process sweep: profile with Dynamo's profiler instead"),
    "ais_perf_model": ("", "AISimulate perf model: profile with Dynamo's profiler instead"),
    "min_gpu_budget": ("", _NO_EQUIVALENT),
    "speculative_nextn": ("", "profile with speculative decoding on instead"),
    "advisory": ("", "run the flow with `dry_run` (`--no-operation`)"),
    "enable_power_awareness": ("", _NO_EQUIVALENT),
    "total_gpu_power_limit": ("", _NO_EQUIVALENT),
    "global_planner_namespace": ("", "global planner: not supported"),
    "control_api_port": ("", "no runtime budget API: edit the config"),
    "log_dir": ("", "Prefect keeps the run logs"),
    "report_interval_hours": ("", "every run leaves Prefect artifacts"),
    "report_output_dir": ("", "every run leaves Prefect artifacts"),
    "report_filename": ("", "every run leaves Prefect artifacts"),
    "report_write_gzip_log": ("", "every run leaves Prefect artifacts"),
    "live_dashboard_port": ("", "the Prefect UI"),
    "scheduling": ("", "plugin pipeline: reported when it registers plugins or opens the gateway"),
    "plugin_registration": ("", "plugin registry: reported when it registers plugins"),
    "disable_throughput_scaling": ("", "pre-1.0 flag; reported"),
    "no_correction": ("planner.correction.enabled: false", "pre-1.0 flag"),
    "loadbased_router_metrics_url": ("", "pre-1.0 load-based loop"),
    "loadbased_learning_window": ("", "pre-1.0 load-based loop"),
    "loadbased_metric_samples": ("", "pre-1.0 load-based loop"),
}


@dataclass(frozen=True)
class Unmapped:
    """One setting the migration could not carry over, and why."""

    key: str
    value: object
    why: str

    def line(self) -> str:
        return f"{self.key}={self.value!r}: {self.why}"


@dataclass
class Migration:
    """Our run configuration as plain data, and what could not be mapped."""

    config: dict
    unmapped: list[Unmapped] = field(default_factory=list)

    def skip(self, key: str, value: object, why: str) -> None:
        self.unmapped.append(Unmapped(key, value, why))


class MigrationError(ValueError):
    """The input is not what the importer reads (the message is one line naming it)."""


@dataclass(frozen=True)
class PlannerComponent:
    """Where a DGD runs its planner: the component, its main container and what is mounted into it."""

    name: str
    version: str
    tokens: tuple[str, ...]  # command and args, shell-split as Dynamo splits worker args
    env: dict[str, str]
    mounts: tuple[tuple[str, str], ...]  # (mount path, what: "ConfigMap <name>" / "PVC <name>")
    configmaps: dict[str, str]  # mount path -> ConfigMap name


# -- reading a DGD -------------------------------------------------------------------------------


def dgd_version(obj: object, *, source: str) -> str:
    """The DGD's API version (v1beta1 or v1alpha1); MigrationError for anything else."""
    if not isinstance(obj, dict) or obj.get("kind") != "DynamoGraphDeployment":
        kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise MigrationError(f"{source}: not a DynamoGraphDeployment (kind {kind!r})")
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    if version not in dgd.VERSIONS:
        raise MigrationError(f"{source}: DynamoGraphDeployment apiVersion {obj.get('apiVersion')!r}: "
                             f"expected nvidia.com/{' or nvidia.com/'.join(dgd.VERSIONS)}")
    return version


def _components(obj: dict, version: str) -> list[tuple[str, dict, str]]:
    """(name, spec, type) of every component."""
    spec = obj.get("spec") or {}
    if version == "v1beta1":
        return [(str(c.get("name")), c, str(c.get("type") or "")) for c in spec.get("components") or []
                if isinstance(c, dict)]
    return [(str(n), s, str(s.get("componentType") or "")) for n, s in (spec.get("services") or {}).items()
            if isinstance(s, dict)]


def _main_container(comp: dict, version: str) -> dict:
    if version == "v1beta1":
        containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        main = next((c for c in containers if c.get("name") == "main"), containers[0] if containers else None)
        if main is not None:
            return main
    return (comp.get("extraPodSpec") or {}).get("mainContainer") or {}


def _split(values) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        return shlex.split(values)
    return [token for value in values if value is not None for token in shlex.split(str(value))]


def _argv(command, args) -> list[str]:
    """The planner process's argv: a `sh -c` script shell-split; else the list as the kubelet passes it.

    A list element holding a flag and its value (`- --load-predictor arima`, as Dynamo's
    planner docs write them) is split too; a JSON value is never touched.
    """
    cmd = [str(c) for c in command or []] if not isinstance(command, str) else shlex.split(command)
    rest = [str(a) for a in args or []] if not isinstance(args, str) else shlex.split(args)
    if cmd and PurePosixPath(cmd[0]).name in ("sh", "bash", "dash") and "-c" in cmd:
        after = cmd[cmd.index("-c") + 1:] + rest
        return shlex.split(after[0]) if after else []
    return cmd + [t for a in rest for t in (shlex.split(a) if a.startswith("--") and " " in a.strip() else [a])]


def _env(items) -> dict[str, str]:
    return {str(e["name"]): str(e.get("value", "")) for e in items or [] if isinstance(e, dict) and "name" in e}


def planner_component(obj: dict, *, source: str) -> PlannerComponent:
    """The DGD's planner: the component of type planner (or named Planner); MigrationError without one."""
    version = dgd_version(obj, source=source)
    comps = _components(obj, version)
    found = [(n, c) for n, c, t in comps if t == "planner"] or [(n, c) for n, c, _ in comps if n == "Planner"]
    if not found:
        raise MigrationError(f"{source}: DynamoGraphDeployment {(obj.get('metadata') or {}).get('name')!r} has no "
                             f"planner component (components: {[n for n, _, _ in comps]})")
    name, comp = found[0]
    main = _main_container(comp, version)
    env = {**_env((obj.get("spec") or {}).get("envs")), **_env(comp.get("envs")), **_env(main.get("env"))}
    volumes = {v.get("name"): v for v in ((comp.get("podTemplate") or {}).get("spec") or {}).get("volumes") or []}
    volumes.update({v.get("name"): v for v in (comp.get("extraPodSpec") or {}).get("volumes") or []})
    mounts, configmaps = [], {}
    for m in main.get("volumeMounts") or []:
        vol = volumes.get(m.get("name")) or {}
        if "configMap" in vol:
            configmaps[m["mountPath"]] = vol["configMap"].get("name")
            mounts.append((m["mountPath"], f"ConfigMap {vol['configMap'].get('name')}"))
        elif "persistentVolumeClaim" in vol:
            mounts.append((m["mountPath"], f"PVC {vol['persistentVolumeClaim'].get('claimName')}"))
        else:
            mounts.append((m["mountPath"], f"volume {m.get('name')}"))
    pvc = comp.get("pvc") or {}
    if pvc.get("mountPoint"):
        mounts.append((pvc["mountPoint"], f"PVC {pvc.get('name')}"))
    for p in comp.get("volumeMounts") or []:
        if p.get("mountPoint"):
            mounts.append((p["mountPoint"], f"PVC {p.get('name')}"))
    return PlannerComponent(
        name=name, version=version, tokens=tuple(_argv(main.get("command"), main.get("args"))),
        env=env, mounts=tuple(mounts), configmaps=configmaps,
    )


def planner_configmaps(obj: dict, *, source: str) -> list[str]:
    """Names of the ConfigMaps mounted into the DGD's planner (where a `--config` file lives)."""
    return sorted(set(planner_component(obj, source=source).configmaps.values()))


def _mounted_from(comp: PlannerComponent, path: str) -> str | None:
    best = None
    for mount, what in comp.mounts:
        if PurePosixPath(path).is_relative_to(mount) and (best is None or len(mount) > len(best[0])):
            best = (mount, what)
    return None if best is None else f"{best[1]} at {best[0]}"


def _planner_args(comp: PlannerComponent) -> list[str]:
    """The tokens after the planner module (`dynamo.planner`, `planner_sla`), else every token."""
    tokens = list(comp.tokens)
    for i, token in enumerate(tokens):
        if token in ("dynamo.planner", "planner_sla", "dynamo.planner.planner_sla") or token.endswith("planner_sla.py"):
            return tokens[i + 1:]
    return tokens


def _coerce(key: str, value: object, *, spelled: str) -> object:
    """A flag's or config value's type as Dynamo parses it; MigrationError naming the flag on a bad value."""
    default = DYNAMO_DEFAULTS.get(key, LEGACY_ONLY_DEFAULTS.get(key))
    try:
        if key in _SWITCHES or isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                    raise ValueError
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if value is None:
            return None
        if key in _INTS or (isinstance(default, int) and key not in _FLOATS):
            number = float(value)
            if number != int(number):
                raise ValueError
            return int(number)
        if key in _FLOATS or isinstance(default, float):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
    except (TypeError, ValueError):
        raise MigrationError(f"planner argument {spelled}: expected a {type(default).__name__ if default is not None else 'number'}, "
                             f"got {value!r}") from None
    return value


@dataclass
class PlannerSettings:
    """The planner's effective settings by 1.6.1 key, and how each was given (for messages)."""

    values: dict[str, object]
    given: dict[str, str]  # key -> how it was spelled ("--ttft", "config ttft_ms", "env PROMETHEUS_ENDPOINT")
    legacy: bool
    config_file: str | None = None  # --config path when its content was not found

    def get(self, key: str) -> object:
        return self.values.get(key, DYNAMO_DEFAULTS.get(key, LEGACY_ONLY_DEFAULTS.get(key)))

    def spelled(self, key: str) -> str:
        return self.given.get(key, f"{key} (Dynamo default)")


def planner_settings(comp: PlannerComponent, *, configmaps: Mapping[str, Mapping[str, str]],
                     source: str) -> PlannerSettings:
    """Parse the planner's `--config` (inline JSON, or a file from a mounted ConfigMap) or its pre-1.0 flags."""
    args = _planner_args(comp)
    values: dict[str, object] = {}
    given: dict[str, str] = {}
    for env_name, key in DYNAMO_ENV.items():
        if env_name in comp.env:
            values[key] = _coerce(key, comp.env[env_name], spelled=f"env {env_name}")
            given[key] = f"env {env_name}"
    flags: list[tuple[str, object]] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, eq, value = token[2:].partition("=")
        key = name.replace("-", "_")
        if not eq:
            if key in _SWITCHES:
                value = "true"
            elif i < len(args) and not args[i].startswith("--"):
                value, i = args[i], i + 1
            else:
                raise MigrationError(f"{source}: planner argument --{name} has no value")
        flags.append((f"--{name}", value))
    config_arg = next((v for f, v in flags if f == "--config"), None)
    legacy = config_arg is None
    config_file = None
    if config_arg is not None:
        data = _config_data(str(config_arg), comp, configmaps, source=source)
        if data is None:
            config_file = str(config_arg)
            data = {}
        for k, v in data.items():
            key = {"throughput_adjustment_interval": "throughput_adjustment_interval_seconds",
                   "load_adjustment_interval": "load_adjustment_interval_seconds",
                   "ttft": "ttft_ms", "itl": "itl_ms"}.get(k, k)
            values[key] = _coerce(key, v, spelled=f"config {k}")
            given[key] = f"config {k}"
    for spelled, value in flags:
        if spelled == "--config":
            continue
        name = spelled[2:].replace("-", "_")
        key = LEGACY_FLAGS.get(name, name)
        values[key] = _coerce(key, value, spelled=spelled)
        given[key] = spelled
    if legacy and "optimization_target" not in values:
        values["optimization_target"] = "sla"  # the pre-1.0 planner_sla sized for SLA targets
    return PlannerSettings(values=values, given=given, legacy=legacy, config_file=config_file)


def _config_data(arg: str, comp: PlannerComponent, configmaps: Mapping[str, Mapping[str, str]], *,
                 source: str) -> dict | None:
    """The `--config` value as a mapping: inline JSON, or the mounted ConfigMap's file; None when not found."""
    text = arg.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MigrationError(f"{source}: planner --config is not valid JSON: {exc}") from None
    else:
        path = PurePosixPath(text)
        data = None
        for mount, cm in comp.configmaps.items():
            if path.is_relative_to(mount) and cm in configmaps:
                content = configmaps[cm].get(str(path.relative_to(mount)))
                if content is not None:
                    try:
                        data = yaml.safe_load(content)  # JSON is YAML
                    except yaml.YAMLError as exc:
                        raise MigrationError(f"{source}: ConfigMap {cm} {path.name}: not JSON or YAML: "
                                             f"{str(exc).splitlines()[0]}") from None
        if data is None:
            return None
    if not isinstance(data, dict):
        raise MigrationError(f"{source}: planner --config must be a mapping, got {type(data).__name__}")
    return data


# -- Dynamo settings -> our configuration ------------------------------------------------------


def _model_from_args(tokens: list[str]) -> str | None:
    """The served model name from worker args, in Dynamo's order (Service.get_model_name)."""
    for flag in ("--served-model-name", "--model-name", "--model", "--model-path"):
        if flag in tokens and tokens.index(flag) + 1 < len(tokens):
            return tokens[tokens.index(flag) + 1]
    return None


def _workers(obj: dict, version: str, backend: str) -> tuple[dict | None, dict[str, str], str | None]:
    """The pools' workers as our connector finds them, the service names it needs, or why not."""
    tries = [{"prefill": "prefill", "decode": "decode"}]
    if backend in LEGACY_WORKER_NAMES:
        prefill, decode = LEGACY_WORKER_NAMES[backend]
        tries.append({"prefill": prefill, "decode": decode})
    error = None
    for names in tries:
        try:
            return dgd.workers(obj, version, configured=names), names, None
        except dgd.DgdShapeError as exc:
            error = error or str(exc)
    return None, tries[0], error


def from_dgd(obj: dict, *, configmaps: Mapping[str, Mapping[str, str]] | None = None,
             namespace: str | None = None, profile_dir: str | None = None, source: str = "DGD") -> Migration:
    """Our run configuration from a DGD's planner settings.

    configmaps: ConfigMap name -> data, for a `--config` file mounted from one.
    namespace: the DGD's Kubernetes namespace when metadata has none.
    profile_dir: the profiler output on this machine (replaces profile_results_dir).
    """
    comp = planner_component(obj, source=source)
    s = planner_settings(comp, configmaps=configmaps or {}, source=source)
    meta = obj.get("metadata") or {}
    k8s_namespace = meta.get("namespace") or namespace
    out = Migration(config={})
    if s.config_file is not None:
        out.skip("--config", s.config_file, f"a file inside the planner's container ({_mounted_from(comp, s.config_file) or 'not mounted from anything in the DGD'}) "
                 "whose content is not in the input: every setting below is Dynamo's default; pass the ConfigMap too")
    backend = str(s.get("backend"))
    workers, names, worker_error = _workers(obj, comp.version, backend)
    planner: dict = {}
    metrics: dict = {}
    decision: dict = {}
    sizing: dict = {}
    predictor: dict = {}

    env_kind = s.get("environment")
    if env_kind == "virtual":
        planner["namespace"] = str(s.get("namespace"))
        connector: dict = {"kind": "virtual", "namespace": str(s.get("namespace"))}
    else:
        if env_kind != "kubernetes":
            out.skip(s.spelled("environment"), env_kind, "only kubernetes and virtual environments are mapped; "
                     "written as kubernetes")
        connector = {"kind": "kubernetes", "dgd_name": str(meta.get("name"))}
        if k8s_namespace:
            connector["namespace"] = planner["namespace"] = str(k8s_namespace)
        else:
            out.skip("metadata.namespace", None, "the DGD names no namespace: pass --namespace or set "
                     "connector.namespace")
        if worker_error is not None:
            out.skip("spec workers", None, f"{worker_error}: set connector.prefill_service / decode_service")
        elif names != {"prefill": "prefill", "decode": "decode"}:
            connector["prefill_service"], connector["decode_service"] = names["prefill"], names["decode"]
    if backend not in ("vllm", "mocker"):
        out.skip(s.spelled("backend"), backend, "the saturation guardrail's worker queries read vLLM series "
                 "(vllm:kv_cache_usage_perc, vllm:num_requests_waiting): set metrics.queries.kv_usage_frac / "
                 "queue_length for this backend")
    if s.get("mode") != "disagg":
        out.skip(s.spelled("mode"), s.get("mode"), "sla-planner plans disaggregated prefill and decode pools only")

    target = s.get("optimization_target")
    if target != "sla":
        out.skip(s.spelled("optimization_target"), target, "Dynamo scaled on queue/KV thresholds without SLA "
                 "targets; sla-planner sizes for planner.slo (Dynamo's defaults written): set your targets")
    elif not s.get("enable_throughput_scaling"):
        out.skip(s.spelled("enable_throughput_scaling"), False, "sla-planner always sizes from the forecast")
    if s.get("disable_throughput_scaling"):
        out.skip(s.spelled("disable_throughput_scaling"), True, "sla-planner always sizes from the forecast")

    planner["adjustment_interval_s"] = float(s.get("throughput_adjustment_interval_seconds"))
    planner["slo"] = {"ttft_ms": float(s.get("ttft_ms")), "itl_ms": float(s.get("itl_ms"))}

    model = s.get("model_name")
    if model is None and workers is not None:
        worker_comp = next((c for n, c, _ in _components(obj, comp.version) if n == workers["decode"].name), {})
        model = _model_from_args(_split(_main_container(worker_comp, comp.version).get("args"))
                                 + _split(_main_container(worker_comp, comp.version).get("command")))
    if model:
        planner["model_id"] = str(model)
        metrics["frontend_selector"] = f'model="{model}"'

    profile_path = str(s.get("profile_results_dir"))
    if profile_dir is not None:
        planner["profile"] = {"dir": profile_dir}
    elif profile_path.startswith("use-pre-swept-results:"):
        parts = profile_path.split(":")
        planner["profile"] = {"pre_swept_dir": "pre_swept_results", "gpu_type": parts[1] if len(parts) > 1 else None}
        if len(parts) > 4 and parts[4].isdigit():
            planner["profile"]["prefill_tp"] = planner["profile"]["decode_tp"] = int(parts[4])
        out.skip(s.spelled("profile_results_dir"), profile_path, "Dynamo's bundled pre-swept results: copy "
                 "its pre_swept_results folder here (planner.profile.pre_swept_dir) or pass --profile-dir")
    else:
        planner["profile"] = {"dir": profile_path}
        where = _mounted_from(comp, profile_path)
        out.skip(s.spelled("profile_results_dir"), profile_path, "a path inside the planner's container"
                 f" ({where or 'not mounted from anything in the DGD'}): copy the profiler output "
                 "(selected_prefill_interpolation/, selected_decode_interpolation/) here and pass --profile-dir")

    _map_predictor(s, predictor, out, comp)
    if s.get("no_correction"):
        planner["correction"] = {"enabled": False}

    gpus = {}
    for pool in ("prefill", "decode"):
        given = s.get(f"{pool}_engine_num_gpu")
        gpus[pool] = int(given) if given is not None else (workers[pool].gpus_per_replica if workers else 1)
        if gpus[pool] != 1:
            sizing[f"gpus_per_{pool}_engine"] = gpus[pool]
        if connector["kind"] == "virtual" and gpus[pool] != 1:
            connector[f"gpus_per_{pool}_replica"] = gpus[pool]
    budget = int(s.get("max_gpu_budget"))
    decision["max_gpu_budget"] = None if budget < 0 else budget
    for pool in ("prefill", "decode"):
        own = s.get(f"{pool}_min_endpoint")
        low = int(own if own is not None else s.get("min_endpoint"))
        high = max(low, 1, budget // gpus[pool]) if budget > 0 else 16
        decision[pool] = {"min_replicas": low, "max_replicas": high}
    if budget < 0:
        out.skip(s.spelled("max_gpu_budget"), budget, "no budget: Dynamo had no replica cap; max_replicas is our "
                 "default 16 per pool")
    if min(decision["prefill"]["min_replicas"], decision["decode"]["min_replicas"]) == 0:
        decision["allow_scale_to_zero"] = True
    if not s.legacy:
        decision["max_step_replicas"] = int(s.get("max_throughput_scaling_replicas"))

    _map_prometheus(s, metrics, out)
    port = int(s.get("metric_reporting_prometheus_port") or 0)
    planner_metrics = {"enabled": True, "port": port} if port > 0 else None

    _report_unmapped(s, out)
    planner["predictor"] = predictor
    planner["decision"] = decision
    if sizing:
        planner["sizing"] = sizing
    out.config = {"planner": planner, "metrics": metrics, "connector": connector}
    if planner_metrics:
        out.config["planner_metrics"] = planner_metrics
    return out


def _map_predictor(s: PlannerSettings, predictor: dict, out: Migration, comp: PlannerComponent) -> None:
    name = str(s.get("load_predictor"))
    predictor["name"] = name
    if s.get("load_predictor_log1p"):
        if name == "arima":
            predictor["log1p"] = True
        else:
            out.skip(s.spelled("load_predictor_log1p"), True, f"log1p applies to ARIMA only here, not {name}")
    if name == "prophet":
        predictor["history_intervals"] = int(s.get("prophet_window_size"))
    if name == "kalman":
        predictor["params"] = {"kalman": {"min_points": max(2, int(s.get("kalman_min_points")))}}
    trace = s.get("load_predictor_warmup_trace")
    if trace:
        predictor["warmup_trace_path"] = str(trace)
        where = _mounted_from(comp, str(trace))
        out.skip(s.spelled("load_predictor_warmup_trace"), trace, "a path inside the planner's container"
                 f" ({where or 'not mounted from anything in the DGD'}): copy the trace where the planner runs "
                 "and set planner.predictor.warmup_trace_path")


def _map_prometheus(s: PlannerSettings, metrics: dict, out: Migration) -> None:
    metrics["prometheus_url"] = str(s.get("metric_pulling_prometheus_endpoint"))
    if s.get("metric_pulling_prometheus_token_file"):
        metrics["bearer_token_file"] = str(s.get("metric_pulling_prometheus_token_file"))
    if "metric_pulling_prometheus_ssl_verify" in s.values:
        metrics["verify_tls"] = bool(s.get("metric_pulling_prometheus_ssl_verify"))
    timeout = float(s.get("metric_pulling_prometheus_request_timeout_seconds"))
    if timeout != 10.0:
        metrics["request_timeout_s"] = timeout


_MAPPED = {"environment", "namespace", "backend", "mode", "optimization_target", "enable_throughput_scaling",
           "disable_throughput_scaling", "throughput_adjustment_interval_seconds", "ttft_ms", "itl_ms",
           "max_gpu_budget", "min_endpoint", "prefill_min_endpoint", "decode_min_endpoint",
           "max_throughput_scaling_replicas", "prefill_engine_num_gpu", "decode_engine_num_gpu",
           "profile_results_dir", "load_predictor", "load_predictor_log1p", "prophet_window_size",
           "load_predictor_warmup_trace", "kalman_min_points", "metric_pulling_prometheus_endpoint",
           "metric_pulling_prometheus_token_file", "metric_pulling_prometheus_ssl_verify",
           "metric_pulling_prometheus_request_timeout_seconds", "metric_reporting_prometheus_port", "model_name",
           "no_correction", "config"}


def _report_unmapped(s: PlannerSettings, out: Migration) -> None:
    """Every setting without an equivalent whose value differs from Dynamo's default, with the table's reason."""
    for key, value in s.values.items():
        if key in _MAPPED:
            continue
        if key not in DYNAMO_FIELDS:
            out.skip(s.spelled(key), value, "not a Dynamo 1.6.1 planner setting or pre-1.0 flag: ignored")
            continue
        if key == "scheduling":
            plugins = (value or {}).get("external_plugins") or []
            if plugins or ((value or {}).get("gateway") or {}).get("enabled"):
                out.skip(s.spelled(key), {"external_plugins": plugins}, "plugin pipeline: no equivalent")
            continue
        if key == "plugin_registration":
            if ((value or {}).get("in_process_plugins") or []):
                out.skip(s.spelled(key), value["in_process_plugins"], "plugin registry: no equivalent")
            continue
        default = DYNAMO_DEFAULTS.get(key, LEGACY_ONLY_DEFAULTS.get(key))
        if value != default and not (value in (None, {}, []) and default is None):
            out.skip(s.spelled(key), value, DYNAMO_FIELDS[key][1])


# -- WVA ------------------------------------------------------------------------------------------

# WVA saturation entry fields (internal/interfaces/saturation_scaling.go) -> ours.
WVA_SATURATION_FIELDS = {
    "kvCacheThreshold": "kv_cache_threshold",
    "queueLengthThreshold": "queue_length_threshold",
    "kvSpareTrigger": "kv_spare_trigger",
    "queueSpareTrigger": "queue_spare_trigger",
}
WVA_FIELDS: dict[str, tuple[str, str]] = {
    "default": ("planner.saturation.default", "the entry's four thresholds"),
    "<entry> with model_id, namespace": ("planner.saturation.overrides['model_id#namespace']",
                                         "the entry's thresholds; an entry without both is reported"),
    **{k: (f"planner.saturation.<entry>.{v}", "as is") for k, v in WVA_SATURATION_FIELDS.items()},
    "enableLimiter": ("", "true: GPU limiter; planner.decision.max_gpu_budget is the nearest"),
    "analyzerName": ("", "saturation (V2 token-based analyzer): no equivalent, the V1 thresholds are mapped"),
    "scaleUpThreshold": ("", "V2 analyzer"),
    "scaleDownBoundary": ("", "V2 analyzer"),
    "PROMETHEUS_BASE_URL": ("metrics.prometheus_url", "as is"),
    "PROMETHEUS_TLS_INSECURE_SKIP_VERIFY": ("metrics.verify_tls", "negated"),
    "PROMETHEUS_TOKEN_PATH": ("metrics.bearer_token_file", "as is"),
    "GLOBAL_OPT_INTERVAL": ("planner.adjustment_interval_s", "a Go duration (60s, 1m) in seconds"),
}
_WVA_ENTRY_KEYS = set(WVA_SATURATION_FIELDS) | {"model_id", "namespace", "enableLimiter", "analyzerName",
                                                 "scaleUpThreshold", "scaleDownBoundary"}
_GO_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


def _seconds(text: str) -> float | None:
    match = _GO_DURATION.match(text.strip())
    if not match or not text.strip():
        return None
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return 3600 * h + 60 * m + s + ms / 1000


def configmap_data(obj: object, *, source: str) -> tuple[str, dict[str, str]]:
    """A ConfigMap's name and data; MigrationError for anything else."""
    if not isinstance(obj, dict) or obj.get("kind") != "ConfigMap":
        kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise MigrationError(f"{source}: not a ConfigMap (kind {kind!r})")
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        raise MigrationError(f"{source}: ConfigMap data must be a mapping")
    return str((obj.get("metadata") or {}).get("name")), {str(k): str(v) for k, v in data.items()}


def from_wva(configmaps: list[tuple[str, dict[str, str]]], *, source: str = "WVA") -> Migration:
    """Our saturation (and metrics) settings from WVA's ConfigMaps: (name, data) of each.

    A saturation entry's missing threshold reads as 0 in WVA (Go's zero value,
    which marks every replica saturated); ours takes the recommended value,
    which is reported. An entry our stricter checks refuse (a trigger at or
    above its threshold) is reported and left out, as WVA leaves out the
    entries it refuses.
    """
    out = Migration(config={})
    saturation: dict = {"overrides": {}}
    metrics: dict = {}
    planner: dict = {}
    found = False
    for cm_name, data in configmaps:
        for key, text in data.items():
            label = f"{cm_name}/{key}"
            if key == "config.yaml" or key.isupper():
                items = _yaml_mapping(text, label=label) if key == "config.yaml" else {key: text}
                for k, v in items.items():
                    _wva_controller(f"{cm_name}/{k}", k, v, metrics, planner, out)
                continue
            try:
                entry = _yaml_mapping(text, label=label)
            except MigrationError:
                entry = {}
            if not _WVA_ENTRY_KEYS & set(entry):
                out.skip(label, text[:60], "not a WVA saturation entry: ignored")
                continue
            found = True
            ours = {WVA_SATURATION_FIELDS[k]: entry[k] for k in WVA_SATURATION_FIELDS if k in entry}
            for k in WVA_SATURATION_FIELDS:
                if k not in entry:
                    out.skip(f"{label}.{k}", None, "absent: WVA reads 0 (every replica saturated); "
                             "sla-planner takes the recommended value")
            for k in ("enableLimiter", "analyzerName", "scaleUpThreshold", "scaleDownBoundary"):
                if entry.get(k) not in (None, False, ""):
                    out.skip(f"{label}.{k}", entry[k], WVA_FIELDS[k][1])
            for k in set(entry) - _WVA_ENTRY_KEYS:
                out.skip(f"{label}.{k}", entry[k], "not a WVA saturation field: ignored")
            try:
                SaturationThresholds.model_validate(ours)
            except ValidationError as exc:
                out.skip(label, ours, "refused: " + "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors()))
                continue
            if key == "default":
                saturation["default"] = ours
            elif entry.get("model_id") and entry.get("namespace"):
                saturation["overrides"][f"{entry['model_id']}#{entry['namespace']}"] = ours
            else:
                out.skip(label, {k: entry.get(k) for k in ("model_id", "namespace")},
                         "an override needs model_id and namespace (WVA ignores it too)")
    if not found and not metrics and not planner:
        raise MigrationError(f"{source}: no WVA saturation entry (kvCacheThreshold, ...) or controller setting "
                             "in the ConfigMap(s)")
    if found:
        planner["saturation"] = saturation
    out.config = {"planner": planner, "metrics": metrics}
    return out


def _yaml_mapping(text: str, *, label: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigrationError(f"{label}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MigrationError(f"{label}: expected a YAML mapping, got {type(data).__name__}")
    return data


def _wva_controller(label: str, key: str, value: object, metrics: dict, planner: dict, out: Migration) -> None:
    text = str(value).strip()
    if key == "PROMETHEUS_BASE_URL":
        metrics["prometheus_url"] = text
    elif key == "PROMETHEUS_TLS_INSECURE_SKIP_VERIFY":
        metrics["verify_tls"] = text.lower() not in ("true", "1", "yes")
    elif key == "PROMETHEUS_TOKEN_PATH":
        metrics["bearer_token_file"] = text
    elif key == "GLOBAL_OPT_INTERVAL":
        seconds = _seconds(text)
        if seconds is None or seconds <= 0:
            out.skip(label, value, "not a positive Go duration (60s, 1m): left out")
        else:
            planner["adjustment_interval_s"] = seconds
    else:
        out.skip(label, value, "WVA controller setting: no equivalent")


# -- merging and the documentation table -------------------------------------------------------


def merge(base: Mapping, over: Mapping) -> dict:
    """`over` on top of `base`, mappings merged key by key (lists and values replaced)."""
    result = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def mapping_table() -> str:
    """The Markdown table of every Dynamo setting and WVA field, as docs/dynamo.md shows it."""
    legacy = {}
    for flag, key in LEGACY_FLAGS.items():
        legacy.setdefault(key, []).append(f"`--{flag.replace('_', '-')}`")
    rows = ["| Dynamo 1.6.1 `--config` key (pre-1.0 flag) | sla-planner | how |", "|---|---|---|"]
    for key, (ours, how) in DYNAMO_FIELDS.items():
        flags = ", ".join(legacy.get(key, []))
        name = f"`{key}`" + (f" ({flags})" if flags else "")
        rows.append(f"| {name} | {f'`{ours}`' if ours else 'not mapped'} | {how} |")
    rows += ["", "| WVA ConfigMap key | sla-planner | how |", "|---|---|---|"]
    for key, (ours, how) in WVA_FIELDS.items():
        rows.append(f"| `{key}` | {f'`{ours}`' if ours else 'not mapped'} | {how} |")
    return "\n".join(rows) + "\n"
