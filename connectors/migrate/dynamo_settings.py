"""A DGD's planner settings as Dynamo 1.6.1's planner reads them: pure functions, no I/O.

Dynamo 1.6.1's planner (`python3 -m dynamo.planner --config <JSON | file>`) takes
one PlannerConfig; its file is usually a ConfigMap mounted into the Planner
component. Before 1.0 it took flags (`python3 -m planner_sla --adjustment-interval=60
...`, often inside `/bin/sh -c`). Both are read here: flags become the 1.6.1
keys they turned into. Settings that are absent take Dynamo's defaults, so the
migrated planner starts from what Dynamo actually ran with. Environment variables
the 1.6.1 planner reads (PROMETHEUS_ENDPOINT, DYN_NAMESPACE, ...) count as settings.
A 1.x `--config` is checked by Dynamo 1.6.1's rules (migrate_dynamo_config); the
pre-1.0 flags by that planner's argparse (an unknown flag stops it), with its units
(--ttft/--itl in seconds) and its Prometheus default.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from connectors.kube import dgd
from connectors.migrate.result import MigrationError
from connectors.migrate.dynamo_config import (
    DYNAMO_ENV, ConfigRefused, DynamoPlannerConfig, effective_config, parse_config_text,
)

# Dynamo 1.6.1's PlannerConfig defaults, with the environment unset.
DYNAMO_DEFAULTS: dict[str, object] = DynamoPlannerConfig().model_dump()

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
    "load_prediction_window_size": "prophet_window_size",
    "prometheus_port": "metric_reporting_prometheus_port",
}
# Values the pre-1.0 planner could start with (its argparse choices; an unknown predictor failed its lookup).
LEGACY_CHOICES = {"environment": ("kubernetes", "virtual"), "backend": ("vllm", "sglang", "trtllm", "mocker"),
                  "load_predictor": ("constant", "arima", "prophet", "kalman")}
LEGACY_ONLY_DEFAULTS = {
    "disable_throughput_scaling": False, "no_correction": False, "loadbased_router_metrics_url": None,
    "loadbased_learning_window": 50, "loadbased_metric_samples": 10, "isl": 3000, "osl": 150,
}
_SWITCHES = {"no_operation", "load_predictor_log1p", "no_correction", "enable_throughput_scaling",
             "disable_throughput_scaling", "enable_loadbased_scaling", "advisory", "enable_load_scaling"}
_INTS = {"isl", "osl", "decode_engine_num_gpu", "prefill_engine_num_gpu", "prefill_min_endpoint", "decode_min_endpoint",
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
    return cmd + [t for a in rest for t in (shlex.split(a) if a.startswith("--") and " " in a.strip()
                                            and "=" not in a.split(" ", 1)[0] else [a])]


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


def _planner_args(comp: PlannerComponent) -> tuple[str | None, list[str]]:
    """The planner module (`dynamo.planner`, `planner_sla`) and the tokens after it; else None and every token."""
    tokens = list(comp.tokens)
    for i, token in enumerate(tokens):
        if token in CONFIG_MODULES or token in LEGACY_MODULES:
            return token, tokens[i + 1:]
        if token.endswith("planner_sla.py"):
            return "planner_sla", tokens[i + 1:]
    return None, tokens


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

    values: dict[str, object]  # the keys given (config, flags, environment), at their effective values
    given: dict[str, str]  # key -> how it was spelled ("--ttft", "config ttft_ms", "env PROMETHEUS_ENDPOINT")
    legacy: bool
    config_file: str | None = None  # --config path when its content was not found
    effective: dict[str, object] = field(default_factory=dict)  # 1.x: every key as Dynamo runs with it
    ignored: list[tuple[str, object, str]] = field(default_factory=list)  # (spelled, value, why) Dynamo ignores
    refused: list[ConfigRefused] = field(default_factory=list)  # lenient: what Dynamo refuses, dropped
    notes: list[str] = field(default_factory=list)  # how an older era's values were read

    def get(self, key: str) -> object:
        if key in self.values:
            return self.values[key]
        if key in self.effective:
            return self.effective[key]
        return DYNAMO_DEFAULTS.get(key, LEGACY_ONLY_DEFAULTS.get(key))

    def spelled(self, key: str) -> str:
        return self.given.get(key, f"{key} (Dynamo default)")


# Modules that start a planner: Dynamo 1.x's entry point, and the pre-1.0 SLA planner's.
CONFIG_MODULES = ("dynamo.planner", "dynamo.planner.__main__")
LEGACY_MODULES = ("planner_sla", "dynamo.planner.planner_sla")


def planner_settings(comp: PlannerComponent, *, configmaps: Mapping[str, Mapping[str, str]],
                     source: str, namespace: str | None = None, lenient: bool = False) -> PlannerSettings:
    """Parse the planner's `--config` (inline JSON, or a file from a mounted ConfigMap) or its pre-1.0 flags.

    namespace: the DGD's Kubernetes namespace (the pre-1.0 Prometheus default is built from it).
    Raises ConfigRefused for what the planner would not start with (with `lenient`: listed in `refused`).
    """
    module, args = _planner_args(comp)
    if module in CONFIG_MODULES or (module not in LEGACY_MODULES and any(_is_config_flag(a) for a in args)):
        return _config_settings(args, comp, configmaps, source=source, lenient=lenient)
    return _legacy_settings(args, comp, namespace=namespace, source=source, lenient=lenient)


def _is_config_flag(token: str) -> bool:
    """`--config`, `--config=...`, or an abbreviation argparse expands to it (`--conf`)."""
    name = token.partition("=")[0]
    return len(name) >= 3 and "--config".startswith(name)


def _refuse(problem: ConfigRefused, refused: list[ConfigRefused], lenient: bool) -> None:
    if not lenient:
        raise problem
    refused.append(problem)


def _config_settings(args: list[str], comp: PlannerComponent, configmaps: Mapping[str, Mapping[str, str]], *,
                     source: str, lenient: bool) -> PlannerSettings:
    """Dynamo 1.x: argparse with one option, `--config`, then PlannerConfig.from_config_arg."""
    refused: list[ConfigRefused] = []
    config_arg = None
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if _is_config_flag(token):
            if "=" in token:
                config_arg = token.partition("=")[2]
            elif i < len(args) and not args[i].startswith("-"):
                config_arg, i = args[i], i + 1
            else:
                _refuse(ConfigRefused("--config", None, "expected one argument"), refused, lenient)
            continue
        value = None
        if token.startswith("--") and "=" not in token and i < len(args) and not args[i].startswith("-"):
            value, i = args[i], i + 1
        _refuse(ConfigRefused(f"argument {token}", value, "unrecognized: Dynamo 1.6.1's planner takes only "
                              "--config"), refused, lenient)
    if config_arg is None:
        _refuse(ConfigRefused("--config", None, "Dynamo 1.6.1's planner requires --config"), refused, lenient)
        config_arg = "{}"
    data, config_file = _config_data(config_arg, comp, configmaps, refused=refused, lenient=lenient)
    eff = effective_config(data, comp.env, lenient=lenient)
    effective = eff.config.model_dump()
    values = {key: effective[key] for key in eff.given}
    return PlannerSettings(values=values, given=dict(eff.given), legacy=False, config_file=config_file,
                           effective=effective, ignored=eff.ignored, refused=refused + eff.refused)


def _config_data(arg: str, comp: PlannerComponent, configmaps: Mapping[str, Mapping[str, str]], *,
                 refused: list[ConfigRefused], lenient: bool) -> tuple[object, str | None]:
    """The `--config` value parsed as Dynamo reads it, and the path when the file's content is not in the input.

    A path inside a ConfigMap mounted into the planner is read from that ConfigMap when the
    input holds it (a key it lacks is no file, as in the container); anything else is inline JSON.
    """
    path = PurePosixPath(arg.strip())
    for mount, cm in comp.configmaps.items():
        if path.is_absolute() and path.is_relative_to(mount):
            if cm not in configmaps:
                return {}, arg
            content = configmaps[cm].get(str(path.relative_to(mount)))
            if content is not None:
                try:
                    return parse_config_text(content, file_name=path.name), None
                except ConfigRefused as problem:
                    _refuse(problem, refused, lenient)
                    return {}, None
    try:
        return parse_config_text(arg, file_name=None), None
    except ConfigRefused as problem:
        if not arg.strip().startswith(("{", "[")) and not any(path.is_relative_to(m) for m in comp.configmaps):
            return {}, arg  # a file in the image or an unlisted volume: its content is not in the input
        _refuse(problem, refused, lenient)
        return {}, None


def _legacy_settings(args: list[str], comp: PlannerComponent, *, namespace: str | None, source: str,
                     lenient: bool) -> PlannerSettings:
    """The pre-1.0 planner's flags (argparse: unknown flags refused), read as the 1.6.1 keys they became."""
    values: dict[str, object] = {}
    given: dict[str, str] = {}
    refused: list[ConfigRefused] = []
    notes: list[str] = []
    for env_name, (key, parse) in DYNAMO_ENV.items():
        if env_name in comp.env:
            try:
                values[key] = parse(comp.env[env_name])
                given[key] = f"env {env_name}"
            except ValueError as exc:
                _refuse(ConfigRefused(f"env {env_name}", comp.env[env_name], f"cannot be parsed: {exc}"), refused,
                        lenient)
    known = set(DYNAMO_DEFAULTS) | set(LEGACY_ONLY_DEFAULTS) | set(LEGACY_FLAGS)
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("--"):
            _refuse(ConfigRefused(f"argument {token}", token, "unrecognized by the pre-1.0 planner"),
                    refused, lenient)
            continue
        name, eq, value = token[2:].partition("=")
        flag = name.replace("-", "_")
        if not eq and flag not in _SWITCHES:
            if i < len(args) and not args[i].startswith("--"):
                value, i = args[i], i + 1
            else:
                _refuse(ConfigRefused(f"--{name}", None, "expected one argument"), refused, lenient)
                continue
        elif not eq:
            value = "true"
        if flag not in known:
            _refuse(ConfigRefused(f"--{name}", value, "not a flag of the pre-1.0 planner (nor a 1.6.1 setting): "
                                  "it would not start"), refused, lenient)
            continue
        key = LEGACY_FLAGS.get(flag, flag)
        try:
            values[key] = _coerce(key, value, spelled=f"--{name}")
        except MigrationError as exc:
            _refuse(ConfigRefused(f"--{name}", value, str(exc)), refused, lenient)
            continue
        if key in LEGACY_CHOICES and values[key] not in LEGACY_CHOICES[key]:
            _refuse(ConfigRefused(f"--{name}", value, f"the pre-1.0 planner knew {', '.join(LEGACY_CHOICES[key])}: "
                                  "it would not start"), refused, lenient)
            del values[key]
            continue
        given[key] = f"--{name}"
    slo = {key: values[key] for key in ("ttft_ms", "itl_ms") if isinstance(values.get(key), float)}
    if slo and all(0 < v < SECONDS_ERA_BELOW for v in slo.values()):
        for key, value in slo.items():
            values[key] = value * 1000.0
            notes.append(f"{given[key]}={value:g}: below {SECONDS_ERA_BELOW:g}, read as seconds (the pre-1.0 "
                         f"planner's unit then): {key} {values[key]:g}")
    if "namespace" not in values and "DYNAMO_NAMESPACE" in comp.env:
        values["namespace"], given["namespace"] = comp.env["DYNAMO_NAMESPACE"], "env DYNAMO_NAMESPACE"
    if "metric_pulling_prometheus_endpoint" not in values:
        url, note = legacy_prometheus_default(comp.env, namespace)
        values["metric_pulling_prometheus_endpoint"] = url
        given["metric_pulling_prometheus_endpoint"] = "the pre-1.0 planner's Prometheus default"
        notes.append(note)
    if "optimization_target" not in values:
        values["optimization_target"] = "sla"  # the pre-1.0 planner_sla sized for SLA targets
    return PlannerSettings(values=values, given=given, legacy=True, refused=refused, notes=notes)


