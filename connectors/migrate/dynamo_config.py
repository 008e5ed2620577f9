"""Dynamo 1.6.1's planner configuration as its entry point checks it: pure functions, no I/O.

`python3 -m dynamo.planner --config X` (Dynamo 1.6.1) accepts only `--config`, reads X
as a file in its container (`.json` strictly as JSON, `.yaml`/`.yml` as YAML, anything
else JSON then YAML) or as inline JSON, and validates the mapping with its PlannerConfig:
unknown keys are ignored, the first alias present wins (`ttft_ms` over `ttft`, whatever
their order), values are coerced as pydantic's lax mode does ("5" is 5, 5.5 is not an
int), enums and bounds are enforced, and a few settings absent from the mapping come
from the container's environment, parsed Dynamo's way (PROMETHEUS_SSL_VERIFY is true
only for 1/true/yes). `effective_config` reproduces that; `tests/connectors/test_import_dynamo.py`
checks it against Dynamo's own parser on every test input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal
from urllib.parse import parse_qsl

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

PROMETHEUS_DEFAULT = "http://prometheus-kube-prometheus-prometheus.monitoring.svc.cluster.local:9090"

# Keys Dynamo 1.6.1 also reads under an older name; the first one present wins.
ALIASES = {
    "throughput_adjustment_interval_seconds": ("throughput_adjustment_interval_seconds",
                                               "throughput_adjustment_interval"),
    "load_adjustment_interval_seconds": ("load_adjustment_interval_seconds", "load_adjustment_interval"),
    "ttft_ms": ("ttft_ms", "ttft"),
    "itl_ms": ("itl_ms", "itl"),
}
_KEY_OF = {alias: key for key, names in ALIASES.items() for alias in names}


def _ssl_verify(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def _query_params(text: str) -> dict[str, str] | None:
    return dict(parse_qsl(text, strict_parsing=True)) or None


# Environment variables the 1.6.1 planner reads for a key absent from its config, and how it parses them.
DYNAMO_ENV: dict[str, tuple[str, Any]] = {
    "DYN_NAMESPACE": ("namespace", str),
    "PROMETHEUS_ENDPOINT": ("metric_pulling_prometheus_endpoint", str),
    "PROMETHEUS_TOKEN": ("metric_pulling_prometheus_token", str),
    "PROMETHEUS_TOKEN_FILE": ("metric_pulling_prometheus_token_file", str),
    "PROMETHEUS_SSL_VERIFY": ("metric_pulling_prometheus_ssl_verify", _ssl_verify),
    "PROMETHEUS_EXTRA_QUERY_PARAMS": ("metric_pulling_prometheus_extra_query_params", _query_params),
    "PROMETHEUS_CA_BUNDLE": ("metric_pulling_prometheus_ca_bundle", str),
    "DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS": ("metric_pulling_prometheus_request_timeout_seconds", float),
    "PLANNER_PROMETHEUS_PORT": ("metric_reporting_prometheus_port", int),
}


class ConfigRefused(ValueError):
    """Dynamo 1.6.1's planner would not start with this setting (`key` names it, `line` says why)."""

    def __init__(self, key: str, value: object, why: str):
        super().__init__(f"{key}: {why}" if value is None else f"{key}={value!r}: {why}")
        self.key, self.value, self.why = key, value, why


class _Scheduling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tick_max_duration_seconds: float = Field(30.0, gt=0)
    external_plugins: list[dict] = Field(default_factory=list)
    gateway: dict = Field(default_factory=dict)
    scale_interval_seconds: float = Field(5.0, gt=0)


