"""Typed routing-service configuration (configs/routing.yaml): one pydantic model per section.

Unknown keys are errors; units are in field names. `RouterConfig` is the whole
file; `PickerConfig` is what the in-process picker needs (the simulator builds
one directly). Tokens are never in this file: the admin token comes from the
environment variable named by `auth.token_env`, the data-plane token from the
one named by `auth.data_token_env`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from planner.strict import StrictModel
from routing.features import ROLES

NO_SHARED_DOMAIN = "none"


class SloRoutingConfig(StrictModel):
    """SLO-aware picking (llm-d's predicted-latency scheduling)."""

    enabled: bool = Field(
        True, description="pick on predicted headroom vs SLOs; requests must then carry an SLO"
    )
    strategy: Literal["least", "most", "max"] = Field(
        "max",
        description="among endpoints with headroom: max: the most headroom (ties at random); most: weighted random "
        "favouring the most (spread); least: weighted random favouring just enough (bin-packing, frees endpoints "
        "for scale-down but runs close to the SLO)",
    )
    headroom_margin_frac: float = Field(
        0.1, ge=0, lt=1,
        description="an endpoint counts as having headroom only when its prediction is within (1 - this) x SLO "
        "(absorbs latency-estimate error); endpoints inside the margin are still used before shedding",
    )
    exploration_frac: float = Field(
        0.01, ge=0, le=1, description="probability a non-critical request goes to a uniformly random candidate"
    )
    weight_floor: float = Field(
        0.05, gt=0, le=1, description="added to every normalised weight so no valid endpoint has zero chance"
    )
    ttft_weight_frac: float = Field(
        0.5, ge=0, le=1, description="share of TTFT in the blended relative headroom (the rest is TPOT)"
    )
    prediction: Literal["mean", "p90"] = Field(
        "p90", description="which published model predicts latency (p90 falls back to mean when absent)"
    )
    expected_output_tokens: int = Field(
        128, ge=1, description="SLO routing off: output tokens assumed when scoring decode latency"
    )


class LevelQos(StrictModel):
    """KV-transfer cost between a prefill and a decode endpoint that share a domain at one level."""

    latency_ms: float = Field(ge=0, description="fixed transfer setup latency, ms")
    bandwidth_gbyte_per_s: float = Field(gt=0, description="transfer bandwidth, GB/s (1e9 bytes/s)")
    weight: float = Field(1.0, ge=0, description="multiplies the transfer time in the cost")


class TopologyConfig(StrictModel):
    """Topology-aware decode selection (Dynamo's KV-transfer domains) and soft scoring."""

    levels: list[str] = Field(
        default_factory=lambda: ["zone", "rack", "host"],
        min_length=1,
        description="topology levels, broadest first (e.g. zone, rack, host)",
    )
    level: str | None = Field(
        None, description="KV-transfer domain level for the hard filter; unset: no filtering"
    )
    policy: Literal["fail", "fallback"] = Field(
        "fail", description="no same-domain decode: fail the request, or warn and use any decode endpoint"
    )
    labels_wait_s: float = Field(
        30.0, ge=0, description="how long to wait for the configured level's label file before failing"
    )
    labels_poll_s: float = Field(1.0, gt=0, description="retry period while waiting for label files")
    qos: dict[str, LevelQos] = Field(
        default_factory=dict,
        description=f"soft scoring: cost per narrowest shared level, plus {NO_SHARED_DOMAIN!r} for no shared domain; "
        "empty: no soft scoring",
    )
    kv_bytes_per_token: float = Field(
        0.0, ge=0, description="KV-cache bytes per prompt token moved prefill->decode (soft scoring)"
    )

    @model_validator(mode="after")
    def _check(self) -> "TopologyConfig":
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"topology.levels: duplicate level in {self.levels}")
        for name in self.levels:
            if name == NO_SHARED_DOMAIN or not name or "/" in name or name.startswith("."):
                raise ValueError(f"topology.levels: {name!r} is not a usable level name")
        if self.level is not None and self.level not in self.levels:
            raise ValueError(f"topology.level: {self.level!r} is not one of levels {self.levels}")
        if self.qos:
            expected = set(self.levels) | {NO_SHARED_DOMAIN}
            missing = sorted(expected - set(self.qos))
            extra = sorted(set(self.qos) - expected)
            if missing or extra:
                raise ValueError(
                    f"topology.qos: needs exactly the keys {sorted(expected)}; missing {missing}, unknown {extra}"
                )
        return self


class PickerConfig(StrictModel):
    """Everything the in-process picker needs."""

    slo: SloRoutingConfig = Field(default_factory=SloRoutingConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)


