"""Dynamo planner settings as our run configuration: pure functions, no I/O.

One table (`DYNAMO_FIELDS`) maps every Dynamo 1.6.1 planner key (and pre-1.0 flag)
to a field of ours or says why it has none; a setting without an equivalent is
reported only when it differs from Dynamo's default (a default changes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from connectors.kube import dgd
from connectors.migrate.dynamo_settings import (
    DYNAMO_DEFAULTS, LEGACY_ONLY_DEFAULTS, PlannerComponent, PlannerSettings, main_container, mounted_from,
    planner_component, planner_settings, split_args, spec_components,
)
from connectors.migrate.result import Migration, MigrationError
from connectors.migrate.dynamo_config import ConfigRefused
from connectors.migrate.dynamo_gpus import check_budgets, engine_gpus

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
    **{f"{pool}_engine_num_gpu": (f"planner.sizing.gpus_per_{pool}_engine", f"the {pool} worker's GPUs first, as "
                                  "Dynamo 1.6.1 reads them; this value when the worker has none (virtual: required)")
       for pool in ("prefill", "decode")},
    "profile_results_dir": ("planner.profile.dir", "a path inside the planner's container is reported; "
                                                   "`--profile-dir` gives the local copy"),
    "load_predictor": ("planner.predictor.name", "constant, arima, kalman, prophet: same names"),
    "load_predictor_log1p": ("planner.predictor.log1p", "ARIMA only here (reported for others)"),
    "prophet_window_size": ("planner.predictor.history_intervals", "with load_predictor prophet; pre-1.0 "
                            "`--load-prediction-window-size`: every predictor's window"),
    "load_predictor_warmup_trace": ("planner.predictor.warmup_trace_path", "same Mooncake JSONL; a path inside "
                                                                           "the container is reported"),
    "kalman_min_points": ("planner.predictor.params.kalman.min_points", "as is; below 2 written as 2 (a line "
                          "says so)"),
    **dict.fromkeys(("kalman_q_level", "kalman_q_trend", "kalman_r"),
                    ("", "our Kalman filter tunes its noise on the history")),
    "metric_pulling_prometheus_endpoint": ("metrics.prometheus_url", "also PROMETHEUS_ENDPOINT; pre-1.0: that "
                                           "era's default from DYNAMO_NAMESPACE and PROMETHEUS_PORT"),
    "metric_pulling_prometheus_token_file": ("metrics.bearer_token_file", "also PROMETHEUS_TOKEN_FILE"),
    "metric_pulling_prometheus_ssl_verify": ("metrics.verify_tls", "when set (PROMETHEUS_SSL_VERIFY: true only "
                                             "for 1/true/yes, as Dynamo reads it); unset: we verify (a line "
                                             "says so for https)"),
    "metric_pulling_prometheus_request_timeout_seconds": ("metrics.request_timeout_s", "as is"),
    "metric_pulling_prometheus_token": ("", "a token in the config: put it in a file, metrics.bearer_token_file"),
    "metric_pulling_prometheus_ca_bundle": ("", "verify against the system CA store or set it in the image"),
    "metric_pulling_prometheus_extra_query_params": ("", _NO_EQUIVALENT),
    "metric_reporting_prometheus_port": ("planner_metrics.port", "> 0: `enabled: true` and the port (pre-1.0 "
                                         "`--prometheus-port`)"),
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
    "no_correction": ("planner.correction.enabled: false", "pre-1.0 flag; in a 1.x --config Dynamo ignores it"),
    "isl": ("", "pre-1.0 dry run's input length"),
    "osl": ("", "pre-1.0 dry run's output length"),
    "loadbased_router_metrics_url": ("", "pre-1.0 load-based loop"),
    "loadbased_learning_window": ("", "pre-1.0 load-based loop"),
    "loadbased_metric_samples": ("", "pre-1.0 load-based loop"),
}

# Where the importer deliberately writes something other than what Dynamo runs with (each one is a stderr line
# when it applies; tests/connectors/test_import_dynamo.py allows a difference from Dynamo's own parser only for these).
DIFFERENCES: dict[str, str] = {
    "metric_pulling_prometheus_ssl_verify": "unset, Dynamo 1.6.1 does not verify Prometheus' TLS certificate; we do "
                                            "(metrics.verify_tls true), so an https Prometheus is not read "
                                            "unauthenticated by default (a note for an https URL)",
    "kalman_min_points": "below 2 it is written as 2: our Kalman filter needs two points to see a trend (a note)",
    "metric_pulling_prometheus_ca_bundle": "Dynamo 1.6.1 refuses a path that is not a file in its container; the "
                                           "importer cannot see the container, so it is not checked (a note)",
    "max_gpu_budget": "-1 (no budget): Dynamo has no replica cap; ours needs one per pool and writes 16 (reported)",
    "ttft_ms, itl_ms (pre-1.0)": "when every --ttft/--itl given is below 10, the DGD is from the seconds era: read "
                                 "as seconds (a note); Dynamo 1.6.1 would read milliseconds",
    "metric_pulling_prometheus_endpoint (pre-1.0)": "unset, that era's default (from DYNAMO_NAMESPACE, PROMETHEUS_PORT "
                                                    "and the namespace; a note), not 1.6.1's; in namespace default "
                                                    "that planner used a bare host name, written as a URL",
}


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
             namespace: str | None = None, profile_dir: str | None = None, source: str = "DGD",
             lenient: bool = False) -> Migration:
    """Our run configuration from a DGD's planner settings.

    configmaps: ConfigMap name -> data, for a `--config` file mounted from one.
    namespace: the DGD's Kubernetes namespace when metadata has none.
    profile_dir: the profiler output on this machine (replaces profile_results_dir).
    lenient: what Dynamo would refuse to start with is skipped (listed) instead of raising.
    Raises MigrationError naming the setting Dynamo would refuse to start with.
    """
    comp = planner_component(obj, source=source)
    k8s_namespace = (obj.get("metadata") or {}).get("namespace") or namespace
    try:
        s = planner_settings(comp, configmaps=configmaps or {}, source=source, namespace=k8s_namespace,
                             lenient=lenient)
    except ConfigRefused as exc:
        raise MigrationError(f"{source}: Planner {exc}") from None
    out = Migration(config={})
    for note in s.notes:
        out.note(note)
    for spelled, value, why in s.ignored:
        out.skip(spelled, value, why)
    for problem in s.refused:
        out.skip(problem.key, problem.value, f"{problem.why}; skipped (--lenient)")
    if s.config_file is not None:
        out.skip("--config", s.config_file, f"a file inside the planner's container ({mounted_from(comp, s.config_file) or 'not mounted from anything in the DGD'}) "
                 "whose content is not in the input: every setting below is Dynamo's default; pass the ConfigMap too")
    workers, names, worker_error = _workers(obj, comp.version, str(s.get("backend")))
    planner: dict = {}
    metrics: dict = {}
    connector = _map_connector(s, obj.get("metadata") or {}, namespace, planner, out, names=names,
                               worker_error=worker_error)
    _report_modes(s, out)

    planner["adjustment_interval_s"] = float(s.get("throughput_adjustment_interval_seconds"))
    planner["slo"] = {"ttft_ms": float(s.get("ttft_ms")), "itl_ms": float(s.get("itl_ms"))}

    model = s.get("model_name")
    if model is None and workers is not None:
        model = _worker_model(obj, comp.version, workers["decode"].name)
    if model:
        planner["model_id"] = str(model)
        metrics["frontend_selector"] = f'model="{model}"'

    _map_profile(s, comp, profile_dir, planner, out)
    predictor: dict = {}
    _map_predictor(s, predictor, out, comp)
    if s.legacy and s.get("no_correction"):
        planner["correction"] = {"enabled": False}

    sizing: dict = {}
    try:
        gpus = engine_gpus(s, obj, comp.version, workers, out, lenient=lenient)
        if not s.legacy:
            check_budgets(s, gpus, out, lenient=lenient)
    except ConfigRefused as exc:
        raise MigrationError(f"{source}: Planner {exc}") from None
    decision = _map_replicas(s, gpus, connector, sizing, out)

    _map_prometheus(s, metrics, out, comp.env)
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


def _map_connector(s: PlannerSettings, meta: dict, namespace: str | None, planner: dict, out: Migration, *,
                   names: dict[str, str], worker_error: str | None) -> dict:
    """Our connector for the planner's environment: virtual, else the DGD itself (kubernetes)."""
    k8s_namespace = meta.get("namespace") or namespace
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
    return connector


