"""The data plane's other routes (not hot): predictions, externally routed requests, pushed metrics, reads.

Each is registered on the app with the data-plane dependencies (the data
token, declared for OpenAPI; the request guard checks it).
"""

from __future__ import annotations

from fastapi import FastAPI, Path
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from routing.http.answers import EndpointOut, EventOut, HealthOut, OkOut, PredictOut
from routing.http.bodies import ID_PATTERN, DispatchedBody, MetricsBody, PredictBody
from routing.http.errors import error_response, error_responses
from routing.picking.picker import RouteRequest
from routing.fleet.errors import DuplicateRequestError, RegistryError, UnknownEndpointError
from routing.service import RoutingService


def add_request_routes(app: FastAPI, svc: RoutingService, bodies: dict[str, type], data: list) -> None:
    """POST /v1/predict and /v1/requests/{id}/dispatched, with this service's bounded bodies."""

    @app.post("/v1/predict", response_model=PredictOut, responses=error_responses(401, 404, 413, 422),
              tags=["routing"], summary="Predicted TTFT/TPOT per endpoint, without routing", dependencies=data)
    @_typed_body(bodies["PredictBody"])
    async def predict(body: PredictBody):
        req = RouteRequest(request_id="predict", input_tokens=body.input_tokens,
                           prefix_cache_hit_frac=body.prefix_cache_hit_frac)
        try:
            return svc.predict(req, body.endpoint_ids)
        except UnknownEndpointError as exc:
            return error_response(404, "unknown_endpoint", str(exc),
                                  [{"field": "body.endpoint_ids", "message": str(exc)}])

    @app.post("/v1/requests/{request_id}/dispatched", response_model=EventOut, status_code=201,
              responses=error_responses(401, 404, 409, 413, 422, 429), tags=["lifecycle"],
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
            return error_response(404, "unknown_endpoint", str(exc))
        except DuplicateRequestError as exc:
            return error_response(409, "duplicate_request", str(exc))
        except RegistryError as exc:
            return error_response(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
        return JSONResponse(status_code=201, content={"request_id": request_id, "samples_recorded": 0})


def add_read_routes(app: FastAPI, svc: RoutingService, data: list) -> None:
    """Pushed engine metrics, the endpoint and model reads, health and Prometheus metrics."""

    @app.put("/v1/endpoints/{endpoint_id}/metrics", response_model=OkOut,
             responses=error_responses(401, 404, 413, 422, 429),
             tags=["endpoints"], summary="Push an engine's scraped load metrics", dependencies=data)
    async def push_metrics(body: MetricsBody, endpoint_id: str = Path(max_length=253)):
        try:
            svc.observe_metrics(endpoint_id, kv_usage_frac=body.kv_usage_frac,
                                waiting_requests=body.waiting_requests, running_requests=body.running_requests)
        except UnknownEndpointError as exc:
            return error_response(404, "unknown_endpoint", str(exc))
        return {"ok": True}

    @app.get("/v1/endpoints", response_model=list[EndpointOut], responses=error_responses(401, 422),
             tags=["endpoints"], summary="Endpoints and their load", dependencies=data)
    async def list_endpoints():
        return svc.endpoint_status()

    @app.get("/healthz", response_model=HealthOut, responses=error_responses(422), tags=["service"],
             summary="Liveness and a short status")
    async def healthz():
        return svc.health()

    @app.get("/metrics", tags=["service"], summary="Prometheus metrics",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **error_responses(422)})
    async def metrics():
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _typed_body(model: type):
    """Decorator: the handler's `body` parameter is `model` (built per app, so not nameable in the signature)."""

    def set_body(handler):
        handler.__annotations__["body"] = model
        return handler

    return set_body