class EndpointConfig(StrictModel):
    """A statically configured endpoint (others register over HTTP)."""

    id: str = Field(min_length=1, max_length=253, description="unique endpoint id")
    role: Literal["prefill", "decode", "aggregated"] = Field(description=f"one of {ROLES}")
    url: str | None = Field(None, description="base URL of the engine (scraped for /metrics when enabled)")
    domains: dict[str, str] = Field(default_factory=dict, description="topology domain per level")
    labels_dir: str | None = Field(
        None, description="read domains from one file per level here (waits for topology.level's file)"
    )
    max_kv_tokens: int | None = Field(None, ge=1, description="KV-cache capacity, tokens; default: the profile's")
    gpus: int = Field(1, ge=1, description="GPUs the engine uses")


class SampleStoreConfig(StrictModel):
    capacity: int = Field(100_000, ge=1, description="samples kept in total")
    kv_buckets: int = Field(10, ge=1, le=100, description="KV-usage buckets per role and target for eviction")
    path: str | None = Field(
        None, min_length=1, description="SQLite file that keeps the samples across restarts (created if missing; "
        "an unreadable one is moved aside and the store starts empty); unset: memory only",
    )


class ModelStoreConfig(StrictModel):
    dir: str | None = Field(None, description="persist published models here (restored at start); unset: memory only")
    keep_versions: int = Field(10, ge=2, description="published versions retained for rollback")
    max_trees: int = Field(2_000, ge=1, description="most trees a published document may hold")
    max_nodes: int = Field(500_000, ge=1, description="most tree nodes a published document may hold")


class AuthConfig(StrictModel):
    token_env: str = Field(
        "SLA_ROUTER_TOKEN", min_length=1, description="environment variable holding the admin bearer token"
    )
    data_token_env: str = Field(
        "SLA_ROUTER_DATA_TOKEN", min_length=1,
        description="environment variable holding the data-plane bearer token (route, predict, lifecycle, pushed "
        "metrics, reads); unset or empty: the data plane is open (a warning at start). The admin token is "
        "accepted wherever the data token is",
    )
    open_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/metrics", "/openapi.json", "/docs", "/redoc"],
        description="paths served without a token even when a data token is set (exact paths)",
    )

    @model_validator(mode="after")
    def _check(self) -> "AuthConfig":
        for path in self.open_paths:
            if not path.startswith("/") or path.startswith(("/v1/route", "/v1/requests", "/v1/predict")):
                raise ValueError(f"auth.open_paths: {path!r} must be an absolute path outside the data plane's "
                                 "route, predict and lifecycle calls")
        return self


class LimitsConfig(StrictModel):
    max_body_bytes: int = Field(65_536, ge=1024, description="largest request body, bytes (model publish excepted)")
    max_model_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="largest model document, bytes")
    max_context_tokens: int | None = Field(
        131_072, ge=1,
        description="the served model's context length, tokens: input_tokens (and output tokens) above it are a "
        "422; null: the profile's KV capacity (max_kv_tokens), the most one engine can hold",
    )
    max_header_bytes: int = Field(
        16_384, ge=1024, le=1_048_576, description="largest request line plus headers, bytes (431 above it)"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=300, description="a request's line and headers must arrive within this, s (else 408, closed)"
    )
    body_timeout_s: float = Field(
        10.0, gt=0, le=300, description="a request's body must arrive within this after its headers, s (else 408, "
        "closed)"
    )
    keep_alive_s: int = Field(5, ge=1, le=300, description="an idle keep-alive connection is closed after this, s")
    max_connections: int | None = Field(
        2048, ge=1, description="open connections plus tasks above this get 503 (uvicorn's limit_concurrency)"
    )


class TokenBucketConfig(StrictModel):
    """A token bucket per source (client address): `rate_per_s` calls per second, bursts up to `burst`."""

    rate_per_s: float | None = Field(description="sustained calls per second per source; null: no limit")
    burst: float = Field(ge=1, description="calls a source may make at once after being idle")


class RateLimitConfig(StrictModel):
    """Per-source limits on lifecycle calls (each event of a batch counts) and pushed metrics; 429 with Retry-After."""

    lifecycle: TokenBucketConfig = Field(
        default_factory=lambda: TokenBucketConfig(rate_per_s=5000.0, burst=10_000.0),
        description="dispatched, first_token, progress, completed and events (per event)",
    )
    metrics: TokenBucketConfig = Field(
        default_factory=lambda: TokenBucketConfig(rate_per_s=200.0, burst=400.0),
        description="PUT /v1/endpoints/{id}/metrics",
    )
    max_sources: int = Field(
        10_000, ge=1, description="sources tracked at once; beyond it idle (full) buckets are forgotten first"
    )


class SampleValidationConfig(StrictModel):
    """Checks on samples recorded from calls over HTTP (in-process callers such as the simulator are trusted)."""

    min_latency_frac: float = Field(
        0.1, ge=0, le=1,
        description="TTFT and TPOT below this share of the profile's fastest decode step (ITL) are refused: even a "
        "fully cached prompt needs one forward pass",
    )
    max_latency_factor: float = Field(
        200.0, ge=1,
        description="TTFT above this many times the profile's TTFT at the context length, and TPOT above this many "
        "times its slowest ITL, are refused",
    )
    max_source_frac: float = Field(
        0.5, gt=0, le=1,
        description="one source (client address) may have recorded at most this share of the last `capacity` "
        "samples offered to the store; beyond it its samples are refused (counted)",
    )


