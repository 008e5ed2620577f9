"""The planner's own gauges in Prometheus format, for dashboards, HPA or KEDA.

Each planner run calls `PlannerMetrics.update` with what it saw and decided;
the gauges are served on `/metrics` (`serve`) and/or pushed to a Pushgateway
(`push`, for short-lived flow runs). The metrics live in their own
CollectorRegistry, never the process-global one, so several planners (or
tests) in one process don't collide.

Gauges (labels: namespace, model, and pool where it applies):

- sla_planner_desired_replicas, sla_planner_current_replicas, sla_planner_ready_replicas
- sla_planner_advisory_replicas: what an advisory (recommend-only, planner.mode advisory) run would set;
  such a run sets it instead of sla_planner_desired_replicas (which a KEDA ScaledObject may apply), so
  Grafana compares it with sla_planner_current_replicas, the replicas the running autoscaler set
- sla_planner_recommended_replicas (before stabilization, step limit and GPU budget)
- sla_planner_last_decision_id, sla_planner_last_decision_done (1/0)
- sla_planner_last_decision_applied (1 if the last run wrote targets)
- sla_planner_correction_factor (observed / expected latency)
- sla_planner_predicted_requests, sla_planner_predicted_requests_p90 (per interval),
  sla_planner_predicted_isl_tokens, sla_planner_predicted_osl_tokens
- sla_planner_observed_requests, sla_planner_observed_ttft_ms, sla_planner_observed_itl_ms,
  sla_planner_observation_stale (1/0)
- sla_planner_observed_ttft_target_met_ratio, sla_planner_observed_itl_target_met_ratio: the
  last interval's share of first tokens (token gaps) within the TTFT (ITL) target, read from
  the frontend's histograms as the decision table reads them (planner.signals.slo_attainment; NaN
  when not read); sla_planner_observed_{ttft,itl}_target_met_window_ratio: the same over the
  trailing SLO window (metrics.slo_window_s)
- sla_planner_last_run_timestamp_seconds, sla_planner_interval_seconds (the adjustment interval,
  to turn the per-interval counts into rates)
- sla_planner_inference_pool_desired_replicas (labels namespace, model, inference_pool_namespace,
  inference_pool, role): the desired replicas again, per llm-d InferencePool and role, when the
  run scales one; the gauge a KEDA ScaledObject per role applies (connectors.kube.keda)

`publish_run` is what a flow calls after each run: it pushes, and/or exposes
the run's gauges on a per-process endpoint (one HTTP server per address and
port, showing the newest run of each namespace/model published in this
process). That endpoint is the only process-level state here; it only shows
values, nothing reads it back to decide.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from threading import Thread
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Metric, generate_latest, push_to_gateway, start_http_server

from connectors.config import PlannerMetricsConfig
from connectors.kube.keda import GAUGE
from planner.config import SloTarget
from planner.signals.slo_attainment import share_within
from planner.types import POOLS, Corrections, Decision, DecisionRecord, FleetState, Forecast, Observation, is_number

if TYPE_CHECKING:
    from planner.pipeline import PlanResult

_BASE = ("namespace", "model")
_POOL = _BASE + ("pool",)
_INFERENCE_POOL = _BASE + ("inference_pool_namespace", "inference_pool", "role")


@dataclass
class MetricsServer:
    """A running /metrics endpoint; close() stops it."""

    port: int
    _server: object
    _thread: Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class PlannerMetrics:
    """The planner's gauges for one (namespace, model), in a private registry."""

    def __init__(self, *, namespace: str, model_id: str, registry: CollectorRegistry | None = None):
        self.namespace = namespace
        self.model_id = model_id
        self.registry = registry if registry is not None else CollectorRegistry()

        def gauge(name: str, doc: str, labels=_BASE) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        self.desired_replicas = gauge("sla_planner_desired_replicas", "replicas the last decision asked for", _POOL)
        self.advisory_replicas = gauge(
            "sla_planner_advisory_replicas", "replicas the last advisory run would set (nothing applies them)", _POOL)
        self.recommended_replicas = gauge(
            "sla_planner_recommended_replicas", "replicas the last run recommended before stabilization and limits",
            _POOL)
        self.current_replicas = gauge("sla_planner_current_replicas", "replicas the deployment has (spec)", _POOL)
        self.ready_replicas = gauge("sla_planner_ready_replicas", "replicas ready to serve", _POOL)
        self.last_decision_id = gauge("sla_planner_last_decision_id", "id of the last applied decision")
        self.last_decision_done = gauge("sla_planner_last_decision_done", "1 when the last decision's targets are reached")
        self.last_decision_applied = gauge("sla_planner_last_decision_applied", "1 if the last run wrote new targets")
        self.correction_factor = gauge("sla_planner_correction_factor", "observed / expected latency", _POOL)
        self.predicted_requests = gauge("sla_planner_predicted_requests", "forecast requests in the next interval")
        self.predicted_requests_p90 = gauge("sla_planner_predicted_requests_p90", "forecast p90 requests in the next interval")
        self.predicted_isl_tokens = gauge("sla_planner_predicted_isl_tokens", "forecast mean input length, tokens")
        self.predicted_osl_tokens = gauge("sla_planner_predicted_osl_tokens", "forecast mean output length, tokens")
        self.observed_requests = gauge("sla_planner_observed_requests", "requests in the last interval")
        self.observed_ttft_ms = gauge("sla_planner_observed_ttft_ms", "mean time to first token last interval, ms")
        self.observed_itl_ms = gauge("sla_planner_observed_itl_ms", "mean inter-token latency last interval, ms")
        self.observation_stale = gauge("sla_planner_observation_stale", "1 if the last observation was stale")
        self.ttft_target_met = gauge("sla_planner_observed_ttft_target_met_ratio",
                                     "share of the last interval's first tokens within the TTFT target, 0-1")
        self.itl_target_met = gauge("sla_planner_observed_itl_target_met_ratio",
                                    "share of the last interval's token gaps within the ITL target, 0-1")
        self.ttft_target_met_window = gauge("sla_planner_observed_ttft_target_met_window_ratio",
                                            "share of the SLO window's first tokens within the TTFT target, 0-1")
        self.itl_target_met_window = gauge("sla_planner_observed_itl_target_met_window_ratio",
                                           "share of the SLO window's token gaps within the ITL target, 0-1")
        self.last_run_timestamp_seconds = gauge("sla_planner_last_run_timestamp_seconds", "Unix time of the last run")
        self.inference_pool_desired_replicas = gauge(
            GAUGE, "replicas the last decision asked for, per llm-d InferencePool and role (KEDA applies it)",
            _INFERENCE_POOL)
        self.interval_seconds = gauge("sla_planner_interval_seconds", "adjustment interval the counts are over, s")

    def update(
        self,
        *,
        now_s: float,
        decision: Decision | None = None,
        applied: DecisionRecord | None = None,
        fleet: FleetState | None = None,
        forecast: Forecast | None = None,
        corrections: Corrections | None = None,
        observation: Observation | None = None,
        slo: SloTarget | None = None,
        inference_pool: tuple[str, str] | None = None,
        advisory: bool = False,
    ) -> None:
        """Set the gauges from one run's values; arguments left None keep their last value.

        now_s: the run's time, Unix seconds. applied: what `Connector.apply`
        returned (None when nothing was written). slo: the run's targets, for the
        target-met shares of the observation's latency histograms. inference_pool:
        (namespace, name) of the llm-d InferencePool the run scales, for its per-role gauge. advisory: the run
        recommends only: its targets go to sla_planner_advisory_replicas, the desired gauges keep what they had.
        """
        base = (self.namespace, self.model_id)
        self.last_run_timestamp_seconds.labels(*base).set(now_s)
        if decision is not None and advisory:
            self.advisory_replicas.labels(*base, "prefill").set(decision.prefill_replicas)
            self.advisory_replicas.labels(*base, "decode").set(decision.decode_replicas)
        if decision is not None and not advisory:
            self.desired_replicas.labels(*base, "prefill").set(decision.prefill_replicas)
            self.desired_replicas.labels(*base, "decode").set(decision.decode_replicas)
            if inference_pool is not None:
                for role, n in (("prefill", decision.prefill_replicas), ("decode", decision.decode_replicas)):
                    self.inference_pool_desired_replicas.labels(*base, *inference_pool, role).set(n)
        if decision is not None:
            for pool, rec, target in (("prefill", decision.recommended_prefill_replicas, decision.prefill_replicas),
                                      ("decode", decision.recommended_decode_replicas, decision.decode_replicas)):
                self.recommended_replicas.labels(*base, pool).set(target if rec is None else rec)
            self.last_decision_applied.labels(*base).set(1 if applied is not None else 0)
        if fleet is not None:
            for pool in POOLS:
                state = getattr(fleet, pool)
                self.current_replicas.labels(*base, pool).set(state.current_replicas)
                self.ready_replicas.labels(*base, pool).set(state.ready_replicas)
        record = applied or (fleet.last_decision if fleet is not None else None)
        if record is not None:
            self.last_decision_id.labels(*base).set(record.decision_id)
            self.last_decision_done.labels(*base).set(1 if record.done else 0)
        if corrections is not None:
            self.correction_factor.labels(*base, "prefill").set(corrections.prefill)
            self.correction_factor.labels(*base, "decode").set(corrections.decode)
        if forecast is not None:
            self.predicted_requests.labels(*base).set(forecast.num_requests)
            self.predicted_requests_p90.labels(*base).set(forecast.num_requests_p90)
            self.predicted_isl_tokens.labels(*base).set(forecast.avg_isl_tokens)
            self.predicted_osl_tokens.labels(*base).set(forecast.avg_osl_tokens)
        if observation is not None:
            # NaN says "no data" on a dashboard; a stale previous value would lie.
            for g, value in ((self.observed_requests, observation.num_requests),
                             (self.observed_ttft_ms, observation.avg_ttft_ms),
                             (self.observed_itl_ms, observation.avg_itl_ms)):
                g.labels(*base).set(value if is_number(value) else float("nan"))
            self.observation_stale.labels(*base).set(1 if observation.is_stale else 0)
            self.interval_seconds.labels(*base).set(observation.interval_s)
        if observation is not None and slo is not None:
            w = observation.slo_window
            for g, h, target_ms in ((self.ttft_target_met, observation.ttft_histogram, slo.ttft_ms),
                                    (self.itl_target_met, observation.itl_histogram, slo.itl_ms),
                                    (self.ttft_target_met_window, None if w is None else w.ttft, slo.ttft_ms),
                                    (self.itl_target_met_window, None if w is None else w.itl, slo.itl_ms)):
                met = None if h is None else share_within(h, target_ms / 1e3)
                g.labels(*base).set(float("nan") if met is None else met.share)

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)

    def serve(self, *, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Serve /metrics on addr:port in a background thread (port 0: any free port)."""
        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        return MetricsServer(port=server.server_address[1], _server=server, _thread=thread)

    def push(self, *, gateway_url: str, job: str = "sla-planner", timeout_s: float = 10.0) -> None:
        """Push the gauges to a Pushgateway, grouped by namespace and model (replaces that group)."""
        try:
            push_to_gateway(
                gateway_url, job=job, registry=self.registry, timeout=timeout_s,
                grouping_key={"namespace": self.namespace, "model": self.model_id},
            )
        except OSError as exc:
            raise ConnectionError(f"pushing planner metrics to Pushgateway {gateway_url} (job {job}): {exc}") from exc


def publish_run(
    cfg: PlannerMetricsConfig,
    *,
    result: "PlanResult",
    record: DecisionRecord | None,
    namespace: str,
    model_id: str = "default",
    now_s: float | None = None,
    slo: SloTarget | None = None,
    inference_pool: tuple[str, str] | None = None,
    advisory: bool = False,
) -> PlannerMetrics | None:
    """Publish one run's gauges as `cfg` says (serve on cfg.port and/or push).

    record: what the apply step returned (None: nothing written). slo: the run's
    targets (the target-met gauges stay unset without them). inference_pool:
    (namespace, name) of the llm-d InferencePool the run scales, if any. advisory: a recommend-only run
    (its targets on sla_planner_advisory_replicas, never on the desired gauges).
    now_s: the run's time, seconds; None uses the observation's taken_at_s.
    Returns the run's PlannerMetrics, or None when cfg.enabled is False.
    """
    if not cfg.enabled:
        return None
    metrics = PlannerMetrics(namespace=namespace, model_id=model_id)
    metrics.update(
        now_s=result.observation.taken_at_s if now_s is None else now_s,
        decision=result.decision,
        applied=record,
        fleet=result.fleet,
        forecast=result.forecast,
        corrections=result.corrections,
        observation=result.observation,
        slo=slo,
        inference_pool=inference_pool,
        advisory=advisory,
    )
    if cfg.port is not None:
        expose(metrics, port=cfg.port, addr=cfg.addr)
    if cfg.pushgateway_url:
        metrics.push(gateway_url=cfg.pushgateway_url, job=cfg.push_job)
    return metrics


class _NewestRuns:
    """A collector showing the newest PlannerMetrics per (namespace, model)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._newest: dict[tuple[str, str], CollectorRegistry] = {}

    def set(self, metrics: PlannerMetrics) -> None:
        with self._lock:
            self._newest[(metrics.namespace, metrics.model_id)] = metrics.registry

    def collect(self):
        with self._lock:
            registries = list(self._newest.values())
        merged: dict[str, Metric] = {}
        for registry in registries:
            for family in registry.collect():
                target = merged.get(family.name)
                if target is None:
                    target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                target.samples.extend(family.samples)
        yield from merged.values()


@dataclass
class _Endpoint:
    server: MetricsServer
    newest: _NewestRuns


_endpoints: dict[tuple[str, int], _Endpoint] = {}
_endpoints_lock = threading.Lock()


def expose(metrics: PlannerMetrics, *, port: int, addr: str = "0.0.0.0") -> int:
    """Show `metrics` on this process's /metrics endpoint at addr:port (started on first use).

    Replaces the previously exposed run of the same namespace/model. Returns the port.
    """
    if port == 0:
        raise ValueError("planner_metrics.port: give a fixed port (0 would open a new endpoint every run)")
    with _endpoints_lock:
        endpoint = _endpoints.get((addr, port))
        if endpoint is None:
            newest = _NewestRuns()
            registry = CollectorRegistry()
            registry.register(newest)
            try:
                server, thread = start_http_server(port, addr=addr, registry=registry)
            except OSError as exc:
                raise ConnectionError(f"planner metrics: cannot serve on {addr}:{port}: {exc}") from exc
            endpoint = _endpoints[(addr, port)] = _Endpoint(MetricsServer(port, server, thread), newest)
    endpoint.newest.set(metrics)
    return port


def stop_endpoints() -> None:
    """Stop every endpoint `expose` started in this process (tests, shutdown)."""
    with _endpoints_lock:
        endpoints = list(_endpoints.values())
        _endpoints.clear()
    for endpoint in endpoints:
        endpoint.server.close()
