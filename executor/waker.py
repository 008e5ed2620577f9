"""The waker: a front door that holds requests while the model has no worker, so the first one wakes the fleet.

Dynamo 1.6.1's frontend forgets a model once its last worker is gone and
answers its requests `404` without counting them in any dynamo_frontend_*
series (docs/scale-to-zero.md), so at zero nothing the planner reads moves.
In front of the frontend, the waker proxies every OpenAI call unchanged; a
completion for one of its models that the frontend answers 404 (or 503 while
the first worker registers) is held instead: counted at once
(`sla_planner_waker_held_requests` now,
`sla_planner_waker_requests_total{outcome="held"}`), which the watcher reads
to start the wake run (`sla-planner watch`, metrics.queries.wake_requests),
and sent again every retry_s until the frontend takes it, or answered 503
after hold_timeout_s. A request for another model is passed through as the
frontend answered it. The client sees one answer, late by the cold start:
the frontend does not hold requests for a model it does not know, the waker
does.

Run: `python -m executor.gateway`'s sibling, `python -m executor.waker --frontend-url URL --port P --model tok`;
`/metrics` for Prometheus, `/healthz` its counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.background import BackgroundTask

log = logging.getLogger("sla_planner.waker")
PASSED_HEADERS = ("content-type", "accept", "authorization")
# What Dynamo 1.6.1's frontend answers for want of a worker: 404 once the model's last worker is gone, 503 while
# its first new worker registers (the model listed, no instance routable yet; seen in the live test).
NO_WORKER = (404, 503)


class Waker:
    """Proxies to the frontend; holds a completion for its models while the frontend has no worker for them."""

    def __init__(self, *, frontend_url: str, models: tuple[str, ...], hold_timeout_s: float = 600.0,
                 retry_s: float = 0.25, timeout_s: float = 600.0):
        self.frontend_url = frontend_url.rstrip("/")
        self.models, self.hold_timeout_s, self.retry_s = models, hold_timeout_s, retry_s
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1024, max_keepalive_connections=128),
                                        timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.registry = CollectorRegistry()
        self.held = Gauge("sla_planner_waker_held_requests", "requests held now: the frontend has no worker "
                          "for their model", registry=self.registry)
        self.requests = Counter("sla_planner_waker_requests", "completions by outcome: passed (answered at "
                                "once), held (waited for a worker), timed_out (503 after hold_timeout_s)",
                                ["outcome"], registry=self.registry)
        for outcome in ("passed", "held", "timed_out"):
            self.requests.labels(outcome)
        self.counts = {"passed": 0, "held": 0, "timed_out": 0, "holding": 0}

    async def close(self) -> None:
        await self.client.aclose()

    async def handle(self, path: str, request: Request) -> Response:
        raw = await request.body()
        try:
            model = json.loads(raw).get("model")
        except (ValueError, AttributeError):
            model = None
        headers = {k: v for k, v in request.headers.items() if k.lower() in PASSED_HEADERS}
        deadline = time.monotonic() + self.hold_timeout_s
        held = False
        try:
            while True:
                upstream = self.client.build_request(request.method, f"{self.frontend_url}{path}", content=raw,
                                                     headers=headers)
                try:
                    resp = await self.client.send(upstream, stream=True)
                except (httpx.ConnectError, httpx.RemoteProtocolError):
                    resp = None  # the frontend restarting: as good as no worker
                if resp is not None and (resp.status_code not in NO_WORKER or model not in self.models):
                    break
                if resp is not None:
                    await resp.aclose()
                if not held:
                    held = True
                    self._count("held")
                    self.held.inc()
                    self.counts["holding"] += 1
                    log.info("holding a request for %s: the frontend has no worker for it", model)
                if time.monotonic() > deadline:
                    self._count("timed_out")
                    return JSONResponse({"error": "no_worker", "message": f"model {model!r}: no worker within "
                                         f"hold_timeout_s {self.hold_timeout_s:g} s"}, status_code=503)
                await asyncio.sleep(self.retry_s)
        finally:
            if held:
                self.held.dec()
                self.counts["holding"] -= 1
        if not held:
            self._count("passed")
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"), background=BackgroundTask(resp.aclose))

    def _count(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()
        self.counts[outcome] += 1


def _completion(waker: Waker, path: str):
    async def completion(request: Request) -> Response:
        return await waker.handle(path, request)
    return completion


def build_app(waker: Waker) -> FastAPI:
    app = FastAPI(title="sla-planner waker", docs_url=None, redoc_url=None)
    for path in ("/v1/completions", "/v1/chat/completions"):
        app.add_api_route(path, _completion(waker, path), methods=["POST"])

    @app.get("/v1/models")
    async def models():
        resp = await waker.client.get(f"{waker.frontend_url}/v1/models")
        return Response(resp.content, status_code=resp.status_code, media_type="application/json")

    @app.get("/healthz")
    async def healthz():
        return waker.counts

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(waker.registry), media_type=CONTENT_TYPE_LATEST)

    @app.on_event("shutdown")
    async def shutdown():
        await waker.close()

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m executor.waker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontend-url", required=True, help="the Dynamo frontend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", action="append", required=True, help="a served model name to hold requests "
                        "for (repeat for several)")
    parser.add_argument("--hold-timeout-s", type=float, default=600.0, help="answer 503 after holding this long, s")
    parser.add_argument("--retry-s", type=float, default=0.25, help="send a held request again this often, s")
    args = parser.parse_args(argv)
    if not (args.hold_timeout_s > 0 and args.retry_s > 0):
        parser.error(f"--hold-timeout-s and --retry-s must be > 0, got {args.hold_timeout_s:g} and {args.retry_s:g}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s waker: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    waker = Waker(frontend_url=args.frontend_url, models=tuple(args.model), hold_timeout_s=args.hold_timeout_s,
                  retry_s=args.retry_s)
    uvicorn.run(build_app(waker), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