# Early pre-1.0 planners took --ttft/--itl in seconds (defaults 0.5 and 0.05), later ones and 1.x in ms: when
# every one given is below this, the DGD is from the seconds era (no TTFT target is under 10 ms, none 10 s or more).
SECONDS_ERA_BELOW = 10.0


def legacy_prometheus_default(env: Mapping[str, str], k8s_namespace: str | None) -> tuple[str, str]:
    """The pre-1.0 planner's Prometheus URL, built from DYNAMO_NAMESPACE and PROMETHEUS_PORT, and a line saying so.

    It queried `http://<DYNAMO_NAMESPACE>-prometheus.<its namespace>.svc.cluster.local:<port>`
    (DYNAMO_NAMESPACE default vllm-disagg-planner, PROMETHEUS_PORT default 9090); in the
    namespace `default` it fell back to the bare `<DYNAMO_NAMESPACE>-prometheus`.
    """
    dyn_ns = env.get("DYNAMO_NAMESPACE", "vllm-disagg-planner")
    port = env.get("PROMETHEUS_PORT", "9090")
    ns = k8s_namespace or "default"
    url = f"http://{dyn_ns}-prometheus.{ns}.svc.cluster.local:{port}"
    if ns == "default":
        return url, (f"the pre-1.0 planner in namespace 'default' queried the bare host '{dyn_ns}-prometheus' "
                     f"(not a URL): written as {url}")
    return url, f"pre-1.0 Prometheus default (from DYNAMO_NAMESPACE and PROMETHEUS_PORT): {url}"
