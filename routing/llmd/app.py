"""llm-d's latency-predictor routes over HTTP: the prediction and the training sidecar's, on one listener.

An EPP configured with `PREDICTION_SERVER_URL` and `TRAINING_SERVER_URL` both set to this listener's
address calls it as it calls llm-d's own sidecars (../shared/llmd/predictor/API.md has the contract): bulk
predictions per scheduling decision (400 ms budget), training rows every second (202 expected), status and
model info every minute, probes. The routes, bodies and answer shapes are llm-d's; what they answer is ours
(routing.llmd.sidecar). llm-d sends no token, so the listener has none: it binds the pod's loopback unless
told otherwise (`sla-planner router --llmd-listen`).

Errors: a body that fails validation is 422 with llm-d's `detail` list and a one-line `message` naming the
first field at fault; on `/predict/bulk/strict` (and `/predict`) a row we cannot serve (a pod_type with no
role here) fails the call the same way, on `/predict/bulk` only that row (null, listed in `errors`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from planner.strict import error_message
from routing.features import QUANTILE
from routing.llmd.rows import BulkPrediction, BulkTraining, FlushRequest, PredictionRow, RowError
from routing.llmd.sidecar import LatencyPredictorSidecar, Served

OBJECTIVE = "quantile"


def create_llmd_app(sidecar: LatencyPredictorSidecar, *, address: str) -> FastAPI:
    """The FastAPI app of llm-d's predictor API; `address` (http://host:port) is what it reports as both servers."""
    app = FastAPI(title="sla-planner: llm-d latency-predictor API", version="1",
                  description="llm-d's prediction and training sidecar routes, answered by sla-planner's router.")
    app.state.sidecar = sidecar
    _errors(app)
    _prediction_routes(app, sidecar, address)
    _training_routes(app, sidecar)
    return app


def _iso(t_s: float | None) -> str | None:
    return None if t_s is None else datetime.fromtimestamp(t_s, timezone.utc).isoformat()


def _meta(served: Served) -> dict:
    return {"model_type": served.model_type, "objective_type": OBJECTIVE, "quantile": QUANTILE}


def _json(payload: dict, status_code: int = 200) -> Response:
    """An answer serialised once, without FastAPI's per-field encoder (bulk answers are on the EPP's 400 ms path)."""
    return Response(json.dumps(payload, separators=(",", ":")), status_code=status_code, media_type="application/json")


