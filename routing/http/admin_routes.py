"""The control routes: endpoint registration, model versions, training-sample reads.

The writes and the samples need the admin bearer token (the `admin`
dependencies; without a configured token they answer 403); the model reads
take the data-plane dependencies.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import FastAPI, Path, Query
from fastapi.responses import JSONResponse
from pydantic import Field, create_model

from routing.http.answers import ModelListOut, PublishedOut, RegisteredOut, RemovedOut, RollbackOut, SamplesOut
from routing.http.bodies import ID_PATTERN, EndpointBody, RollbackBody
from routing.http.errors import error_response, error_responses
from routing.models.format import ModelDocument
from routing.models.store import UnknownVersionError, VersionExistsError
from routing.fleet.registry import Endpoint
from routing.fleet.errors import RegistryError, UnknownEndpointError
from routing.samples.store import FEATURE_NAMES
from routing.service import RoutingService


def add_endpoint_routes(app: FastAPI, svc: RoutingService, levels: list[str], admin: list) -> None:
    """PUT and DELETE /v1/endpoints/{id}; `levels`: the configured topology levels a domain may name."""

    async def register(body: EndpointBody, endpoint_id: str = Path(pattern=ID_PATTERN)):
        try:
            created = svc.register(Endpoint(id=endpoint_id, role=body.role, url=body.url, domains=body.domains,
                                            max_kv_tokens=body.max_kv_tokens, gpus=body.gpus))
        except RegistryError as exc:
            return error_response(422, "invalid_request", str(exc), [{"field": "body", "message": str(exc)}])
        return {"id": endpoint_id, "created": created}

    # Domain keys must be configured levels: the schema lists them.
    level = Literal[tuple(levels)]
    register.__annotations__["body"] = create_model(
        "EndpointBody", __base__=EndpointBody,
        domains=(dict[level, Annotated[str, Field(min_length=1, max_length=253)]],
                 Field(default_factory=dict, description="topology value per configured level")),
    )
    app.put("/v1/endpoints/{endpoint_id}", response_model=RegisteredOut, responses=error_responses(401, 403, 413, 422),
            tags=["endpoints"], summary="Register or update an endpoint", dependencies=admin)(register)

    @app.delete("/v1/endpoints/{endpoint_id}", response_model=RemovedOut, responses=error_responses(401, 403, 404, 422),
                tags=["endpoints"], summary="Remove an endpoint (drain=true: after its requests in flight)",
                dependencies=admin)
    async def deregister(endpoint_id: str = Path(max_length=253),
                         drain: bool = Query(False, description="stop picking it now, remove it after its last "
                                             "request in flight (whose completion still makes samples)")):
        try:
            n = svc.deregister(endpoint_id, drain=drain)
        except UnknownEndpointError as exc:
            return error_response(404, "unknown_endpoint", str(exc))
        return {"id": endpoint_id, "detached_requests": 0 if drain else n, "draining_requests": n if drain else 0}


def add_model_routes(app: FastAPI, svc: RoutingService, admin: list, data: list) -> None:
    """Publish (POST /v1/models), the model reads (GET, with the data-plane `data` dependencies), rollback."""

    @app.post("/v1/models", response_model=PublishedOut, status_code=201,
              responses=error_responses(401, 403, 409, 413, 422, 507),
              tags=["models"], summary="Publish a latency model (safe JSON format) and make it active",
              dependencies=admin)
    def publish(document: ModelDocument):
        # Sync handler: validation and compilation of a large document run in
        # the thread pool, not on the event loop serving routes.
        try:
            out = svc.publish(document.model_dump(mode="json"))
        except VersionExistsError as exc:
            return error_response(409, "version_exists", str(exc), [{"field": "body.version", "message": str(exc)}])
        except ValueError as exc:
            field = str(exc).split(":", 1)[0]
            return error_response(422, "invalid_model", str(exc), [{"field": f"body.{field}", "message": str(exc)}])
        return JSONResponse(status_code=201, content=out)

    @app.get("/v1/models", response_model=ModelListOut, responses=error_responses(401, 422), tags=["models"],
             summary="Published versions and the active one", dependencies=data)
    async def list_models():
        return svc.model_list()

    @app.get("/v1/models/{version}", response_model=ModelDocument, responses=error_responses(401, 404, 422),
             tags=["models"], summary="A retained model document", dependencies=data)
    async def get_model(version: str = Path(max_length=64)):
        try:
            return JSONResponse(svc.models.get(version).document)
        except UnknownVersionError as exc:
            return error_response(404, "unknown_version", str(exc))

    @app.post("/v1/models/rollback", response_model=RollbackOut,
              responses=error_responses(401, 403, 404, 409, 413, 422, 507),
              tags=["models"], summary="Reactivate the previous (or a named) model version", dependencies=admin)
    async def rollback(body: RollbackBody):
        try:
            return svc.rollback(to_version=body.to_version)
        except UnknownVersionError as exc:
            return error_response(404, "unknown_version", str(exc),
                                  [{"field": "body.to_version", "message": str(exc)}])
        except ValueError as exc:
            return error_response(409, "nothing_to_roll_back", str(exc))


def add_sample_routes(app: FastAPI, svc: RoutingService, admin: list) -> None:
    """GET /v1/samples: training samples, paged by sequence number."""

    @app.get("/v1/samples", response_model=SamplesOut, responses=error_responses(401, 403, 422), tags=["samples"],
             summary="Training samples, oldest first, paged by sequence number", dependencies=admin)
    async def samples(
        after_seq: int = Query(0, ge=0, description="return samples with seq greater than this"),
        limit: int = Query(1000, ge=1, le=10_000),
        target: Literal["ttft", "tpot"] | None = Query(None),
    ):
        page = svc.sample_page(after_seq=after_seq, limit=limit, target=target)
        return JSONResponse({"feature_names": FEATURE_NAMES, **page})
