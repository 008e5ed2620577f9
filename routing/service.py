"""The routing service's state and operations, independent of HTTP.

`RoutingService` owns the registry, the picker, the model store and the sample
store, and turns each operation into the calls on them plus Prometheus
metrics (in its own CollectorRegistry, so several services can live in one
process). The FastAPI app is a thin layer over it; tests and the simulator
can drive it directly. `now_s` comes from the injected clock (wall clock by
default), so samples carry Unix timestamps the retrain flow can order by.

Lifecycle calls made over HTTP name their `source` (the client address):
the samples they record must be plausible for the profile
(`latency_bounds_ms`) and within the source's share of the store, or they
are not stored (counted). In-process callers (source None: the simulator)
are trusted. `max_context_tokens` and the latency bounds are what the HTTP
layer's schemas allow. Requests in flight are bounded in number and age;
dropped ones are counted as lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from prometheus_client import CollectorRegistry

from routing.config import RouterConfig
from routing.features import ROLES, TTFT_FEATURES, feature_matrix, view_feature_matrix
from routing.fleet.requests import InFlight, Sample
from routing.models.store import ModelStore
from routing.picking.result import PickResult
from routing.picking.picker import Picker, RouteRequest, dispatch_record
from routing.models.online_calibration import online_calibration
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from routing.fleet.registry import Endpoint, EndpointRegistry
from routing.samples.store import SampleStore
from routing.service_metrics import ServiceMetrics
from routing.fleet.topology import read_domain_labels

log = logging.getLogger("sla_planner.routing")

_EXPIRE_EVERY_S = 5.0


class RoutingService:
    """Registry + picker + models + samples behind one lock-protected API."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        profile=None,
        clock: Callable[[], float] = time.time,
        metrics_registry: CollectorRegistry | None = None,
    ):
        """profile: planner.latency.profile.EngineProfile; None loads config.profile_dir.
        Static endpoints with labels_dir wait for their label files here and
        raise TopologyLabelError if the configured level's file never appears."""
        if profile is None:
            from connectors.profiles import load_profile_dir

            profile = load_profile_dir(config.profile_dir)
        self.config = config
        self.clock = clock
        self.profile_name = profile.name
        topo = config.picker.topology
        self.registry = EndpointRegistry(
            default_max_kv_tokens=profile.decode.max_kv_tokens,
            levels=topo.levels,
            metrics_max_age_s=config.metrics_max_age_s,
        )
        self.models = ModelStore(
            directory=config.models.dir,
            keep_versions=config.models.keep_versions,
            max_trees=config.models.max_trees,
            max_nodes=config.models.max_nodes,
        )
        self.predictor = LatencyPredictor(
            estimate=ProfileEstimator(profile, prefill_token_budget=config.prefill_token_budget), models=self.models,
            quantile=config.picker.slo.prediction, online=online_calibration(config.online_calibration),
        )
        self.picker = Picker(config.picker, self.predictor, rng=config.seed)
        self.samples = SampleStore(capacity=config.samples.capacity, kv_buckets=config.samples.kv_buckets,
                                   path=config.samples.path)
        self.metrics = ServiceMetrics(metrics_registry or CollectorRegistry(auto_describe=True))
        # Read when /metrics is scraped rather than set on every call.
        self.metrics.in_flight.set_function(self.registry.in_flight_count)
        self.metrics.samples_stored.set_function(lambda: len(self.samples))
        self.metrics.samples_evicted.set_function(lambda: self.samples.evicted_total)
        self._lock = threading.RLock()
        self._last_expiry_s = -np.inf
        self._last_capacity_log_s = -np.inf
        self._set_bounds(config, profile)
        # Sources of the last `capacity` samples offered by HTTP callers (None: refused), for per-source quotas.
        self._recent_sources: deque[str | None] = deque()
        self._source_counts: dict[str, int] = {}
        self._set_active_gauge()
        for spec in config.endpoints:
            domains = dict(spec.domains)
            if spec.labels_dir:
                domains = read_domain_labels(
                    spec.labels_dir, levels=topo.levels, required_level=topo.level,
                    wait_s=topo.labels_wait_s, poll_s=topo.labels_poll_s,
                )
            self.register(Endpoint(
                id=spec.id, role=spec.role, url=spec.url, domains=domains,
                max_kv_tokens=spec.max_kv_tokens, gpus=spec.gpus,
            ))

    # -- routing -----------------------------------------------------------

    def route(self, request: RouteRequest) -> PickResult:
        """Pick endpoints and, when routed, record the request on them.

        Raises the picker's errors (MissingSloError, NoEndpointError,
        TopologyError); a shed request returns with outcome "shed".
        """
        with self._lock:
            now_s = self.clock()
            self._maybe_expire(now_s)
            t0 = time.perf_counter()
            try:
                result = self.picker.pick(request, self.registry, now_s)
            except Exception:
                self.metrics.count_request("error", "-", "-")
                raise
            if result.routed:
                self._make_room(now_s)
                self.registry.dispatched(dispatch_record(request, result, now_s=now_s))
            self.metrics.pick_seconds.observe(time.perf_counter() - t0)
            self.metrics.count_request(result.outcome, result.mode, result.tier)
            if result.topology_fallback:
                self.metrics.topology_fallback.inc()
                log.warning("request %s: %s", request.request_id, result.reason)
            return result

    def predict(self, request: RouteRequest, endpoint_ids: list[str] | None = None) -> dict:
        """Predicted TTFT/TPOT (ms) per endpoint for a request, without routing it."""
        with self._lock:
            now_s = self.clock()
            eps = [self.registry.get(e) for e in endpoint_ids] if endpoint_ids else self.registry.endpoints()
            idx = np.array([self.registry.slot_of(e.id) for e in eps], dtype=np.int64)
            model = self.predictor.snapshot()
            if not idx.size:
                return {"model_version": model.version, "estimate": self.estimate_name, "predictions": []}
            v = self.registry.view(idx, now_s=now_s)
            hits = [
                (request.prefix_cache_hit_frac_by_endpoint or {}).get(e.id, request.prefix_cache_hit_frac) for e in eps
            ]
            x = view_feature_matrix("tpot", v, input_tokens=request.input_tokens, prefix_cache_hit_frac=np.array(hits))
            ttft = model.predict("ttft", np.ascontiguousarray(x[:, : len(TTFT_FEATURES)]))
            tpot = model.predict("tpot", x)
            return {
                "model_version": model.version,
                "estimate": self.estimate_name,
                "predictions": [
                    {
                        "endpoint_id": e.id,
                        "role": e.role,
                        "predicted_ttft_ms": float(ttft[k]) if e.role != "decode" else None,
                        "predicted_tpot_ms": float(tpot[k]) if e.role != "prefill" else None,
                    }
                    for k, e in enumerate(eps)
                ],
            }

    @property
    def estimate_name(self) -> str:
        return f"profile:{self.predictor.estimate.name}"

    # -- lifecycle -----------------------------------------------------------

    def dispatched(
        self,
        request: RouteRequest,
        *,
        prefill_id: str | None,
        decode_id: str | None,
    ) -> None:
        """Record a request routed elsewhere (features and predictions computed now).

        decode_id None with a prefill_id: the decode endpoint is picked when
        prefill returns (Dynamo's frontend does so) and given with prefill_done.
        """
        with self._lock:
            now_s = self.clock()
            self._maybe_expire(now_s)
            model = self.predictor.snapshot()
            feats = {}
            preds = {}
            for eid in (prefill_id, decode_id):
                if eid is not None:
                    feats[eid], preds[eid] = self._features_now(eid, request, model, now_s)
            ttft_eid = prefill_id if prefill_id is not None else decode_id
            hit = feats[ttft_eid]["prefix_cache_hit_frac"] if ttft_eid else 0.0
            if self.registry.in_flight(request.request_id) is None:
                self._make_room(now_s)  # a duplicate is refused by the registry without dropping anyone
            self.registry.dispatched(InFlight(
                request_id=request.request_id, prefill_id=prefill_id, decode_id=decode_id,
                input_tokens=request.input_tokens, uncached_tokens=request.input_tokens * (1.0 - hit),
                ttft_ms=request.ttft_ms if request.ttft_ms is not None else np.inf,
                itl_ms=request.itl_ms if request.itl_ms is not None else np.inf,
                critical=request.critical, dispatched_s=now_s,
                ttft_features=feats.get(ttft_eid), tpot_features=feats.get(decode_id),
                predicted_ttft_ms=preds[ttft_eid][0] if ttft_eid else None,
                predicted_tpot_ms=preds[decode_id][1] if decode_id else None,
                model_version=model.version,
            ))
            self.metrics.count_event("dispatched")

    def prefill_done(self, request_id: str, *, decode_id: str | None = None) -> None:
        """A disaggregated request's prefill returned; decode_id: the decode endpoint picked now.

        The request leaves its prefill endpoint's queue; its TPOT features and
        prediction are taken on decode_id now, as a decode pick after prefill
        (Dynamo's frontend) sees it.
        """
        with self._lock:
            now_s = self.clock()
            req = self.registry.in_flight(request_id)
            if req is None:
                self.registry.prefill_done(request_id, now_s=now_s)  # raises UnknownRequestError
            feats = pred = None
            if decode_id is not None:
                route = RouteRequest(request_id=request_id, input_tokens=req.input_tokens,
                                     prefix_cache_hit_frac=req.ttft_features["prefix_cache_hit_frac"]
                                     if req.ttft_features else 0.0)
                feats, preds = self._features_now(decode_id, route, self.predictor.snapshot(), now_s)
                pred = preds[1]
            self.registry.prefill_done(request_id, now_s=now_s, decode_id=decode_id, tpot_features=feats,
                                       predicted_tpot_ms=pred)
            self.metrics.count_event("prefill_done")

    def _features_now(self, eid: str, request: RouteRequest, model, now_s: float) -> tuple[dict, tuple[float, float]]:
        # An endpoint's raw features for this request now, and the model's TTFT and TPOT predictions on them.
        slot = self.registry.slot_of(eid)
        if slot is None:
            self.registry.get(eid)  # raises UnknownEndpointError
        hit = (request.prefix_cache_hit_frac_by_endpoint or {}).get(eid, request.prefix_cache_hit_frac)
        f = self.registry.raw_features(slot, input_tokens=request.input_tokens, prefix_cache_hit_frac=hit, now_s=now_s)
        x = feature_matrix("tpot", role=f["role"], **{k: f[k] for k in f if k != "role"})
        return f, (float(model.predict("ttft", np.ascontiguousarray(x[:, : len(TTFT_FEATURES)]))[0]),
                   float(model.predict("tpot", x)[0]))

    def first_token(self, request_id: str, *, observed_ttft_ms: float | None = None, source: str | None = None) -> int:
        with self._lock:
            samples = self.registry.first_token(request_id, now_s=self.clock(), observed_ttft_ms=observed_ttft_ms)
            return self._keep(samples, "first_token", source)

    def progress(self, request_id: str, *, tokens_generated: int, observed_tpot_ms: float | None = None,
                 source: str | None = None) -> int:
        with self._lock:
            samples = self.registry.progress(
                request_id, now_s=self.clock(), tokens_generated=tokens_generated, observed_tpot_ms=observed_tpot_ms
            )
            return self._keep(samples, "progress", source)

    def completed(
        self,
        request_id: str,
        *,
        output_tokens: int,
        observed_ttft_ms: float | None = None,
        observed_tpot_ms: float | None = None,
        source: str | None = None,
    ) -> int:
        with self._lock:
            samples = self.registry.completed(
                request_id, now_s=self.clock(), output_tokens=output_tokens,
                observed_ttft_ms=observed_ttft_ms, observed_tpot_ms=observed_tpot_ms,
            )
            return self._keep(samples, "completed", source)

    # -- endpoints -----------------------------------------------------------

    def register(self, endpoint: Endpoint) -> bool:
        with self._lock:
            new = self.registry.register(endpoint)
            self._count_endpoints()
            return new

    def deregister(self, endpoint_id: str, *, drain: bool = False) -> int:
        """Remove an endpoint: at once (its requests in flight detached; returns how many), or with drain when
        its last request in flight completes (not picked meanwhile; returns how many are still there)."""
        with self._lock:
            n = self.registry.drain(endpoint_id) if drain else self.registry.deregister(endpoint_id)
            self._count_endpoints()
            return n

    def observe_metrics(self, endpoint_id: str, **values: float) -> None:
        with self._lock:
            self.registry.observe_metrics(endpoint_id, now_s=self.clock(), **values)

    def endpoint_status(self) -> list[dict]:
        with self._lock:
            now_s = self.clock()
            return [
                {
                    "id": e.id, "role": e.role, "url": e.url, "domains": dict(e.domains),
                    "max_kv_tokens": e.max_kv_tokens, "gpus": e.gpus, "draining": self.registry.is_draining(e.id),
                    "load": self.registry.load_of(e.id, now_s=now_s),
                }
                for e in self.registry.endpoints()
            ]

    # -- models --------------------------------------------------------------

    def publish(self, document: dict) -> dict:
        try:
            base = document.get("base") if isinstance(document, dict) else None
            if base is not None and base != self.estimate_name:
                raise ValueError(f"base: the model is relative to {base!r}, this router's estimate is "
                                 f"{self.estimate_name!r}")
            model = self.models.publish(document, now_s=self.clock())
        except ValueError:
            self.metrics.publish.labels("rejected").inc()
            raise
        self.metrics.publish.labels("accepted").inc()
        self._set_active_gauge()
        log.info("model %s published and active", model.version)
        return {"version": model.version, "active": True}

    def rollback(self, *, to_version: str | None = None) -> dict:
        model = self.models.rollback(to_version=to_version)
        self._set_active_gauge()
        version = model.version if model else None
        log.info("model rollback: active is now %s", version or self.estimate_name)
        return {"active": version, "estimate": self.estimate_name}

    def model_list(self) -> dict:
        active = self.models.active
        return {
            "active": active.version if active else None,
            "estimate": self.estimate_name,
            "prediction": self.predictor.quantile,
            "online_calibration": self.predictor.online.state() if self.predictor.online else None,
            "versions": self.models.list(),
        }

    # -- samples -------------------------------------------------------------

    def offer_samples(self, samples: list[Sample], *, event: str) -> list[Sample]:
        """Keep samples observed outside this service's lifecycle calls (an llm-d EPP posts them), each checked
        for plausibility as an HTTP caller's are, with no per-source quota (the caller is the pod's own EPP).
        Returns the samples kept."""
        with self._lock:
            plausible = [s for s in samples if self._plausible(s)]
            self._keep(plausible, event)
            return plausible

    def discard_samples(self, endpoint_id: str) -> dict[str, int]:
        """Drop every stored sample recorded for `endpoint_id` (llm-d's /flush); counts per target."""
        with self._lock:
            return self.samples.discard(endpoint_id)

    def sample_page(self, *, after_seq: int, limit: int, target: str | None) -> dict:
        page = self.samples.page(after_seq=after_seq, limit=limit, target=target)
        return {
            "samples": page.samples,
            "next_after_seq": page.next_after_seq,
            "has_more": page.has_more,
            "stats": self.samples.stats(),
        }

    def health(self) -> dict:
        active = self.models.active
        return {
            "status": "ok",
            "endpoints": len(self.registry),
            "requests_in_flight": self.registry.in_flight_count(),
            "model_version": active.version if active else None,
            "estimate": self.estimate_name,
            "samples_stored": len(self.samples),
        }

    # -- bounds --------------------------------------------------------------

    def latency_bounds_ms(self, target: str) -> tuple[float, float]:
        """(floor, ceiling) of a plausible observed latency for target "ttft" or "tpot", ms."""
        return self._latency_bounds[target]

    def _set_bounds(self, config: RouterConfig, profile) -> None:
        limits, checks = config.limits, config.sample_validation
        # The model's context length, tokens: the most input (or output) tokens one request can have.
        self.max_context_tokens = int(limits.max_context_tokens or profile.decode.max_kv_tokens)
        fastest_step_ms = float(np.min(profile.decode.itl_ms))
        slowest_step_ms = float(np.max(profile.decode.itl_ms))
        # Prefill time grows at least linearly with the prompt: beyond the longest
        # profiled ISL, scale the TTFT measured there up to the context length.
        longest_isl = float(profile.prefill.isl_range_tokens[1])
        ttft_at_context_ms = profile.prefill.ttft_ms_at(longest_isl) * max(1.0, self.max_context_tokens / longest_isl)
        floor_ms = checks.min_latency_frac * fastest_step_ms
        # Rounded to µs: the bounds appear in the schemas and their 422 messages.
        self._latency_bounds = {
            "ttft": (round(floor_ms, 3), round(checks.max_latency_factor * ttft_at_context_ms, 3)),
            "tpot": (round(floor_ms, 3), round(checks.max_latency_factor * slowest_step_ms, 3)),
        }


    # -- internals -----------------------------------------------------------

    def _keep(self, samples: list[Sample], event: str, source: str | None = None) -> int:
        self.metrics.count_event(event)
        kept = 0
        for s in samples:
            if source is not None and not self._admit(s, source):
                continue
            self.samples.add(s)
            self.predictor.observe(s)
            kept += 1
            if s.predicted_ms and s.predicted_ms > 0:
                self.metrics.observe_ratio(s.target, s.observed_ms / s.predicted_ms)
        return kept

    def _admit(self, sample: Sample, source: str) -> bool:
        """Whether an HTTP caller's sample is plausible and within its source's share of the store."""
        if not self._plausible(sample):
            return False
        window = self.config.samples.capacity
        used = self._source_counts.get(source, 0)
        admitted = used < self.config.sample_validation.max_source_frac * window
        # Refused offers take a place in the window too, so a lone source's share recovers as it ages.
        self._recent_sources.append(source if admitted else None)
        if admitted:
            self._source_counts[source] = used + 1
        if len(self._recent_sources) > window:
            old = self._recent_sources.popleft()
            if old is not None:
                left = self._source_counts[old] - 1
                if left:
                    self._source_counts[old] = left
                else:
                    del self._source_counts[old]
        if not admitted:
            self.metrics.samples_refused.labels("quota").inc()
        return admitted

    def _plausible(self, sample: Sample) -> bool:
        lo, hi = self._latency_bounds[sample.target]
        if not lo <= sample.observed_ms <= hi:
            self.metrics.samples_refused.labels("implausible").inc()
            return False
        return True

    def _make_room(self, now_s: float) -> None:
        """At inflight_max_requests, drop the oldest request in flight (counted lost) for a new one."""
        while self.registry.in_flight_count() >= self.config.inflight_max_requests:
            oldest = self.registry.oldest_in_flight()
            self.registry.completed(oldest, now_s=now_s, output_tokens=0)
            self.metrics.lost.labels("capacity").inc()
            if now_s - self._last_capacity_log_s >= _EXPIRE_EVERY_S:  # one line per period, not per request
                self._last_capacity_log_s = now_s
                log.warning("dropping the oldest requests in flight (e.g. %s): %d are in flight "
                            "(inflight_max_requests)", oldest, self.config.inflight_max_requests)

    def _maybe_expire(self, now_s: float) -> None:
        if now_s - self._last_expiry_s < _EXPIRE_EVERY_S:
            return
        self._last_expiry_s = now_s
        expired = self.registry.expire(now_s=now_s, ttl_s=self.config.inflight_ttl_s)
        if expired:
            self.metrics.lost.labels("ttl").inc(len(expired))
            log.warning("dropped %d requests in flight longer than %g s", len(expired), self.config.inflight_ttl_s)

    def _count_endpoints(self) -> None:
        for role in ROLES:
            self.metrics.endpoints.labels(role).set(self.registry.candidates(role).size)

    def _set_active_gauge(self) -> None:
        self.metrics.active_model.clear()
        active = self.models.active
        self.metrics.active_model.labels(active.version if active else "profile").set(1)