def _report_modes(s: PlannerSettings, out: Migration) -> None:
    """The backend, mode and scaling settings sla-planner plans differently from."""
    backend = str(s.get("backend"))
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


def _worker_model(obj: dict, version: str, worker_name: str) -> str | None:
    """The served model name from the named worker's command line."""
    worker_comp = next((c for n, c, _ in spec_components(obj, version) if n == worker_name), {})
    return _model_from_args(split_args(main_container(worker_comp, version).get("args"))
                            + split_args(main_container(worker_comp, version).get("command")))


def _map_profile(s: PlannerSettings, comp: PlannerComponent, profile_dir: str | None, planner: dict,
                 out: Migration) -> None:
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
        where = mounted_from(comp, profile_path)
        out.skip(s.spelled("profile_results_dir"), profile_path, "a path inside the planner's container"
                 f" ({where or 'not mounted from anything in the DGD'}): copy the profiler output "
                 "(selected_prefill_interpolation/, selected_decode_interpolation/) here and pass --profile-dir")


def _map_replicas(s: PlannerSettings, gpus: dict[str, int], connector: dict, sizing: dict, out: Migration) -> dict:
    """The decision's replica bounds and GPU budget; GPUs per engine into sizing (and a virtual connector)."""
    decision: dict = {}
    for pool in ("prefill", "decode"):
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
    return decision


