"""A DGD's planner settings as Dynamo 1.6.1's planner reads them: pure functions, no I/O.

Dynamo 1.6.1's planner (`python3 -m dynamo.planner --config <JSON | file>`) takes
one PlannerConfig; its file is usually a ConfigMap mounted into the Planner
component. Before 1.0 it took flags (`python3 -m planner_sla --adjustment-interval=60
...`, often inside `/bin/sh -c`). Both are read here: flags become the 1.6.1
keys they turned into. Settings that are absent take Dynamo's defaults, so the
migrated planner starts from what Dynamo actually ran with. Environment variables
the 1.6.1 planner reads (PROMETHEUS_ENDPOINT, DYN_NAMESPACE, ...) count as settings.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from connectors import dgd
from connectors.migrate import MigrationError

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


def spec_components(obj: dict, version: str) -> list[tuple[str, dict, str]]:
    """(name, spec, type) of every component."""
    spec = obj.get("spec") or {}
    if version == "v1beta1":
        return [(str(c.get("name")), c, str(c.get("type") or "")) for c in spec.get("components") or []
                if isinstance(c, dict)]
    return [(str(n), s, str(s.get("componentType") or "")) for n, s in (spec.get("services") or {}).items()
            if isinstance(s, dict)]


def main_container(comp: dict, version: str) -> dict:
    if version == "v1beta1":
        containers = ((comp.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        main = next((c for c in containers if c.get("name") == "main"), containers[0] if containers else None)
        if main is not None:
            return main
    return (comp.get("extraPodSpec") or {}).get("mainContainer") or {}


def split_args(values) -> list[str]:
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
    comps = spec_components(obj, version)
    found = [(n, c) for n, c, t in comps if t == "planner"] or [(n, c) for n, c, _ in comps if n == "Planner"]
    if not found:
        raise MigrationError(f"{source}: DynamoGraphDeployment {(obj.get('metadata') or {}).get('name')!r} has no "
                             f"planner component (components: {[n for n, _, _ in comps]})")
    name, comp = found[0]
    main = main_container(comp, version)
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


def mounted_from(comp: PlannerComponent, path: str) -> str | None:
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

