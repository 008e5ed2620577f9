"""What the HTTP API accepts: the request body models, strict and bounded.

Strict: no silent coercion (false -> 0.0, "12" -> 12), integral floats still
pass as integers; unknown fields are refused. `bounded_bodies` rebuilds the
data plane's bodies with this service's bounds (context length, plausible
latencies) so a 422 names the field and the bound.
"""

from __future__ import annotations

import functools
import typing
import uuid
from typing import Annotated, Literal

from pydantic import AliasChoices, ConfigDict, Field, Strict, create_model, model_validator

from planner.strict import StrictModel
from routing.picking.picker import RouteRequest

# No "/": an id is one path segment (/v1/requests/{id}/...), and an encoded %2F
# is decoded before routing here and rewritten or refused by many proxies.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"
MAX_TOKENS = 10_000_000


# Integers accept integral floats (JSON 1.0 is the integer 1); booleans and
# strings are refused in _Body's check below, so they are never coerced.
Count = Annotated[int, Strict(False)]


def _is_int(annotation) -> bool:
    if annotation is int:
        return True
    return any(_is_int(a) for a in typing.get_args(annotation))


@functools.cache
def _int_fields(cls) -> tuple[str, ...]:
    """Names of a body model's integer fields (computed once per class: this runs per request)."""
    return tuple(name for name, info in cls.model_fields.items() if _is_int(info.annotation))


class _Body(StrictModel):
    # strict: no silent coercion (false -> 0.0, "12" -> 12); ints still pass as floats.
    model_config = ConfigDict(allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integers_are_integers(cls, data):
        if isinstance(data, dict):
            for name in _int_fields(cls):
                value = data.get(name)
                if isinstance(value, (bool, str)):
                    raise ValueError(f"{name}: Input should be an integer, got {value!r}")
        return data


class Slo(_Body):
    """At least one of the two; an absent one does not constrain the pick.

    `tpot_ms` is the deprecated spelling of `itl_ms`, accepted for one release.
    """

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})
    ttft_ms: float = Field(None, gt=0, le=3_600_000, description="time-to-first-token SLO, ms")
    itl_ms: float = Field(None, gt=0, le=3_600_000, validation_alias=AliasChoices("itl_ms", "tpot_ms"),
                          description="inter-token latency SLO, ms (deprecated spelling: tpot_ms)")

    @model_validator(mode="after")
    def _one(self) -> "Slo":
        if self.ttft_ms is None and self.itl_ms is None:
            raise ValueError("give ttft_ms and/or itl_ms")
        return self


class RouteBody(_Body):
    request_id: str | None = Field(
        None, pattern=ID_PATTERN, description="your id for lifecycle calls; generated when absent"
    )
    input_tokens: Count = Field(ge=0, le=MAX_TOKENS, description="prompt length, tokenizer tokens")
    slo: Slo | None = Field(None, description="required when SLO routing is on")
    critical: bool = Field(False, description="never shed: take the least negative headroom instead")
    prefix_cache_hit_frac: float = Field(0.0, ge=0, le=1, description="prompt share already cached, 0-1")
    prefix_cache_hit_frac_by_endpoint: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = Field(
        None, max_length=1000, description="per-endpoint cached share, 0-1 (overrides prefix_cache_hit_frac)"
    )
    expected_output_tokens: Annotated[Count, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description="output length hint, tokens (scoring with SLO routing off)"
    )

    def to_request(self) -> RouteRequest:
        per = self.prefix_cache_hit_frac_by_endpoint
        return RouteRequest(
            request_id=self.request_id or uuid.uuid4().hex,
            input_tokens=self.input_tokens,
            ttft_ms=self.slo.ttft_ms if self.slo else None,
            itl_ms=self.slo.itl_ms if self.slo else None,
            critical=self.critical,
            prefix_cache_hit_frac=self.prefix_cache_hit_frac,
            prefix_cache_hit_frac_by_endpoint=per,
            expected_output_tokens=self.expected_output_tokens,
        )


class SloRouteBody(RouteBody):
    """Route body when SLO routing is on: the SLO is required."""

    slo: Slo = Field(description="the request's SLOs (required: SLO routing is on)")


class PredictBody(_Body):
    input_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    prefix_cache_hit_frac: float = Field(0.0, ge=0, le=1)
    endpoint_ids: list[str] | None = Field(None, max_length=1000, description="default: all endpoints")


class DispatchedBody(_Body):
    # At least one endpoint, and said in the schema so a client generated from it knows.
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": [k], "properties": {k: {"type": "string"}}}
        for k in ("prefill_endpoint_id", "decode_endpoint_id")]})

    prefill_endpoint_id: str | None = Field(None, description="disaggregated: the prefill endpoint")
    decode_endpoint_id: str | None = Field(
        None, description="the decode (or aggregated) endpoint; none with a prefill endpoint: decode is picked when "
        "prefill returns and given with prefill_done (Dynamo's frontend does so)")
    input_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    prefix_cache_hit_frac: float = Field(0.0, ge=0, le=1)
    slo: Slo | None = None
    critical: bool = False