def _map_predictor(s: PlannerSettings, predictor: dict, out: Migration, comp: PlannerComponent) -> None:
    name = str(s.get("load_predictor"))
    predictor["name"] = name
    if s.get("load_predictor_log1p"):
        if name == "arima":
            predictor["log1p"] = True
        else:
            out.skip(s.spelled("load_predictor_log1p"), True, f"log1p applies to ARIMA only here, not {name}")
    if name == "prophet" or s.spelled("prophet_window_size") == "--load-prediction-window-size":
        predictor["history_intervals"] = int(s.get("prophet_window_size"))
    if name == "kalman":
        points = int(s.get("kalman_min_points"))
        if points < 2:
            out.note(f"{s.spelled('kalman_min_points')}={points}: Dynamo 1.6.1 runs its Kalman filter from {points} "
                     "point(s); ours needs 2 to see a trend: written as 2")
        predictor["params"] = {"kalman": {"min_points": max(2, points)}}
    trace = s.get("load_predictor_warmup_trace")
    if trace:
        predictor["warmup_trace_path"] = str(trace)
        where = mounted_from(comp, str(trace))
        out.skip(s.spelled("load_predictor_warmup_trace"), trace, "a path inside the planner's container"
                 f" ({where or 'not mounted from anything in the DGD'}): copy the trace where the planner runs "
                 "and set planner.predictor.warmup_trace_path")


def _map_prometheus(s: PlannerSettings, metrics: dict, out: Migration, env: Mapping[str, str]) -> None:
    metrics["prometheus_url"] = str(s.get("metric_pulling_prometheus_endpoint"))
    if s.get("metric_pulling_prometheus_token_file"):
        metrics["bearer_token_file"] = str(s.get("metric_pulling_prometheus_token_file"))
    verify_given = s.spelled("metric_pulling_prometheus_ssl_verify")
    if "metric_pulling_prometheus_ssl_verify" in s.values:
        metrics["verify_tls"] = bool(s.get("metric_pulling_prometheus_ssl_verify"))
        raw = env.get("PROMETHEUS_SSL_VERIFY", "")
        if verify_given == "env PROMETHEUS_SSL_VERIFY" and raw.lower() not in ("1", "true", "yes", "0", "false", "no"):
            out.note(f"env PROMETHEUS_SSL_VERIFY={raw!r}: Dynamo 1.6.1 reads it as false (true only for 1/true/yes): "
                     "written verify_tls: false")
    elif str(metrics["prometheus_url"]).startswith("https:"):
        out.note("metric_pulling_prometheus_ssl_verify unset: Dynamo 1.6.1 does not verify Prometheus' certificate "
                 "by default; we do (verify_tls: true): set metrics.verify_tls: false to match")
    if s.get("metric_pulling_prometheus_ca_bundle"):
        out.note(f"{s.spelled('metric_pulling_prometheus_ca_bundle')}: Dynamo 1.6.1 checks that this path is a file "
                 "in its container; not checked here")
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
           "no_correction", "config", "metric_pulling_prometheus_ca_bundle"}


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

