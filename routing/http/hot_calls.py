"""The hot data-plane calls (route and the lifecycle events), each defined once.

A `HotCall` holds a call's path, body model, handler and OpenAPI metadata.
`add_hot_routes` declares the calls as FastAPI routes (the OpenAPI document,
and the serving path when the fast path is off); `fast_path` answers the same
calls straight from the request guard, without FastAPI's per-request
dependency machinery (about half the CPU). Both validate with the same body
model, name fields in the same 422 and call the same handler, which answers
(status, JSON content, headers).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Path, Request
from pydantic import BaseModel, ValidationError

from routing.http.guard import client_source
from routing.http.answers import EventBatchOut, EventOut, RouteOut, ShedOut
from routing.http.bodies import EventBatch, RouteBody
from routing.http.errors import error_answer, error_responses, invalid_answer, json_response
from routing.picking.result import PickResult
from routing.picking.picker import MissingSloError, NoEndpointError, TopologyError
from routing.fleet.errors import DuplicateRequestError, RegistryError, UnknownEndpointError, UnknownRequestError
from routing.service import RoutingService

# The one path parameter a hot call may have, and its longest value.
REQUEST_ID = "{request_id}"
MAX_ID_CHARS = 253

Answer = tuple[int, dict, dict | None]


@dataclass(frozen=True)
class HotCall:
    """One hot POST call: where, what it accepts, who answers and how OpenAPI describes it.

    handler: (service, body, request_id or None, source address) -> Answer.
    """

    name: str
    path: str
    body: type[BaseModel]
    handler: Callable[[RoutingService, BaseModel, str | None, str], Answer]
    summary: str
    response_model: type[BaseModel]
    responses: dict
    tag: str = "lifecycle"


def hot_calls(bodies: dict[str, type], *, slo_required: bool) -> list[HotCall]:
    """The hot calls with this service's bounded body models (`bounded_bodies`).

    slo_required: SLO routing is on, so a route body must carry an SLO.
    """
    lifecycle = error_responses(401, 404, 413, 422, 429)
    return [
        HotCall("route", "/v1/route", bodies["SloRouteBody" if slo_required else "RouteBody"], route_response,
                "Pick endpoints for a request and record it", RouteOut,
                {429: {"model": ShedOut}, **error_responses(401, 409, 413, 422, 503)}, tag="routing"),
        HotCall("prefill_done", f"/v1/requests/{REQUEST_ID}/prefill_done", bodies["PrefillDoneBody"],
                functools.partial(event_response, "prefill_done"),
                "A disaggregated request's prefill returned (with the decode endpoint picked then)", EventOut,
                lifecycle),
        HotCall("first_token", f"/v1/requests/{REQUEST_ID}/first_token", bodies["FirstTokenBody"],
                functools.partial(event_response, "first_token"), "The request produced its first token",
                EventOut, lifecycle),
        HotCall("progress", f"/v1/requests/{REQUEST_ID}/progress", bodies["ProgressBody"],
                functools.partial(event_response, "progress"),
                "Tokens generated so far (and TPOT observed around now)", EventOut, lifecycle),
        HotCall("events", "/v1/requests/events", bodies["EventBatch"], batch_response,
                "Several lifecycle events in one call (per-event status in the answer)", EventBatchOut,
                error_responses(401, 413, 422, 429)),
        HotCall("completed", f"/v1/requests/{REQUEST_ID}/completed", bodies["CompletedBody"],
                functools.partial(event_response, "completed"), "The request finished", EventOut, lifecycle),
    ]


def add_hot_routes(app: FastAPI, svc: RoutingService, calls: list[HotCall], dependencies: list) -> None:
    """Declare each hot call as a FastAPI POST route calling its handler."""
    for call in calls:
        app.post(call.path, response_model=call.response_model, responses=call.responses, tags=[call.tag],
                 summary=call.summary, dependencies=dependencies, name=call.name)(_endpoint(svc, call))


def _endpoint(svc: RoutingService, call: HotCall):
    handler = call.handler
    if REQUEST_ID in call.path:
        async def endpoint(request: Request, body, request_id: str = Path(max_length=MAX_ID_CHARS)):
            return json_response(handler(svc, body, request_id, client_source(request.scope)))
    else:
        async def endpoint(request: Request, body):
            return json_response(handler(svc, body, None, client_source(request.scope)))
    # The body model is built per app (bounded_bodies), so it is set here rather than named in the signature.
    endpoint.__annotations__["body"] = call.body
    endpoint.__name__ = call.name
    return endpoint


def fast_path(svc: RoutingService, calls: list[HotCall]):
    """(method, path, body, source) -> Answer for the hot calls; None for any other request."""
    exact = {c.path: c for c in calls if REQUEST_ID not in c.path}
    templated = {f"c{k}": c for k, c in enumerate(c for c in calls if REQUEST_ID in c.path)}
    # One regex for every templated path: the group that matched names the call and holds the id.
    pattern = re.compile("^(?:" + "|".join(
        re.escape(c.path).replace(re.escape(REQUEST_ID), f"(?P<{g}>[^/]+)") for g, c in templated.items()) + ")$")

    def handle(method: str, path: str, body: bytes, source: str):
        if method != "POST":
            return None
        call = exact.get(path)
        request_id = None
        if call is None:
            m = pattern.match(path)
            if m is None:
                return None
            call = templated[m.lastgroup]
            request_id = m.group(m.lastgroup)
            if len(request_id) > MAX_ID_CHARS:
                return invalid_answer([{"loc": ("path", "request_id"), "type": "string_too_long",
                                        "msg": f"String should have at most {MAX_ID_CHARS} characters"}], prefix=())
        try:
            parsed = call.body.model_validate_json(body)
        except ValidationError as exc:
            return invalid_answer(exc.errors(), prefix=("body",))
        return call.handler(svc, parsed, request_id, source)

    return handle


def route_response(svc: RoutingService, body: RouteBody, request_id: str | None = None,
                   source: str | None = None) -> Answer:
    """A route call (the id, if any, is in the body; the source plays no part)."""
    req = body.to_request()
    try:
        result = svc.route(req)
    except MissingSloError as exc:
        return error_answer(422, "missing_slo", str(exc),
                            [{"field": "body.slo", "message": "required: SLO routing is on"}])
    except DuplicateRequestError as exc:
        return error_answer(409, "duplicate_request", str(exc),
                            [{"field": "body.request_id", "message": "already in flight"}])
    except (NoEndpointError, TopologyError) as exc:
        code = "topology" if isinstance(exc, TopologyError) else "no_endpoint"
        return error_answer(503, code, str(exc), headers={"Retry-After": "1"})
    if not result.routed:
        return 429, {"error": "shed", "message": result.reason, "request_id": result.request_id, "fields": []}, None
    return 200, _route_out(result, svc), None


def event_response(kind: str, svc: RoutingService, body, request_id: str, source: str) -> Answer:
    """A lifecycle call of `kind` (prefill_done, first_token, progress, completed) from `source` (its address)."""
    try:
        if kind == "prefill_done":
            svc.prefill_done(request_id, decode_id=body.decode_endpoint_id)
            n = 0
        elif kind == "first_token":
            n = svc.first_token(request_id, observed_ttft_ms=body.observed_ttft_ms, source=source)
        elif kind == "progress":
            n = svc.progress(request_id, tokens_generated=body.tokens_generated,
                             observed_tpot_ms=body.observed_tpot_ms, source=source)
        else:
            n = svc.completed(request_id, output_tokens=body.output_tokens, observed_ttft_ms=body.observed_ttft_ms,
                              observed_tpot_ms=body.observed_tpot_ms, source=source)
    except UnknownRequestError as exc:
        return error_answer(404, "unknown_request", str(exc))
    except UnknownEndpointError as exc:
        return error_answer(404, "unknown_endpoint", str(exc),
                            [{"field": "body.decode_endpoint_id", "message": str(exc)}])
    except (RegistryError, ValueError) as exc:
        return error_answer(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
    return 200, {"request_id": request_id, "samples_recorded": n}, None


def batch_response(svc: RoutingService, body: EventBatch, request_id: str | None, source: str) -> Answer:
    """(200, per-event results) for a batch of lifecycle events, applied in order."""
    results = []
    for ev in body.events:
        status, content, _ = event_response(ev.event, svc, ev, ev.request_id, source)
        results.append({"request_id": ev.request_id, "status": status,
                        "samples_recorded": content.get("samples_recorded", 0),
                        "error": None if status == 200 else content["message"]})
    return 200, {"results": results}, None


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