class DynamoPlannerConfig(BaseModel):
    """The fields, types, aliases, allowed values and bounds of Dynamo 1.6.1's PlannerConfig.

    Unknown keys are ignored as Dynamo ignores them. Nested plugin, AIConfigurator and
    AISimulate settings are taken as mappings (none of them is mapped; their content is
    not checked here).
    """

    model_config = ConfigDict(extra="ignore")

    pre_deployment_sweeping_mode: Literal["none", "rapid", "thorough"] | None = "rapid"
    environment: Literal["kubernetes", "virtual", "global-planner"] = "kubernetes"
    namespace: str = "dynamo"
    backend: Literal["vllm", "sglang", "trtllm", "mocker"] = "vllm"
    mode: Literal["disagg", "prefill", "decode", "agg"] = "disagg"
    optimization_target: Literal["throughput", "latency", "load", "sla"] = "throughput"
    log_dir: str | None = None
    throughput_adjustment_interval_seconds: int = Field(
        180, validation_alias=AliasChoices(*ALIASES["throughput_adjustment_interval_seconds"]))
    max_throughput_scaling_replicas: int = Field(8, gt=0)
    max_gpu_budget: int = 8
    min_gpu_budget: int = -1
    min_endpoint: int = Field(1, ge=0)
    prefill_min_endpoint: int | None = Field(None, ge=1)
    decode_min_endpoint: int | None = Field(None, ge=1)
    control_api_port: int = Field(9086, ge=0, le=65535)
    decode_engine_num_gpu: int | None = None
    prefill_engine_num_gpu: int | None = None
    profile_results_dir: str = "profiling_results"
    aic_interpolation: dict | None = None
    ais_perf_model: dict | None = None
    ttft_ms: float = Field(500.0, validation_alias=AliasChoices(*ALIASES["ttft_ms"]))
    itl_ms: float = Field(50.0, validation_alias=AliasChoices(*ALIASES["itl_ms"]))
    load_predictor: Literal["constant", "arima", "prophet", "kalman"] = "arima"
    load_predictor_log1p: bool = False
    prophet_window_size: int = Field(50, gt=0)
    load_predictor_warmup_trace: str | None = None
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    kalman_min_points: int = 5
    metric_pulling_prometheus_endpoint: str = PROMETHEUS_DEFAULT
    metric_pulling_prometheus_token: str | None = None
    metric_pulling_prometheus_token_file: str | None = None
    metric_pulling_prometheus_ssl_verify: bool = False
    metric_pulling_prometheus_extra_query_params: dict[str, str] | None = None
    metric_pulling_prometheus_ca_bundle: str | None = None
    metric_pulling_prometheus_request_timeout_seconds: float = Field(10.0, gt=0)
    metric_reporting_prometheus_port: int = 0
    throughput_metrics_source: Literal["frontend", "router"] = "frontend"
    model_name: str | None = None
    global_planner_namespace: str | None = None
    enable_throughput_scaling: bool = True
    enable_load_scaling: bool = False
    load_adjustment_interval_seconds: int = Field(
        5, gt=0, validation_alias=AliasChoices(*ALIASES["load_adjustment_interval_seconds"]))
    max_num_fpm_samples: int = Field(64, gt=0)
    fpm_sample_bucket_size: int = Field(16, gt=0)
    load_scaling_down_sensitivity: int = Field(80, ge=0, le=100)
    prefill_scale_up_queue_tokens: int | None = Field(None, ge=0)
    prefill_scale_down_queue_tokens: int | None = Field(None, ge=0)
    decode_scale_up_kv_rate: float | None = Field(None, ge=0, le=100)
    decode_scale_down_kv_rate: float | None = Field(None, ge=0, le=100)
    load_min_observations: int = 5
    speculative_nextn: int = Field(0, ge=0)
    advisory: bool = False
    enable_power_awareness: bool = False
    total_gpu_power_limit: int | None = Field(None, ge=1)
    report_interval_hours: float | None = 24.0
    report_output_dir: str = "./planner_reports"
    report_filename: str | None = None
    report_write_gzip_log: bool = True
    live_dashboard_port: int = 8080
    scheduling: _Scheduling = Field(default_factory=_Scheduling)
    plugin_registration: dict = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _scale_interval(cls, data: object) -> object:
        """Dynamo's default pipeline cadence: the gcd of the load and (SLA) throughput intervals."""
        if not isinstance(data, dict):
            return data
        if "aic_perf_model" in data:
            raise ValueError("aic_perf_model is no longer supported; use ais_perf_model.roles")
        scheduling = data.get("scheduling")
        if scheduling is not None and (not isinstance(scheduling, dict) or "scale_interval_seconds" in scheduling):
            return data
        load = data.get("load_adjustment_interval_seconds", data.get("load_adjustment_interval", 5))
        throughput_on = data.get("enable_throughput_scaling", True)
        throughput_on = (throughput_on.lower() in ("1", "true", "yes", "on") if isinstance(throughput_on, str)
                         else bool(throughput_on)) and data.get("optimization_target", "throughput") == "sla"
        try:
            intervals = [float(load)]
            if throughput_on:
                intervals.append(float(data.get("throughput_adjustment_interval_seconds",
                                                data.get("throughput_adjustment_interval", 180))))
        except (TypeError, ValueError):
            return data
        millis = [round(v * 1000.0) for v in intervals]
        return {**data, "scheduling": {**(scheduling or {}), "scale_interval_seconds": math.gcd(*millis) / 1000.0}}