def _body(model: type[BaseModel], raw: bytes):
    """The request body validated straight from its JSON; errors as FastAPI reports a body's (loc starts "body")."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _one_line(errors: list) -> str:
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {error_message(first) if 'msg' in first else 'invalid'}{more}"


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = jsonable_encoder(exc.errors())
        return JSONResponse({"detail": errors, "message": _one_line(errors)}, status_code=422)

    @app.exception_handler(RowError)
    async def bad_row(request: Request, exc: RowError):
        detail = [{"loc": ["body", "requests", exc.index, exc.field], "msg": str(exc), "type": "value_error"}]
        return JSONResponse({"detail": detail, "message": str(exc)}, status_code=422)


def _prediction_routes(app: FastAPI, sidecar: LatencyPredictorSidecar, address: str) -> None:
    def answers(rows, *, lenient: bool = False):
        preds, errors = sidecar.predict(rows, lenient=lenient)
        served = preds.served
        base = {"predicted_at": datetime.now(timezone.utc).isoformat(), **_meta(served),
                "last_model_load": _iso(served.last_load_s), "model_version": served.pinned.version}
        bad = {e.index for e in errors}
        out = [
            None if i in bad else {
                "ttft_ms": float(preds.ttft_ms[i]), "tpot_ms": float(preds.tpot_ms[i]),
                "ttft_mean_ms": float(preds.ttft_mean_ms[i]), "tpot_mean_ms": float(preds.tpot_mean_ms[i]), **base,
            }
            for i in range(len(rows))
        ]
        return out, errors

    @app.get("/", include_in_schema=False)
    async def root():
        served = sidecar.serving()
        return {"message": "sla-planner routing service: llm-d latency-predictor API (prediction and training)",
                **_meta(served), "is_ready": True, "serving": served.reason, "training_server": address,
                "sync_interval": None}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "service": "sla-planner-llmd-predictor"}

    @app.get("/readyz")
    async def readyz():
        # Predictions are available from the start: the profile estimate serves until a model is published.
        return {"status": "ready", **_meta(sidecar.serving())}

    @app.get("/status")
    async def status():
        served = sidecar.serving()
        exists = served.pinned.version is not None
        return {"is_ready": True, **_meta(served), "last_model_load": _iso(served.last_load_s),
                "training_server_url": address, "models_exist": {"ttft_model": exists, "tpot_model": exists},
                "ensemble_active": False, "serving": served.reason, "model_version": served.pinned.version}

    @app.post("/predict")
    async def predict(row: PredictionRow):
        out, _ = answers([row])
        return out[0]

    # The bulk bodies are read and validated straight from their bytes (one pass, no per-field encoder on the
    # answer); `openapi_extra` keeps their schema in the OpenAPI document.
    bulk_schema = {"requestBody": {"content": {"application/json": {"schema": BulkPrediction.model_json_schema()}},
                                   "required": True}}

    @app.post("/predict/bulk/strict", openapi_extra=bulk_schema)
    async def predict_bulk_strict(request: Request):
        t0 = datetime.now(timezone.utc)
        body = _body(BulkPrediction, await request.body())
        out, _ = answers(body.requests)
        return _json({"predictions": out, "total_requests": len(out), "successful_predictions": len(out),
                      "failed_predictions": 0, "processing_time_ms": _ms_since(t0)})

    @app.post("/predict/bulk", openapi_extra=bulk_schema)
    async def predict_bulk(request: Request):
        t0 = datetime.now(timezone.utc)
        body = _body(BulkPrediction, await request.body())
        out, errors = answers(body.requests, lenient=True)
        return _json({"predictions": out,
                      "errors": [{"index": e.index, "error": str(e), "request": body.requests[e.index].model_dump()}
                                 for e in errors],
                      "total_requests": len(out), "successful_predictions": len(out) - len(errors),
                      "failed_predictions": len(errors), "processing_time_ms": _ms_since(t0)})

    @app.post("/reload")
    async def reload():
        # One process: a model the retrain flow publishes is served at once; there is nothing to download.
        served = sidecar.serving()
        return {"synced": True, "loaded": served.pinned.version is not None, "is_ready": True, **_meta(served),
                "last_load_time": _iso(served.last_load_s), "serving": served.reason}


def _training_routes(app: FastAPI, sidecar: LatencyPredictorSidecar) -> None:
    def model_status() -> tuple[Served, dict]:
        served = sidecar.serving()
        exists = served.pinned.version is not None
        return served, {"ttft": exists, "tpot": exists}

    training_schema = {"requestBody": {"content": {"application/json": {"schema": BulkTraining.model_json_schema()}},
                                       "required": True}}

    @app.post("/add_training_data_bulk", status_code=202, openapi_extra=training_schema)
    async def add_training(request: Request):
        body = _body(BulkTraining, await request.body())
        kept = sidecar.add_training(body.entries)
        return _json({"message": f"Accepted {kept} training samples.", "refused_entries": len(body.entries) - kept},
                     status_code=202)

    @app.get("/model/download/info")
    async def download_info():
        served, status = model_status()
        return {**_meta(served), "model_status": status, "model_version": served.pinned.version,
                "serving": served.reason, "format": "sla-planner/latency-model (JSON; never pickled)",
                "available_endpoints": {"ttft": "/model/ttft/download", "tpot": "/model/tpot/download",
                                        "info": "/model/{name}/info", "list": "/models/list"}}

    @app.get("/models/list")
    async def models_list():
        served, status = model_status()
        size = len(_document_bytes(sidecar)) if served.pinned.version else 0
        return {"models": {name: {"exists": ok, "size_bytes": size if ok else 0} for name, ok in status.items()},
                **_meta(served), "server_time": datetime.now(timezone.utc).isoformat()}

    @app.get("/model/{name}/info")
    async def model_info(name: str):
        _, status = model_status()
        if name not in status:
            return JSONResponse({"detail": f"model {name!r}: this predictor has ttft and tpot"}, status_code=404)
        body = _document_bytes(sidecar) if status[name] else b""
        return {"name": name, "exists": status[name], "size_bytes": len(body)}

    @app.get("/model/{name}/download")
    async def model_download(name: str):
        body = _document_bytes(sidecar) if name in ("ttft", "tpot") else b""
        if not body:
            return JSONResponse({"detail": f"model {name!r} is not available (the profile estimate serves)"},
                                status_code=404)
        return Response(body, media_type="application/json")

    @app.post("/flush")
    async def flush(body: FlushRequest | None = None):
        body = body or FlushRequest()
        out = sidecar.flush(training=body.flush_training_data, test=body.flush_test_data, metrics=body.flush_metrics)
        flushed = out["ttft_training_samples_flushed"] + out["tpot_training_samples_flushed"]
        return {"success": True, "reason": body.reason, **out,
                "message": f"Successfully flushed {flushed} training samples posted by llm-d "
                           f"(no test set is kept between retrains){'; metrics cleared' if body.flush_metrics else ''}"}

    @app.get("/data/status")
    async def data_status():
        return sidecar.data_status()

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(sidecar.service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _document_bytes(sidecar: LatencyPredictorSidecar) -> bytes:
    doc = sidecar.model_document()
    return b"" if doc is None else json.dumps(doc, separators=(",", ":")).encode()


def _ms_since(t0: datetime) -> float:
    return (datetime.now(timezone.utc) - t0).total_seconds() * 1000.0


def start_listener(sidecar: LatencyPredictorSidecar, *, host: str, port: int, log_level: str = "info"):
    """Serve the llm-d API on host:port from a thread of this process (the routing service's state is shared
    and thread-safe). Returns the uvicorn server: set `should_exit` to stop it."""
    import threading

    import uvicorn

    app = create_llmd_app(sidecar, address=f"http://{host}:{port}")
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                           loop="asyncio", lifespan="off"))
    thread = threading.Thread(target=server.run, name="llmd-listener", daemon=True)
    thread.start()
    return server, thread
