"""Error answers of the HTTP API: one body shape, {"error", "message", "fields"}, for every failure.

Handlers answer a (status, content, headers) triple so the fast path and
FastAPI's routes share them; `json_response` turns one into a JSONResponse.
A 422 names each offending field (e.g. "body.slo.ttft_ms").
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from routing.http.answers import ErrorBody
from routing.store_guard import StoreFullError


class Refused(Exception):
    """A call refused before its handler ran (admin token missing or wrong)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(status: int, code: str, message: str, fields: list[dict] | None = None,
                   headers=None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": code, "message": message, "fields": fields or []}, headers=headers
    )


def error_answer(status: int, code: str, message: str, fields: list | None = None,
                 headers=None) -> tuple[int, dict, dict | None]:
    return status, {"error": code, "message": message, "fields": fields or []}, headers


def json_response(result: tuple[int, dict, dict | None]) -> JSONResponse:
    status, content, headers = result
    return JSONResponse(content, status_code=status, headers=headers)


def error_responses(*codes: int) -> dict:
    """The OpenAPI `responses` entry declaring these error statuses."""
    return {c: {"model": ErrorBody} for c in codes}


def invalid_answer(errors, *, prefix: tuple) -> tuple[int, dict, None]:
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


def add_error_handlers(app: FastAPI) -> None:
    """Answer FastAPI's and Starlette's own errors, a full store and anything unexpected in the one body shape."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        status, content, headers = invalid_answer(exc.errors(), prefix=())
        return JSONResponse(content, status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:
            # Starlette/FastAPI could not decode the body at all (not JSON/UTF-8).
            return error_response(422, "invalid_request", "body: not valid JSON",
                                  [{"field": "body", "message": "not valid JSON"}])
        if exc.status_code == 404 and b"%2f" in request.scope.get("raw_path", b"").lower():
            message = "path: holds an encoded '/' (%2F); request and endpoint ids cannot contain '/'"
            return error_response(422, "invalid_request", message, [{"field": "path", "message": message}])
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(StoreFullError)
    async def _store_full(request: Request, exc: StoreFullError):
        return error_response(507, "insufficient_storage", str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        # Starlette logs the exception itself; the client gets the usual error form.
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.code, exc.message, headers=headers)


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