def _multiple_of(value: float, base: float) -> bool:
    return base > 0 and math.isclose(value / base, round(value / base), rel_tol=1e-9, abs_tol=1e-9)


def cross_field_problems(c: DynamoPlannerConfig) -> list[tuple[str, str]]:
    """(key, why) for each cross-field rule Dynamo 1.6.1 refuses to start with, in its order.

    Dynamo's "easy mode" (any target but sla turns load scaling on and throughput
    scaling off) is applied to `c` first, as Dynamo applies it.
    """
    problems = []
    if c.ttft_ms <= 0:
        problems.append(("ttft_ms", "must be > 0"))
    for mode, key in (("prefill", "decode_min_endpoint"), ("decode", "prefill_min_endpoint")):
        if c.mode == mode and getattr(c, key) is not None:
            problems.append((key, f"not supported when mode={mode!r}"))
    if c.mode == "agg":
        for key in ("prefill_min_endpoint", "decode_min_endpoint"):
            if getattr(c, key) is not None:
                problems.append((key, "not supported when mode='agg'; use min_endpoint"))
    hours = c.report_interval_hours
    if hours is not None and (not math.isfinite(hours) or hours <= 0):
        problems.append(("report_interval_hours", "must be a positive finite number or None"))
    if math.isqrt(c.fpm_sample_bucket_size) ** 2 != c.fpm_sample_bucket_size:
        problems.append(("fpm_sample_bucket_size", "must be a perfect square"))
    if c.enable_power_awareness:
        if c.total_gpu_power_limit is None:
            problems.append(("total_gpu_power_limit", "required when enable_power_awareness is true"))
        if c.environment != "kubernetes":
            problems.append(("enable_power_awareness", "requires environment 'kubernetes'"))
        if c.mode == "agg":
            problems.append(("enable_power_awareness", "not supported with mode='agg'"))
    if c.environment == "global-planner" and not c.global_planner_namespace:
        problems.append(("global_planner_namespace", "required when environment='global-planner'"))
    if c.optimization_target == "load":
        pairs = []
        if c.mode in ("disagg", "prefill"):
            pairs.append(("prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"))
        if c.mode in ("disagg", "decode", "agg"):
            pairs.append(("decode_scale_up_kv_rate", "decode_scale_down_kv_rate"))
        for up, down in pairs:
            if getattr(c, up) is None or getattr(c, down) is None:
                problems.append((up if getattr(c, up) is None else down, f"optimization_target 'load' requires "
                                 f"{up} and {down}"))
            elif getattr(c, up) <= getattr(c, down):
                problems.append((up, f"must be greater than {down}"))
    if c.optimization_target != "sla":
        c.enable_load_scaling, c.enable_throughput_scaling = True, False
    if not c.enable_throughput_scaling and not c.enable_load_scaling:
        problems.append(("enable_throughput_scaling", "at least one scaling mode must be enabled "
                         "(enable_throughput_scaling or enable_load_scaling)"))
    if c.ais_perf_model is not None:
        roles = {"disagg": ("prefill", "decode"), "prefill": ("prefill",), "decode": ("decode",),
                 "agg": ("aggregated",)}[c.mode]
        for role in roles:
            if role not in (c.ais_perf_model.get("roles") or {}):
                problems.append(("ais_perf_model", f"roles.{role} is required for mode={c.mode!r}"))
    intervals = [("load_adjustment_interval_seconds", float(c.load_adjustment_interval_seconds))]
    if c.enable_throughput_scaling:
        if c.throughput_adjustment_interval_seconds <= 0:
            problems.append(("throughput_adjustment_interval_seconds", "must be > 0 when throughput scaling is "
                             "enabled"))
        intervals.append(("throughput_adjustment_interval_seconds", float(c.throughput_adjustment_interval_seconds)))
    for key, interval in intervals:
        if not _multiple_of(interval, c.scheduling.scale_interval_seconds):
            problems.append(("scheduling", f"scale_interval_seconds {c.scheduling.scale_interval_seconds:g} does not "
                             f"evenly divide {key} ({interval:g})"))
    if (c.enable_load_scaling and c.enable_throughput_scaling
            and c.load_adjustment_interval_seconds >= c.throughput_adjustment_interval_seconds):
        problems.append(("load_adjustment_interval_seconds", "must be shorter than "
                         "throughput_adjustment_interval_seconds"))
    return problems


