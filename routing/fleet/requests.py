"""The requests the registry tracks: a dispatched request in flight, and the training sample its completion yields."""

from __future__ import annotations

from dataclasses import dataclass

from routing.features import Role, Target


@dataclass
class InFlight:
    """A dispatched request the registry tracks until it completes."""

    request_id: str
    prefill_id: str | None  # None in aggregated mode
    decode_id: str | None  # the decode or aggregated endpoint
    input_tokens: int
    uncached_tokens: float
    ttft_ms: float  # the request's TTFT SLO, ms (inf: none)
    itl_ms: float  # the request's ITL SLO, ms (inf: none)
    critical: bool
    dispatched_s: float
    ttft_features: dict | None = None
    tpot_features: dict | None = None
    predicted_ttft_ms: float | None = None
    predicted_tpot_ms: float | None = None
    model_version: str | None = None
    first_token_s: float | None = None
    tokens_generated: int = 0
    prefill_released: bool = False  # its prefill endpoint's accounting is done (prefill done or first token)
    decode_wait_released: bool = False  # its decode endpoint no longer counts it as waiting (first token)
    aggregated: bool = False  # set at dispatch: one endpoint does prefill and decode
    ttft_endpoint_id: str | None = None  # set at dispatch: where the TTFT sample belongs


@dataclass(frozen=True)
class Sample:
    """One training sample: features at dispatch and the observed latency."""

    target: Target
    request_id: str
    endpoint_id: str
    role: Role
    features: dict  # RAW_FIELDS -> value
    observed_ms: float
    predicted_ms: float | None
    model_version: str | None
    recorded_at_s: float
