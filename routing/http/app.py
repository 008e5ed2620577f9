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
import logging

from fastapi import Depends, FastAPI
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from routing.http.admin_routes import add_endpoint_routes, add_model_routes, add_sample_routes
from routing.config import RouterConfig
from routing.http.data_routes import add_read_routes, add_request_routes
from routing.http.guard import RequestGuard, query_names_of
from routing.http.hot_calls import add_hot_routes, fast_path, hot_calls
from routing.http.bodies import bounded_bodies
from routing.http.errors import Refused, add_error_handlers
from routing.http.ratelimit import TokenBuckets
from routing.fleet.scrape import scrape_forever
from routing.service import RoutingService

log = logging.getLogger("sla_planner.routing.http.app")


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
    app = _RouterApp(
        title="sla-planner routing service",
        version="1",
        description="SLO-aware and topology-aware endpoint picking with a published latency predictor.",
        lifespan=functools.partial(_lifespan, svc, config),
    )
    app.state.service = svc
    add_error_handlers(app)
    data = _data_dependencies(config) if data_token else []
    admin = [Depends(_admin_check(config, token))]
    # The body schemas say what this service accepts: token counts within the
    # model's context length, latencies within the profile's plausible range.
    bodies = bounded_bodies(max_tokens=svc.max_context_tokens, ttft_ms=svc.latency_bounds_ms("ttft"),
                            tpot_ms=svc.latency_bounds_ms("tpot"))
    calls = hot_calls(bodies, slo_required=config.picker.slo.enabled)
    add_hot_routes(app, svc, calls[:1], data)
    add_request_routes(app, svc, bodies, data)
    add_hot_routes(app, svc, calls[1:], data)
    add_read_routes(app, svc, data)
    add_endpoint_routes(app, svc, config.picker.topology.levels, admin)
    add_model_routes(app, svc, admin, data)
    add_sample_routes(app, svc, admin)
    app.guard = _guard(app, svc, config, calls, token=token, data_token=data_token)
    return app


def _guard(app: FastAPI, svc: RoutingService, config: RouterConfig, calls, *, token: str | None,
           data_token: str | None) -> RequestGuard:
    """The request guard in front of `app`, with the fast path for the hot calls."""
    tokens = tuple(t.encode() for t in (data_token, token) if t) if data_token else ()
    rl = config.rate_limits
    limits = {kind: TokenBuckets(rate_per_s=b.rate_per_s, burst=b.burst, max_sources=rl.max_sources)
              for kind, b in (("lifecycle", rl.lifecycle), ("metrics", rl.metrics)) if b.rate_per_s is not None}
    return RequestGuard(
        functools.partial(FastAPI.__call__, app),
        max_body_bytes=config.limits.max_body_bytes, max_model_bytes=config.limits.max_model_bytes,
        query_names=query_names_of(app), fast_path=fast_path(svc, calls),
        tokens=tokens, open_paths=config.auth.open_paths, limits=limits,
        body_timeout_s=config.limits.body_timeout_s,
    )


@contextlib.asynccontextmanager
async def _lifespan(svc: RoutingService, config: RouterConfig, app: FastAPI):
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


def _data_dependencies(config: RouterConfig) -> list:
    """The data token as a dependency: it only declares the token in the OpenAPI document (the guard checks it)."""
    data_bearer = HTTPBearer(auto_error=False, scheme_name="DataToken",
                             description=f"data-plane token from ${config.auth.data_token_env} (or the admin token)")

    async def data_auth(credentials: HTTPAuthorizationCredentials | None = Depends(data_bearer)) -> None:
        return None

    return [Depends(data_auth)]


def _admin_check(config: RouterConfig, token: str | None):
    """The dependency admin routes need: the admin bearer token (403 when none is configured)."""
    bearer = HTTPBearer(auto_error=False, description=f"admin token from ${config.auth.token_env}")

    async def admin(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not token:
            raise Refused(403, "admin_disabled", f"admin API disabled: no token configured (set ${config.auth.token_env})")
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Refused(401, "unauthorized", "bearer token required")
        if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise Refused(401, "unauthorized", "bearer token is not valid")

    return admin


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