@dataclass
class Effective:
    """The configuration Dynamo 1.6.1 runs with, and where each key came from."""

    config: DynamoPlannerConfig
    given: dict[str, str]  # key -> how it was spelled ("config ttft_ms", "env PROMETHEUS_ENDPOINT")
    ignored: list[tuple[str, object, str]] = field(default_factory=list)  # (spelled, value, why)
    refused: list[ConfigRefused] = field(default_factory=list)  # only with lenient: each dropped setting


def parse_config_text(text: str, *, file_name: str | None) -> object:
    """A `--config` file's content as Dynamo 1.6.1 parses it (by suffix), or inline JSON (file_name None).

    Raises ConfigRefused naming `--config` when Dynamo could not parse it.
    """
    suffix = PurePosixPath(file_name).suffix.lower().lstrip(".") if file_name else ""
    what = f"--config file {file_name}" if file_name else "--config"
    try:
        if file_name is None or suffix == "json":
            return json.loads(text)
        if suffix in ("yaml", "yml"):
            return yaml.safe_load(text)
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        why = ("not valid JSON (Dynamo 1.6.1 parses a .json file strictly)" if file_name
               else "neither a file in the planner's container nor valid JSON")
        raise ConfigRefused(what, None if file_name else text[:60], f"{why}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigRefused(what, None if file_name else text[:60],
                            f"not valid YAML: {' '.join(str(exc).split())}") from None


def effective_config(data: object, env: Mapping[str, str], *, lenient: bool = False) -> Effective:
    """What Dynamo 1.6.1 runs with for a parsed `--config` mapping and the container's environment.

    Raises ConfigRefused for the first setting Dynamo refuses; with `lenient`, each
    refused setting is dropped (Dynamo's default or the environment's value is used)
    and listed in `refused` instead.
    """
    refused: list[ConfigRefused] = []
    if not isinstance(data, dict):
        problem = ConfigRefused("--config", data, f"must be a mapping, got {type(data).__name__}")
        if not lenient:
            raise problem
        refused.append(problem)
        data = {}
    data = {str(k): v for k, v in data.items()}
    given: dict[str, str] = {}
    ignored: list[tuple[str, object, str]] = []
    for alias, value in data.items():
        key = _KEY_OF.get(alias, alias)
        if key not in DynamoPlannerConfig.model_fields:
            ignored.append((f"config {alias}", value, "not a Dynamo 1.6.1 planner setting: Dynamo ignores it"))
            continue
        first = next(a for a in ALIASES.get(key, (key,)) if a in data)
        if alias == first:
            given[key] = f"config {alias}"
        else:
            ignored.append((f"config {alias}", value, f"Dynamo 1.6.1 takes {first} ({data[first]!r}) before {alias}"))
    for name, (key, parse) in DYNAMO_ENV.items():
        if name in env and key not in given:
            try:
                data[key] = parse(env[name])
            except ValueError as exc:
                problem = ConfigRefused(f"env {name}", env[name], f"Dynamo 1.6.1 cannot parse it: {exc}")
                if not lenient:
                    raise problem from None
                refused.append(problem)
                continue
            given[key] = f"env {name}"
    while True:
        try:
            config = DynamoPlannerConfig.model_validate(data)
            break
        except ValidationError as exc:
            err = exc.errors()[0]
            alias = str(err["loc"][0]) if err["loc"] else "--config"
            key = _KEY_OF.get(alias, alias)
            spelled = given.get(key, f"config {alias}")
            value = data.get(alias, err.get("input"))
            problem = ConfigRefused(spelled, value, f"Dynamo 1.6.1 refuses it: {err['msg']}")
            if not lenient or alias not in data:
                raise problem from None
            refused.append(problem)
            del data[alias]
            given.pop(key, None)
    for key, why in cross_field_problems(config):
        value = getattr(config, key, None)
        value = value.model_dump() if isinstance(value, BaseModel) else value
        problem = ConfigRefused(given.get(key, key), value, f"Dynamo 1.6.1 refuses it: {why}")
        if not lenient:
            raise problem
        refused.append(problem)
    return Effective(config=config, given=given, ignored=ignored, refused=refused)
