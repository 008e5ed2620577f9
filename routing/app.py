"""HTTP API of the routing service (FastAPI): a thin layer over RoutingService.

Data plane: route, predict, request lifecycle events, pushed engine metrics,
endpoint and model reads. With a data token (environment variable named by
`auth.data_token_env`) every call but `auth.open_paths` (health, /metrics,
the OpenAPI docs) needs it or the admin token, else 401; without one the data
plane is open (a warning at start). Lifecycle calls and pushed metrics are
rate-limited per client address (429 with Retry-After).
Admin (bearer token from the environment variable named in the config;
without it the admin API answers 403): register/remove endpoints, publish /
roll back models, read training samples.

Every error body is {"error": code, "message": text, "fields": [{field,
message}]}; a 422 names each offending field (e.g. "body.slo.ttft_ms").
Bodies above the configured size get 413 before they are read in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import re
import time
import typing
import uuid
from typing import Annotated, Any, Literal

import orjson
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, Strict, ValidationError, create_model, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from planner.strict import StrictModel
from routing.config import RouterConfig
from routing.model_store import UnknownVersionError, VersionExistsError
from routing.store_guard import StoreFullError
from routing.model_format import ModelDocument
from routing.picker import MissingSloError, NoEndpointError, PickResult, RouteRequest, TopologyError
from routing.registry import (
    DuplicateRequestError,
    Endpoint,
    RegistryError,
    UnknownEndpointError,
    UnknownRequestError,
)
from routing.samples import FEATURE_NAMES
from routing.ratelimit import TokenBuckets, retry_after_header
from routing.scrape import scrape_forever
from routing.service import RoutingService

log = logging.getLogger("sla_planner.routing.app")

# No "/": an id is one path segment (/v1/requests/{id}/...), and an encoded %2F
# is decoded before routing here and rewritten or refused by many proxies.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"
MAX_TOKENS = 10_000_000


# -- schemas ------------------------------------------------------------------


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


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable code")
    message: str
    fields: list[FieldError] = Field(default_factory=list)


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


class ChoiceOut(BaseModel):
    endpoint_id: str
    role: str
    url: str | None
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    headroom_ttft_ms: float | None
    headroom_tpot_ms: float | None
    transfer_cost_ms: float
    shared_level: str | None


class RouteOut(BaseModel):
    request_id: str
    outcome: Literal["routed"]
    mode: Literal["disaggregated", "aggregated"]
    prefill: ChoiceOut | None
    decode: ChoiceOut | None
    tier: str
    reason: str
    topology_fallback: bool
    model_version: str | None


class ShedOut(BaseModel):
    error: Literal["shed"]
    message: str
    request_id: str
    fields: list[FieldError] = Field(default_factory=list)


class PredictBody(_Body):
    input_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    prefix_cache_hit_frac: float = Field(0.0, ge=0, le=1)
    endpoint_ids: list[str] | None = Field(None, max_length=1000, description="default: all endpoints")


class PredictionOut(BaseModel):
    endpoint_id: str
    role: str
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None


class PredictOut(BaseModel):
    model_version: str | None
    estimate: str
    predictions: list[PredictionOut]


class DispatchedBody(_Body):
    prefill_endpoint_id: str | None = Field(None, description="disaggregated: the prefill endpoint")
    decode_endpoint_id: str = Field(description="the decode (or aggregated) endpoint")
    input_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    prefix_cache_hit_frac: float = Field(0.0, ge=0, le=1)
    slo: Slo | None = None
    critical: bool = False


class FirstTokenBody(_Body):
    observed_ttft_ms: float | None = Field(None, ge=0, le=3_600_000, description="measured TTFT; default: router clock")


class ProgressBody(_Body):
    tokens_generated: Count = Field(ge=0, le=MAX_TOKENS)
    observed_tpot_ms: float | None = Field(None, ge=0, le=3_600_000, description="TPOT measured around this point")


class CompletedBody(_Body):
    output_tokens: Count = Field(ge=0, le=MAX_TOKENS)
    observed_ttft_ms: float | None = Field(None, ge=0, le=3_600_000)
    observed_tpot_ms: float | None = Field(None, ge=0, le=3_600_000, description="mean TPOT; default: router clock")


class EventOut(BaseModel):
    request_id: str
    samples_recorded: int


class _InBatch(_Body):
    request_id: str = Field(min_length=1, max_length=253)


class FirstTokenEvent(FirstTokenBody, _InBatch):
    event: Literal["first_token"]


class ProgressEvent(ProgressBody, _InBatch):
    event: Literal["progress"]


class CompletedEvent(CompletedBody, _InBatch):
    event: Literal["completed"]


class EventBatch(_Body):
    """Lifecycle events in one call, applied in order (a gateway batching its telemetry)."""

    events: list[Annotated[FirstTokenEvent | ProgressEvent | CompletedEvent, Field(discriminator="event")]] = Field(
        min_length=1, max_length=1000
    )


class EventResult(BaseModel):
    request_id: str
    status: int = Field(description="what the single-event call would answer: 200, 404 or 422")
    samples_recorded: int
    error: str | None = None


class EventBatchOut(BaseModel):
    results: list[EventResult]


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
        RouteBody, SloRouteBody, PredictBody, DispatchedBody, FirstTokenBody, ProgressBody, CompletedBody,
        FirstTokenEvent, ProgressEvent, CompletedEvent)}
    event = out["FirstTokenEvent"] | out["ProgressEvent"] | out["CompletedEvent"]
    out["EventBatch"] = create_model(
        "EventBatch", __base__=EventBatch, __module__=__name__, __doc__=EventBatch.__doc__,
        events=(list[Annotated[event, Field(discriminator="event")]], Field(min_length=1, max_length=1000)))
    return out


class EndpointBody(_Body):
    role: Literal["prefill", "decode", "aggregated"]
    url: str | None = Field(None, max_length=2048, pattern=r"^https?://\S+$")
    domains: dict[str, str] = Field(default_factory=dict, max_length=16, description="topology value per level")
    max_kv_tokens: Annotated[Count, Field(ge=1, le=1_000_000_000)] | None = Field(
        None, description="KV-cache capacity, tokens (default: the profile's)"
    )
    gpus: Count = Field(1, ge=1, le=1024)


class EndpointOut(BaseModel):
    id: str
    role: str
    url: str | None
    domains: dict[str, str]
    max_kv_tokens: int | None
    gpus: int
    load: dict[str, Any]


class RegisteredOut(BaseModel):
    id: str
    created: bool


class RemovedOut(BaseModel):
    id: str
    detached_requests: int


class MetricsBody(_Body):
    kv_usage_frac: float = Field(ge=0, le=1, description="KV-cache usage, 0-1")
    waiting_requests: float = Field(ge=0, le=MAX_TOKENS)
    running_requests: float = Field(ge=0, le=MAX_TOKENS)


class OkOut(BaseModel):
    ok: bool = True


class PublishedOut(BaseModel):
    version: str
    active: bool


class RollbackBody(_Body):
    to_version: str | None = Field(None, max_length=64, description="default: the previously active version")


class RollbackOut(BaseModel):
    active: str | None = Field(description="active version; null: the profile estimate serves")
    estimate: str


class ModelVersionOut(BaseModel):
    version: str
    published_at_s: float
    created_at_s: float | None
    metrics: dict[str, float]
    active: bool


class ModelListOut(BaseModel):
    active: str | None
    estimate: str
    prediction: str
    versions: list[ModelVersionOut]


class SampleOut(BaseModel):
    seq: int
    target: Literal["ttft", "tpot"]
    request_id: str
    endpoint_id: str
    role: str
    features: dict[str, float]
    observed_ms: float
    predicted_ms: float | None
    model_version: str | None
    recorded_at_s: float


class SamplesOut(BaseModel):
    feature_names: dict[str, list[str]]
    samples: list[SampleOut]
    next_after_seq: int
    has_more: bool
    stats: dict[str, int]


class HealthOut(BaseModel):
    status: str
    endpoints: int
    requests_in_flight: int
    model_version: str | None
    estimate: str
    samples_stored: int


# -- errors -------------------------------------------------------------------


def _error(status: int, code: str, message: str, fields: list[dict] | None = None, headers=None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": code, "message": message, "fields": fields or []}, headers=headers
    )


def _responses(*codes: int) -> dict:
    return {c: {"model": ErrorBody} for c in codes}


# -- request guard: tokens, rate limits, unknown query parameters, body size and time ------


class RequestGuard:
    """ASGI middleware in front of every call: the data-plane token, per-source rate
    limits, 422 for unknown query parameters, 413 for bodies over the limit and
    408 for bodies that do not arrive in time.

    Done here rather than as FastAPI dependencies so the hot routes pay little
    for it and the fast path and FastAPI's routes answer alike.
    query_names: (path regex, names the route accepts) for every route.
    tokens: bearer tokens accepted on every path but `open_paths` (the data
    token and the admin token); empty: no check here (admin routes still check
    theirs). limits: {"lifecycle" | "metrics": TokenBuckets or None}.
    fast_path: (method, path, body, source) -> (status, content, headers) or
    None; answers the hot calls without entering FastAPI.
    """

    def __init__(self, app, *, max_body_bytes: int, max_model_bytes: int, query_names: list, fast_path=None,
                 tokens: tuple[bytes, ...] = (), open_paths=(), limits: dict | None = None,
                 body_timeout_s: float = 10.0, clock=time.monotonic):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_model_bytes = max_model_bytes
        self.query_names = query_names
        self.fast_path = fast_path
        self.tokens = tokens
        self.open_paths = frozenset(open_paths)
        self.limits = limits or {}
        self.body_timeout_s = body_timeout_s
        self.clock = clock

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        authorization = declared = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
        if self.tokens and path not in self.open_paths:
            problem = _bearer_problem(authorization, self.tokens)
            if problem:
                return await _send_json(send, 401, "unauthorized", problem, headers={"www-authenticate": "Bearer"})
        if scope.get("query_string"):
            problem = self._unknown_query(scope)
            if problem:
                field, message = problem
                return await _send_json(send, 422, "invalid_request", f"{field}: {message}",
                                        [{"field": field, "message": message}])
        limit = self.max_model_bytes if path == "/v1/models" else self.max_body_bytes
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return await _send_json(send, 400, "bad_request", "content-length is not a number")
            if size > limit:
                return await _send_json(send, 413, "body_too_large", f"body is {size} bytes, limit {limit}")
        # Read the body here (bounded in size and time) and replay it: an
        # over-limit stream is answered 413 before the app sees any of it, a
        # body trickled in slower than body_timeout_s is answered 408 and the
        # connection closed.
        chunks: list[bytes] = []
        seen = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # client went away
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > limit:
                        return await _send_json(send, 413, "body_too_large",
                                                f"body exceeds the limit of {limit} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return await _send_json(send, 408, "request_timeout",
                                    f"body not received within {self.body_timeout_s:g} s "
                                    f"(limits.body_timeout_s; {seen} bytes arrived)", headers={"connection": "close"})
        body = b"".join(chunks)
        source = _source(scope)
        kind = _limited_kind(scope["method"], path)
        bucket = self.limits.get(kind) if kind else None
        if bucket is not None:
            # Each event of a batch counts as a call ('"event"' appears once per event).
            cost = max(1, body.count(b'"event"')) if path == "/v1/requests/events" else 1
            wait_s = bucket.take(source, now_s=self.clock(), cost=cost)
            if wait_s > 0:
                return await _send_json(
                    send, 429, "rate_limited",
                    f"{kind} calls from {source}: over {bucket.rate_per_s:g}/s (burst {bucket.burst:g}); "
                    f"retry in {wait_s:.2f} s", headers={"retry-after": retry_after_header(wait_s)})
        if self.fast_path is not None:
            try:
                answer = self.fast_path(scope["method"], path, body, source)
            except Exception as exc:  # noqa: BLE001 - answered like any other error, then logged
                log.exception("%s %s failed", scope["method"], path)
                answer = _err(500, "internal_error", f"{type(exc).__name__}: {exc}")
            if answer is not None:
                status, content, headers = answer
                return await _send_json_content(send, status, content, headers)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _unknown_query(self, scope) -> tuple[str, str] | None:
        from urllib.parse import parse_qsl

        path = scope["path"]
        matched = [names for regex, names in self.query_names if regex.match(path)]
        if not matched:
            return None  # 404 follows
        allowed = set().union(*matched)
        given = [k for k, _ in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)]
        unknown = sorted(set(given) - allowed)
        if unknown:
            return f"query.{unknown[0]}", f"unknown query parameter (allowed: {sorted(allowed)})"
        return None


async def _send_json_content(send, status: int, content: dict, headers: dict | None) -> None:
    # orjson: a tenth of json.dumps' time on a route answer; numpy scalars pass
    # as numbers, and a non-finite float becomes null rather than invalid JSON.
    body = orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
    raw = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if headers:
        raw += [(k.lower().encode(), str(v).encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status: int, code: str, message: str, fields: list | None = None,
                     headers: dict | None = None) -> None:
    body = json.dumps({"error": code, "message": message, "fields": fields or []}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _bearer_problem(authorization: bytes | None, tokens: tuple[bytes, ...]) -> str | None:
    """Why an Authorization header value does not carry one of `tokens` (None: it does)."""
    scheme, _, credentials = (authorization or b"").partition(b" ")
    if scheme.lower() != b"bearer" or not credentials:
        return "bearer token required"
    # Every token is compared (constant time each), so timing does not tell which matched.
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(credentials.strip(), token)
    return None if matched else "bearer token is not valid"


def _source(scope) -> str:
    """The caller's identity for rate limits and sample quotas: its address."""
    client = scope.get("client")
    return client[0] if client else "-"


