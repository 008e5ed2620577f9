"""The routing service's own Prometheus metrics (requests, picks, lifecycle calls, samples, models)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_PICK_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class ServiceMetrics:
    """The service's Prometheus metrics, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.requests = Counter(
            "router_requests", "Route calls by outcome (routed, shed, error) and mode",
            ["outcome", "mode", "tier"], registry=registry,
        )
        self.pick_seconds = Histogram(
            "router_pick_seconds", "Time to pick endpoints, s", buckets=_PICK_BUCKETS_S, registry=registry
        )
        self.topology_fallback = Counter(
            "router_topology_fallback", "Requests routed across domains under policy fallback", registry=registry
        )
        self.lifecycle = Counter(
            "router_lifecycle_events", "Request lifecycle calls by event", ["event"], registry=registry
        )
        self.lost = Counter(
            "router_requests_lost", "In-flight requests dropped without completion: ttl (older than inflight_ttl_s) "
            "or capacity (the oldest, when inflight_max_requests were in flight)", ["reason"], registry=registry,
        )
        self.samples_refused = Counter(
            "router_samples_refused", "Samples from HTTP callers not stored: implausible (latency outside the "
            "profile's bounds) or quota (the source's share of the store used up)", ["reason"], registry=registry,
        )
        self.publish = Counter(
            "router_model_publish", "Model publications by result (accepted, rejected)", ["result"], registry=registry
        )
        self.active_model = Gauge(
            "router_active_model", "1 for the active latency model version (profile = estimate)", ["version"],
            registry=registry,
        )
        self.prediction_ratio = Histogram(
            "router_observed_over_predicted", "Observed / predicted latency per sample", ["target"],
            buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0), registry=registry,
        )
        self.endpoints = Gauge("router_endpoints", "Registered endpoints by role", ["role"], registry=registry)
        self.in_flight = Gauge("router_requests_in_flight", "Requests dispatched and not completed", registry=registry)
        self.samples_stored = Gauge("router_samples_stored", "Training samples held", registry=registry)
        self.samples_evicted = Gauge(
            "router_samples_evicted", "Training samples evicted since start (store is bounded)", registry=registry
        )
        # labels() costs a lock and a dict build per call; the hot calls keep the children.
        self._request_children: dict[tuple[str, str, str], object] = {}
        self._lifecycle_children: dict[str, object] = {}
        self._ratio_children: dict[str, object] = {}

    def count_request(self, outcome: str, mode: str, tier: str) -> None:
        key = (outcome, mode, tier)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(*key)
        child.inc()

    def count_event(self, event: str) -> None:
        child = self._lifecycle_children.get(event)
        if child is None:
            child = self._lifecycle_children[event] = self.lifecycle.labels(event)
        child.inc()

    def observe_ratio(self, target: str, observed_over_predicted: float) -> None:
        child = self._ratio_children.get(target)
        if child is None:
            child = self._ratio_children[target] = self.prediction_ratio.labels(target)
        child.observe(observed_over_predicted)