class ScrapeConfig(StrictModel):
    interval_s: float | None = Field(
        None, gt=0, description="scrape each endpoint's url + /metrics this often; unset: no scraping"
    )
    timeout_s: float = Field(1.0, gt=0, description="per-scrape timeout, s")


class OnlineCalibrationConfig(StrictModel):
    """Online p90 calibration of the active published model (routing.models.online_calibration)."""

    enabled: bool = Field(
        True, description="re-calibrate the served p90 on recent outcomes so 90% of requests fall below it, per "
        "queue-depth x prompt-length cell (only when picker.slo.prediction is p90)"
    )
    window: int = Field(
        300, ge=10, le=100_000,
        description="recent outcomes per cell the p90's shift is calibrated on (rolling-window conformal): "
        "smaller follows drift faster and is noisier; 300 measured best on the retrain benchmark",
    )
    min_samples: int = Field(50, ge=1, description="outcomes a cell needs before its shift moves from 0")
    batch: int = Field(
        32, ge=1, le=10_000, description="outcomes scored against the model's p90 together (one prediction call)"
    )
    max_shift: float = Field(1.0, gt=0, le=5, description="largest shift either way, log (1.0: a factor e)")
    queue_edges: list[float] = Field(
        default_factory=lambda: [1.0, 4.0], description="cell edges on the endpoint's waiting requests"
    )
    prompt_edges: list[float] = Field(
        default_factory=lambda: [1024.0, 4096.0], description="cell edges on the prompt's tokens"
    )

    @model_validator(mode="after")
    def _check_edges(self) -> "OnlineCalibrationConfig":
        if self.min_samples > self.window:
            raise ValueError(f"online_calibration.min_samples ({self.min_samples}) must be <= window ({self.window})")
        for name in ("queue_edges", "prompt_edges"):
            edges = getattr(self, name)
            if edges != sorted(set(edges)) or any(not math.isfinite(e) or e < 0 for e in edges):
                raise ValueError(f"online_calibration.{name} must be increasing non-negative numbers, got {edges}")
        return self


class LlmdConfig(StrictModel):
    """llm-d's latency-predictor API (routing.llmd): the EPP's prediction and training routes on a listener of
    their own, so they never collide with ours."""

    listen: str | None = Field(
        None, description="HOST:PORT (or :PORT, meaning 127.0.0.1) of the llm-d listener; null: off. llm-d sends "
        "no token and this listener checks none: keep it on the pod's loopback, where the EPP's sidecars live",
    )

    @model_validator(mode="after")
    def _address(self) -> "LlmdConfig":
        if self.listen is not None:
            listen_address(self.listen)
        return self


def listen_address(value: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT or :PORT listener address (ValueError naming it otherwise)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"llm-d listener {value!r}: expected HOST:PORT or :PORT with a port 1-65535")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class RouterConfig(StrictModel):
    """The routing service's whole configuration."""

    profile_dir: str = Field(description="Dynamo profiler folder: the latency estimate when no model is published")
    prefill_token_budget: int | None = Field(
        8192, ge=1,
        description="the engines' prefill token budget per batch (vLLM max_num_batched_tokens): the estimate drains "
        "queued prompt work in batches of at most this many tokens; null: as one batch. Part of the estimate's "
        "name, so a relative model is only served by a router with the budget it was trained on",
    )
    picker: PickerConfig = Field(default_factory=PickerConfig)
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    metrics_max_age_s: float = Field(
        10.0, gt=0, description="scraped metrics older than this are ignored (lifecycle estimates used)"
    )
    inflight_ttl_s: float = Field(
        900.0, gt=0, description="a request with no completion after this long is dropped from the load (lost), s"
    )
    inflight_max_requests: int = Field(
        100_000, ge=1, description="requests tracked in flight at most; a new one beyond it drops the oldest (lost)"
    )
    samples: SampleStoreConfig = Field(default_factory=SampleStoreConfig)
    models: ModelStoreConfig = Field(default_factory=ModelStoreConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    rate_limits: RateLimitConfig = Field(default_factory=RateLimitConfig)
    sample_validation: SampleValidationConfig = Field(default_factory=SampleValidationConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    online_calibration: OnlineCalibrationConfig = Field(default_factory=OnlineCalibrationConfig)
    llmd: LlmdConfig = Field(default_factory=LlmdConfig)
    seed: int | None = Field(None, description="picker RNG seed; unset: fresh entropy")

    @model_validator(mode="after")
    def _unique_ids(self) -> "RouterConfig":
        seen: set[str] = set()
        for ep in self.endpoints:
            if ep.id in seen:
                raise ValueError(f"endpoints: duplicate id {ep.id!r}")
            seen.add(ep.id)
            if ep.domains and ep.labels_dir:
                raise ValueError(f"endpoints[{ep.id}]: set domains or labels_dir, not both")
        return self
