"""The request guard: ASGI middleware every call passes before any route sees it.

It checks the data-plane token, refuses unknown query parameters (422),
bodies over the limit (413) or too slow to arrive (408), applies per-source
rate limits (429 with Retry-After), then hands the call to the fast path or
to FastAPI. Done here rather than as FastAPI dependencies so the hot routes
pay little for it and the fast path and FastAPI's routes answer alike.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI

from routing.http.errors import error_answer
from routing.http.ratelimit import retry_after_header

log = logging.getLogger("sla_planner.routing.http.app")


@dataclass(eq=False)
class RequestGuard:
    """ASGI middleware in front of every call: the data-plane token, per-source rate
    limits, 422 for unknown query parameters, 413 for bodies over the limit and
    408 for bodies that do not arrive in time.

    query_names: (path regex, names the route accepts) for every route.
    tokens: bearer tokens accepted on every path but `open_paths` (the data
    token and the admin token); empty: no check here (admin routes still check
    theirs). limits: {"lifecycle" | "metrics": TokenBuckets or None}.
    fast_path: (method, path, body, source) -> (status, content, headers) or
    None; answers the hot calls without entering FastAPI.
    """

    app: Callable
    _: KW_ONLY
    max_body_bytes: int
    max_model_bytes: int
    query_names: list
    fast_path: Callable | None = None
    tokens: tuple[bytes, ...] = ()
    open_paths: frozenset[str] = frozenset()
    limits: dict = field(default_factory=dict)
    body_timeout_s: float = 10.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self):
        self.open_paths = frozenset(self.open_paths)
        self.limits = self.limits or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        limit = self.max_model_bytes if path == "/v1/models" else self.max_body_bytes
        refusal = self._check_head(scope, path, limit)
        if refusal is not None:
            return await _send_json(send, *refusal)
        body = await self._read_body(receive, send, limit)
        if body is None:
            return
        source = client_source(scope)
        refusal = self._rate_limit(scope["method"], path, body, source)
        if refusal is not None:
            return await _send_json(send, *refusal)
        if self.fast_path is not None:
            try:
                answer = self.fast_path(scope["method"], path, body, source)
            except Exception as exc:  # noqa: BLE001 - answered like any other error, then logged
                log.exception("%s %s failed", scope["method"], path)
                answer = error_answer(500, "internal_error", f"{type(exc).__name__}: {exc}")
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

    def _check_head(self, scope, path: str, limit: int) -> tuple | None:
        """The refusal (status, code, message, fields, headers) the request head earns, or None."""
        authorization = declared = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
        if self.tokens and path not in self.open_paths:
            problem = _bearer_problem(authorization, self.tokens)
            if problem:
                return 401, "unauthorized", problem, None, {"www-authenticate": "Bearer"}
        if scope.get("query_string"):
            problem = self._unknown_query(scope)
            if problem:
                field, message = problem
                return 422, "invalid_request", f"{field}: {message}", [{"field": field, "message": message}], None
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return 400, "bad_request", "content-length is not a number", None, None
            if size > limit:
                return 413, "body_too_large", f"body is {size} bytes, limit {limit}", None, None
        return None

    async def _read_body(self, receive, send, limit: int) -> bytes | None:
        """The whole body, read bounded in size and time (None: answered 413/408, or the client went away).

        Read here and replayed: an over-limit stream is answered 413 before the
        app sees any of it, a body trickled in slower than body_timeout_s is
        answered 408 and the connection closed.
        """
        chunks: list[bytes] = []
        seen = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None  # client went away
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > limit:
                        await _send_json(send, 413, "body_too_large", f"body exceeds the limit of {limit} bytes")
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _send_json(send, 408, "request_timeout",
                             f"body not received within {self.body_timeout_s:g} s "
                             f"(limits.body_timeout_s; {seen} bytes arrived)", headers={"connection": "close"})
            return None
        return b"".join(chunks)

    def _rate_limit(self, method: str, path: str, body: bytes, source: str) -> tuple | None:
        """The 429 refusal (status, code, message, fields, headers) when `source` is over its limit, or None."""
        kind = _limited_kind(method, path)
        bucket = self.limits.get(kind) if kind else None
        if bucket is None:
            return None
        # Each event of a batch counts as a call ('"event"' appears once per event).
        cost = max(1, body.count(b'"event"')) if path == "/v1/requests/events" else 1
        wait_s = bucket.take(source, now_s=self.clock(), cost=cost)
        if wait_s <= 0:
            return None
        return (429, "rate_limited",
                f"{kind} calls from {source}: over {bucket.rate_per_s:g}/s (burst {bucket.burst:g}); "
                f"retry in {wait_s:.2f} s", None, {"retry-after": retry_after_header(wait_s)})

    def _unknown_query(self, scope) -> tuple[str, str] | None:
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


def query_names_of(app: FastAPI) -> list:
    """(path regex, query parameter names it accepts) for every route of `app`."""
    return [(r.path_regex, _query_names(r.dependant)) for r in app.router.routes if hasattr(r, "dependant")]


def client_source(scope) -> str:
    """The caller's identity for rate limits and sample quotas: its address."""
    client = scope.get("client")
    return client[0] if client else "-"


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


def _limited_kind(method: str, path: str) -> str | None:
    if method == "POST" and path.startswith("/v1/requests/"):
        return "lifecycle"
    if method == "PUT" and path.startswith("/v1/endpoints/") and path.endswith("/metrics"):
        return "metrics"
    return None


def _query_names(dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