def _limited_kind(method: str, path: str) -> str | None:
    if method == "POST" and path.startswith("/v1/requests/"):
        return "lifecycle"
    if method == "PUT" and path.startswith("/v1/endpoints/") and path.endswith("/metrics"):
        return "metrics"
    return None


# -- app ------------------------------------------------------------------------


def create_app(config: RouterConfig, *, token: str | None, data_token: str | None = None,
               service: RoutingService | None = None, profile=None) -> FastAPI:
    """Build the app. token: the admin bearer token (None: admin API refused with 403).
    data_token: the data-plane bearer token (None: the data plane is open)."""
    svc = service or RoutingService(config, profile=profile)
    if not token:
        log.warning("no admin token (env %s): publishing, rollback, registration and samples are refused",
                    config.auth.token_env)
    if not data_token:
        log.warning("no data-plane token (env %s): route, lifecycle, pushed metrics and reads are open to anyone "
                    "who can reach this port", config.auth.data_token_env)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        task = None
        if config.scrape.interval_s:
            task = asyncio.create_task(
                scrape_forever(svc, interval_s=config.scrape.interval_s, timeout_s=config.scrape.timeout_s)
            )
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        svc.samples.close()  # a persisted sample store writes its last batch and lets the file go

    app = _RouterApp(
        title="sla-planner routing service",
        version="1",
        description="SLO-aware and topology-aware endpoint picking with a published latency predictor.",
        lifespan=lifespan,
    )
    app.state.service = svc
    bearer = HTTPBearer(auto_error=False, description=f"admin token from ${config.auth.token_env}")
    # The request guard checks the data token; this dependency only declares it in the OpenAPI document.
    data_bearer = HTTPBearer(auto_error=False, scheme_name="DataToken",
                             description=f"data-plane token from ${config.auth.data_token_env} (or the admin token)")

    async def data_auth(credentials: HTTPAuthorizationCredentials | None = Depends(data_bearer)) -> None:
        return None

    data = [Depends(data_auth)] if data_token else []

    async def admin(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not token:
            raise _Refused(403, "admin_disabled", f"admin API disabled: no token configured (set ${config.auth.token_env})")
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise _Refused(401, "unauthorized", "bearer token required")
        if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise _Refused(401, "unauthorized", "bearer token is not valid")

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        status, content, headers = _invalid(exc.errors(), prefix=())
        return JSONResponse(content, status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:
            # Starlette/FastAPI could not decode the body at all (not JSON/UTF-8).
            return _error(422, "invalid_request", "body: not valid JSON",
                          [{"field": "body", "message": "not valid JSON"}])
        if exc.status_code == 404 and b"%2f" in request.scope.get("raw_path", b"").lower():
            message = "path: holds an encoded '/' (%2F); request and endpoint ids cannot contain '/'"
            return _error(422, "invalid_request", message, [{"field": "path", "message": message}])
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(StoreFullError)
    async def _store_full(request: Request, exc: StoreFullError):
        return _error(507, "insufficient_storage", str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        # Starlette logs the exception itself; the client gets the usual error form.
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}")

    @app.exception_handler(_Refused)
    async def _refused(request: Request, exc: _Refused):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.code, exc.message, headers=headers)

    # -- data plane --------------------------------------------------------

    # The body schemas say what this service accepts: token counts within the
    # model's context length, latencies within the profile's plausible range.
    bodies = bounded_bodies(max_tokens=svc.max_context_tokens, ttft_ms=svc.latency_bounds_ms("ttft"),
                            tpot_ms=svc.latency_bounds_ms("tpot"))

    async def route(body: RouteBody):
        status, content, headers = route_response(svc, body)
        return JSONResponse(content, status_code=status, headers=headers)

    # With SLO routing on, an SLO is required.
    route.__annotations__["body"] = bodies["SloRouteBody" if config.picker.slo.enabled else "RouteBody"]
    app.post("/v1/route", response_model=RouteOut, responses={429: {"model": ShedOut}, **_responses(401, 409, 413, 422, 503)},
             tags=["routing"], summary="Pick endpoints for a request and record it", dependencies=data)(route)

    @app.post("/v1/predict", response_model=PredictOut, responses=_responses(401, 404, 413, 422), tags=["routing"],
              summary="Predicted TTFT/TPOT per endpoint, without routing", dependencies=data)
    @_typed_body(bodies["PredictBody"])
    async def predict(body: PredictBody):
        req = RouteRequest(request_id="predict", input_tokens=body.input_tokens,
                           prefix_cache_hit_frac=body.prefix_cache_hit_frac)
        try:
            return svc.predict(req, body.endpoint_ids)
        except UnknownEndpointError as exc:
            return _error(404, "unknown_endpoint", str(exc), [{"field": "body.endpoint_ids", "message": str(exc)}])

    @app.post("/v1/requests/{request_id}/dispatched", response_model=EventOut, status_code=201,
              responses=_responses(401, 404, 409, 413, 422, 429), tags=["lifecycle"],
              summary="Record a request routed by someone else", dependencies=data)
    @_typed_body(bodies["DispatchedBody"])
    async def dispatched(body: DispatchedBody, request_id: str = Path(pattern=ID_PATTERN)):
        req = RouteRequest(
            request_id=request_id, input_tokens=body.input_tokens,
            ttft_ms=body.slo.ttft_ms if body.slo else None, itl_ms=body.slo.itl_ms if body.slo else None,
            critical=body.critical, prefix_cache_hit_frac=body.prefix_cache_hit_frac,
        )
        try:
            svc.dispatched(req, prefill_id=body.prefill_endpoint_id, decode_id=body.decode_endpoint_id)
        except UnknownEndpointError as exc:
            return _error(404, "unknown_endpoint", str(exc))
        except DuplicateRequestError as exc:
            return _error(409, "duplicate_request", str(exc))
        except RegistryError as exc:
            return _error(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
        return JSONResponse(status_code=201, content={"request_id": request_id, "samples_recorded": 0})

    lifecycle = _responses(401, 404, 413, 422, 429)

    @app.post("/v1/requests/{request_id}/first_token", response_model=EventOut, responses=lifecycle,
              tags=["lifecycle"], summary="The request produced its first token", dependencies=data)
    @_typed_body(bodies["FirstTokenBody"])
    async def first_token(request: Request, body: FirstTokenBody, request_id: str = Path(max_length=253)):
        return _json(event_response(svc, request_id, "first_token", body, _source(request.scope)))

    @app.post("/v1/requests/{request_id}/progress", response_model=EventOut, responses=lifecycle,
              tags=["lifecycle"], summary="Tokens generated so far (and TPOT observed around now)", dependencies=data)
    @_typed_body(bodies["ProgressBody"])
    async def progress(request: Request, body: ProgressBody, request_id: str = Path(max_length=253)):
        return _json(event_response(svc, request_id, "progress", body, _source(request.scope)))

    @app.post("/v1/requests/events", response_model=EventBatchOut, responses=_responses(401, 413, 422, 429),
              tags=["lifecycle"], summary="Several lifecycle events in one call (per-event status in the answer)",
              dependencies=data)
    @_typed_body(bodies["EventBatch"])
    async def events(request: Request, body: EventBatch):
        return _json(batch_response(svc, body, _source(request.scope)))

    @app.post("/v1/requests/{request_id}/completed", response_model=EventOut, responses=lifecycle,
              tags=["lifecycle"], summary="The request finished", dependencies=data)
    @_typed_body(bodies["CompletedBody"])
    async def completed(request: Request, body: CompletedBody, request_id: str = Path(max_length=253)):
        return _json(event_response(svc, request_id, "completed", body, _source(request.scope)))

    @app.put("/v1/endpoints/{endpoint_id}/metrics", response_model=OkOut, responses=_responses(401, 404, 413, 422, 429),
             tags=["endpoints"], summary="Push an engine's scraped load metrics", dependencies=data)
    async def push_metrics(body: MetricsBody, endpoint_id: str = Path(max_length=253)):
        try:
            svc.observe_metrics(endpoint_id, kv_usage_frac=body.kv_usage_frac,
                                waiting_requests=body.waiting_requests, running_requests=body.running_requests)
        except UnknownEndpointError as exc:
            return _error(404, "unknown_endpoint", str(exc))
        return {"ok": True}

    @app.get("/v1/endpoints", response_model=list[EndpointOut], responses=_responses(401, 422), tags=["endpoints"],
             summary="Endpoints and their load", dependencies=data)
    async def list_endpoints():
        return svc.endpoint_status()

    @app.get("/healthz", response_model=HealthOut, responses=_responses(422), tags=["service"], summary="Liveness and a short status")
    async def healthz():
        return svc.health()

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **_responses(422)})
    async def metrics():
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- admin ---------------------------------------------------------------

    async def register(body: EndpointBody, endpoint_id: str = Path(pattern=ID_PATTERN)):
        try:
            created = svc.register(Endpoint(id=endpoint_id, role=body.role, url=body.url, domains=body.domains,
                                            max_kv_tokens=body.max_kv_tokens, gpus=body.gpus))
        except RegistryError as exc:
            return _error(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
        return {"id": endpoint_id, "created": created}

    # Domain keys must be configured levels: the schema lists them.
    levels = Literal[tuple(config.picker.topology.levels)]
    register.__annotations__["body"] = create_model(
        "EndpointBody", __base__=EndpointBody,
        domains=(dict[levels, Annotated[str, Field(min_length=1, max_length=253)]],
                 Field(default_factory=dict, description="topology value per configured level")),
    )
    app.put("/v1/endpoints/{endpoint_id}", response_model=RegisteredOut, responses=_responses(401, 403, 413, 422),
            tags=["endpoints"], summary="Register or update an endpoint", dependencies=[Depends(admin)])(register)

    @app.delete("/v1/endpoints/{endpoint_id}", response_model=RemovedOut, responses=_responses(401, 403, 404, 422),
                tags=["endpoints"], summary="Remove an endpoint", dependencies=[Depends(admin)])
    async def deregister(endpoint_id: str = Path(max_length=253)):
        try:
            n = svc.deregister(endpoint_id)
        except UnknownEndpointError as exc:
            return _error(404, "unknown_endpoint", str(exc))
        return {"id": endpoint_id, "detached_requests": n}

    @app.post("/v1/models", response_model=PublishedOut, status_code=201,
              responses=_responses(401, 403, 409, 413, 422, 507),
              tags=["models"], summary="Publish a latency model (safe JSON format) and make it active",
              dependencies=[Depends(admin)])
    def publish(document: ModelDocument):
        # Sync handler: validation and compilation of a large document run in
        # the thread pool, not on the event loop serving routes.
        try:
            out = svc.publish(document.model_dump(mode="json"))
        except VersionExistsError as exc:
            return _error(409, "version_exists", str(exc), [{"field": "body.version", "message": str(exc)}])
        except ValueError as exc:
            field = str(exc).split(":", 1)[0]
            return _error(422, "invalid_model", str(exc), [{"field": f"body.{field}", "message": str(exc)}])
        return JSONResponse(status_code=201, content=out)

    @app.get("/v1/models", response_model=ModelListOut, responses=_responses(401, 422), tags=["models"],
             summary="Published versions and the active one", dependencies=data)
    async def list_models():
        return svc.model_list()

    @app.get("/v1/models/{version}", response_model=ModelDocument, responses=_responses(401, 404, 422), tags=["models"],
             summary="A retained model document", dependencies=data)
    async def get_model(version: str = Path(max_length=64)):
        try:
            return JSONResponse(svc.models.get(version).document)
        except UnknownVersionError as exc:
            return _error(404, "unknown_version", str(exc))

    @app.post("/v1/models/rollback", response_model=RollbackOut,
              responses=_responses(401, 403, 404, 409, 413, 422, 507),
              tags=["models"], summary="Reactivate the previous (or a named) model version",
              dependencies=[Depends(admin)])
    async def rollback(body: RollbackBody):
        try:
            return svc.rollback(to_version=body.to_version)
        except UnknownVersionError as exc:
            return _error(404, "unknown_version", str(exc), [{"field": "body.to_version", "message": str(exc)}])
        except ValueError as exc:
            return _error(409, "nothing_to_roll_back", str(exc))

    @app.get("/v1/samples", response_model=SamplesOut, responses=_responses(401, 403, 422), tags=["samples"],
             summary="Training samples, oldest first, paged by sequence number", dependencies=[Depends(admin)])
    async def samples(
        after_seq: int = Query(0, ge=0, description="return samples with seq greater than this"),
        limit: int = Query(1000, ge=1, le=10_000),
        target: Literal["ttft", "tpot"] | None = Query(None),
    ):
        page = svc.sample_page(after_seq=after_seq, limit=limit, target=target)
        return JSONResponse({"feature_names": FEATURE_NAMES, **page})

    query_names = [(r.path_regex, _query_names(r.dependant)) for r in app.router.routes if hasattr(r, "dependant")]
    tokens = tuple(t.encode() for t in (data_token, token) if t) if data_token else ()
    rl = config.rate_limits
    limits = {kind: TokenBuckets(rate_per_s=b.rate_per_s, burst=b.burst, max_sources=rl.max_sources)
              for kind, b in (("lifecycle", rl.lifecycle), ("metrics", rl.metrics)) if b.rate_per_s is not None}
    app.guard = RequestGuard(
        functools.partial(FastAPI.__call__, app),
        max_body_bytes=config.limits.max_body_bytes, max_model_bytes=config.limits.max_model_bytes,
        query_names=query_names,
        fast_path=_fast_path(svc, route_model=route.__annotations__["body"], bodies=bodies),
        tokens=tokens, open_paths=config.auth.open_paths, limits=limits,
        body_timeout_s=config.limits.body_timeout_s,
    )
    return app


class _RouterApp(FastAPI):
    """FastAPI with the request guard in front of everything, FastAPI's own entry included.

    The hot calls are answered by the guard without passing FastAPI's
    per-request telemetry check and Starlette's middleware stack. With
    FastAPI's native OpenTelemetry on (a provider configured when the first
    request arrives), route and lifecycle calls go through FastAPI's routes
    instead, so they are traced.
    """

    guard: RequestGuard | None = None
    _telemetry_checked = False

    async def __call__(self, scope, receive, send):
        guard = self.guard
        if guard is None or scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        if not self._telemetry_checked:
            self._telemetry_checked = True
            telemetry = getattr(self, "_native_telemetry", None)
            if telemetry is not None and telemetry.enabled():
                log.info("OpenTelemetry on: every call goes through FastAPI (no fast path)")
                guard.fast_path = None
        await guard(scope, receive, send)


# -- the hot data-plane calls ---------------------------------------------------------

_EVENT_PATH = re.compile(r"^/v1/requests/([^/]+)/(first_token|progress|completed)$")


def _typed_body(model: type[BaseModel]):
    """Decorator: the handler's `body` parameter is `model` (built per app, so not nameable in the signature)."""

    def set_body(handler):
        handler.__annotations__["body"] = model
        return handler

    return set_body


def _fast_path(svc: RoutingService, *, route_model: type[BaseModel], bodies: dict[str, type]):
    """route and lifecycle calls answered straight from the ASGI guard.

    The same body models, validation-error format and handlers as the FastAPI
    routes (which stay declared for OpenAPI and serve everything else), minus
    FastAPI's per-request dependency machinery: on this path a call costs
    about half the CPU. Returns None for any other request.
    """
    events = {"first_token": bodies["FirstTokenBody"], "progress": bodies["ProgressBody"],
              "completed": bodies["CompletedBody"]}
    batch_model = bodies["EventBatch"]

    def handle(method: str, path: str, body: bytes, source: str):
        if method != "POST":
            return None
        if path == "/v1/route":
            model, request_id, kind = route_model, None, None
        elif path == "/v1/requests/events":
            model, request_id, kind = batch_model, None, "batch"
        else:
            m = _EVENT_PATH.match(path)
            if m is None:
                return None
            request_id, kind = m.group(1), m.group(2)
            model = events[kind]
            if len(request_id) > 253:
                return _invalid([{"loc": ("path", "request_id"), "msg": "String should have at most 253 characters",
                                  "type": "string_too_long"}], prefix=())
        try:
            parsed = model.model_validate_json(body)
        except ValidationError as exc:
            return _invalid(exc.errors(), prefix=("body",))
        if kind is None:
            return route_response(svc, parsed)
        if kind == "batch":
            return batch_response(svc, parsed, source)
        return event_response(svc, request_id, kind, parsed, source)

    return handle


def route_response(svc: RoutingService, body: RouteBody) -> tuple[int, dict, dict | None]:
    """(status, JSON content, headers) for a route call."""
    req = body.to_request()
    try:
        result = svc.route(req)
    except MissingSloError as exc:
        return _err(422, "missing_slo", str(exc), [{"field": "body.slo", "message": "required: SLO routing is on"}])
    except DuplicateRequestError as exc:
        return _err(409, "duplicate_request", str(exc), [{"field": "body.request_id", "message": "already in flight"}])
    except (NoEndpointError, TopologyError) as exc:
        code = "topology" if isinstance(exc, TopologyError) else "no_endpoint"
        return _err(503, code, str(exc), headers={"Retry-After": "1"})
    if not result.routed:
        return 429, {"error": "shed", "message": result.reason, "request_id": result.request_id, "fields": []}, None
    return 200, _route_out(result, svc), None


def event_response(svc: RoutingService, request_id: str, kind: str, body, source: str) -> tuple[int, dict, dict | None]:
    """(status, JSON content, headers) for a lifecycle call from `source` (the client's address)."""
    try:
        if kind == "first_token":
            n = svc.first_token(request_id, observed_ttft_ms=body.observed_ttft_ms, source=source)
        elif kind == "progress":
            n = svc.progress(request_id, tokens_generated=body.tokens_generated,
                             observed_tpot_ms=body.observed_tpot_ms, source=source)
        else:
            n = svc.completed(request_id, output_tokens=body.output_tokens, observed_ttft_ms=body.observed_ttft_ms,
                              observed_tpot_ms=body.observed_tpot_ms, source=source)
    except UnknownRequestError as exc:
        return _err(404, "unknown_request", str(exc))
    except (RegistryError, ValueError) as exc:
        return _err(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
    return 200, {"request_id": request_id, "samples_recorded": n}, None


def batch_response(svc: RoutingService, body: EventBatch, source: str) -> tuple[int, dict, None]:
    """(200, per-event results) for a batch of lifecycle events, applied in order."""
    results = []
    for ev in body.events:
        status, content, _ = event_response(svc, ev.request_id, ev.event, ev, source)
        results.append({"request_id": ev.request_id, "status": status,
                        "samples_recorded": content.get("samples_recorded", 0),
                        "error": None if status == 200 else content["message"]})
    return 200, {"results": results}, None


def _invalid(errors, *, prefix: tuple) -> tuple[int, dict, None]:
    """422 content naming each field, from pydantic/FastAPI error dicts."""
    fields = []
    for err in errors:
        parts = prefix + tuple(err.get("loc", ()))
        loc = ".".join(str(p) for p in parts) or "body"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif err.get("type") == "json_invalid":
            loc, msg = "body", "not valid JSON"
        elif msg.startswith("Value error, "):
            # Model-level checks say "<field>: <problem>": put the field in the path.
            msg = msg[len("Value error, "):]
            name, sep, rest = msg.partition(": ")
            if sep and name.isidentifier():
                loc, msg = f"{loc}.{name}", rest
        fields.append({"field": loc, "message": msg})
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    return 422, {"error": "invalid_request", "message": summary, "fields": fields}, None


def _err(status: int, code: str, message: str, fields: list | None = None, headers=None) -> tuple[int, dict, dict | None]:
    return status, {"error": code, "message": message, "fields": fields or []}, headers


def _json(result: tuple[int, dict, dict | None]) -> JSONResponse:
    status, content, headers = result
    return JSONResponse(content, status_code=status, headers=headers)


def _query_names(dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _allowed_methods(app: FastAPI, scope) -> list[str]:
    """Methods of every route matching the path; a literal path (/v1/models/rollback)
    wins over a templated one (/v1/models/{version}) that would also match it."""
    static: set[str] = set()
    templated: set[str] = set()
    for r in app.router.routes:
        if not getattr(r, "methods", None):
            continue
        match, _ = r.matches({**scope, "method": next(iter(r.methods))})
        if match != Match.NONE:
            (templated if r.param_convertors else static).update(r.methods)
    return sorted((static or templated) - {"HEAD"})


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _route_out(result: PickResult, svc: RoutingService) -> dict:
    def choice(c):
        if c is None:
            return None
        return {
            "endpoint_id": c.endpoint_id,
            "role": c.role,
            "url": svc.registry.get(c.endpoint_id).url,
            "predicted_ttft_ms": c.predicted_ttft_ms,
            "predicted_tpot_ms": c.predicted_tpot_ms,
            "headroom_ttft_ms": c.headroom_ttft_ms,
            "headroom_tpot_ms": c.headroom_tpot_ms,
            "transfer_cost_ms": c.transfer_cost_ms,
            "shared_level": c.shared_level,
        }

    return {
        "request_id": result.request_id,
        "outcome": result.outcome,
        "mode": result.mode,
        "prefill": choice(result.prefill),
        "decode": choice(result.decode),
        "tier": result.tier,
        "reason": result.reason,
        "topology_fallback": result.topology_fallback,
        "model_version": result.model_version,
    }