class PrefillDoneBody(_Body):
    decode_endpoint_id: str | None = Field(
        None, max_length=253, description="the decode endpoint picked now, if not given at dispatch")


class FirstTokenBody(_Body):
    observed_ttft_ms: float | None = Field(None, ge=0, le=3_600_000, description="measured TTFT; default: router clock")


class ProgressBody(_Body):
    tokens_generated: Count = Field(ge=0, le=MAX_TOKENS)
    observed_tpot_ms: float | None = Field(None, ge=0, le=3_600_000, description="TPOT measured around this point")


class CompletedBody(_Body):
    output_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    observed_ttft_ms: float | None = Field(None, ge=0, le=3_600_000)
    observed_tpot_ms: float | None = Field(None, ge=0, le=3_600_000, description="mean TPOT; default: router clock")


class _InBatch(_Body):
    request_id: str = Field(min_length=1, max_length=253)


class PrefillDoneEvent(PrefillDoneBody, _InBatch):
    event: Literal["prefill_done"]


class FirstTokenEvent(FirstTokenBody, _InBatch):
    event: Literal["first_token"]


class ProgressEvent(ProgressBody, _InBatch):
    event: Literal["progress"]


class CompletedEvent(CompletedBody, _InBatch):
    event: Literal["completed"]


class EventBatch(_Body):
    """Lifecycle events in one call, applied in order (a gateway batching its telemetry)."""

    events: list[Annotated[PrefillDoneEvent | FirstTokenEvent | ProgressEvent | CompletedEvent,
                           Field(discriminator="event")]] = Field(
        min_length=1, max_length=1000
    )


class EndpointBody(_Body):
    role: Literal["prefill", "decode", "aggregated"]
    url: str | None = Field(None, max_length=2048, pattern=r"^https?://\S+$")
    domains: dict[str, str] = Field(default_factory=dict, max_length=16, description="topology value per level")
    max_kv_tokens: Annotated[Count, Field(ge=1, le=1_000_000_000)] | None = Field(
        None, description="KV-cache capacity, tokens (default: the profile's)"
    )
    gpus: Count = Field(1, ge=1, le=1024)


class MetricsBody(_Body):
    kv_usage_frac: float = Field(ge=0, le=1, description="KV-cache usage, 0-1")
    waiting_requests: float = Field(ge=0, le=MAX_TOKENS)
    running_requests: float = Field(ge=0, le=MAX_TOKENS)


class RollbackBody(_Body):
    to_version: str | None = Field(None, max_length=64, description="default: the previously active version")


def bounded_bodies(*, max_tokens: int, ttft_ms: tuple[float, float], tpot_ms: tuple[float, float]) -> dict[str, type]:
    """The data plane's body models with this service's bounds in their schemas (so a 422 names field and bound).

    max_tokens: the model's context length, tokens (input, generated and output
    tokens each at most this). ttft_ms, tpot_ms: (floor, ceiling) of a
    plausible observed latency, ms.
    """
    def tokens(ge: int, description: str):
        return (Count, Field(ge=ge, le=max_tokens, description=f"{description} (at most the context length)"))

    def latency(bounds: tuple[float, float], description: str):
        return (float | None, Field(None, ge=bounds[0], le=bounds[1],
                                    description=f"{description}, ms (within the profile's plausible range)"))

    fields = {
        "input_tokens": tokens(0, "prompt length, tokenizer tokens"),
        "expected_output_tokens": (Annotated[Count, Field(ge=1, le=max_tokens)] | None, Field(
            None, description="output length hint, tokens (scoring with SLO routing off)")),
        "tokens_generated": tokens(0, "output tokens generated so far"),
        "output_tokens": tokens(0, "output tokens generated"),
        "observed_ttft_ms": latency(ttft_ms, "measured TTFT; default: router clock"),
        "observed_tpot_ms": latency(tpot_ms, "measured TPOT; default: router clock"),
    }

    def bounded(cls):
        own = {k: v for k, v in fields.items() if k in cls.model_fields}
        return create_model(cls.__name__, __base__=cls, __module__=__name__, __doc__=cls.__doc__, **own)

    out = {cls.__name__: bounded(cls) for cls in (
        RouteBody, SloRouteBody, PredictBody, DispatchedBody, PrefillDoneBody, FirstTokenBody, ProgressBody,
        CompletedBody, PrefillDoneEvent, FirstTokenEvent, ProgressEvent, CompletedEvent)}
    event = out["PrefillDoneEvent"] | out["FirstTokenEvent"] | out["ProgressEvent"] | out["CompletedEvent"]
    out["EventBatch"] = create_model(
        "EventBatch", __base__=EventBatch, __module__=__name__, __doc__=EventBatch.__doc__,
        events=(list[Annotated[event, Field(discriminator="event")]], Field(min_length=1, max_length=1000)))
    return out
