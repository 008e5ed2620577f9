"""The front door of a local engine fleet: OpenAI requests routed by the routing service, proxied to the engine.

For engines that have no Dynamo frontend in front of them (plain vLLM servers
the executor starts), each `/v1/completions` or `/v1/chat/completions` call:

1. asks the routing service for an engine (`POST /v1/route` with the prompt's
   length and the SLOs, `critical`: never shed, so a client is never refused);
2. forwards the body unchanged to that engine's URL, streaming the answer back
   as it comes;
3. tells the router how it went: the first token (measured TTFT) and the
   completion (output tokens, measured mean TPOT), which become the router's
   training samples; a request the engine failed is completed with the tokens
   it got, so the router's in-flight count stays true.

The prompt's length at routing time is its word count (the local stack's
tokenizer spends about one token per word; llm-d's endpoint picker also
routes on an estimate before the engine tokenizes). Streaming answers are
timed per chunk; a non-streaming answer yields no TTFT sample (its first byte
is its last), only the completion.

Run: `python -m executor.gateway --router-url URL --port P --ttft-ms T --itl-ms I`
(the router's data-plane token from $SLA_ROUTER_DATA_TOKEN when set).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
import uuid

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger("sla_planner.gateway")


def prompt_words(body: dict) -> int:
    """Words in a completions prompt or a chat request's messages (the routing estimate of its tokens)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    if isinstance(prompt, str):
        return len(prompt.split())
    words = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += len(content.split())
    return words


class Timing:
    """What one proxied answer showed: when its first token came and how many tokens it carried."""

    def __init__(self, start_s: float):
        self.start_s = start_s
        self.first_s: float | None = None
        self.end_s: float | None = None
        self.chunks = 0
        self.usage_tokens: int | None = None

    def saw_chunk(self, data: dict, now_s: float) -> None:
        for choice in data.get("choices") or ():
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                self.chunks += 1
                if self.first_s is None:
                    self.first_s = now_s
        usage = data.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    def tpot_ms(self) -> float | None:
        n = self.output_tokens
        if self.first_s is None or self.end_s is None or n < 2:
            return None
        return 1000.0 * (self.end_s - self.first_s) / (n - 1)


class Gateway:
    """Routes through the routing service, proxies to the picked engine, reports to the router."""

    def __init__(self, *, router_url: str, ttft_ms: float, itl_ms: float, token: str | None,
                 timeout_s: float = 300.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Every request in flight holds an engine connection and, at its start and end, a router one.
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256)
        self.router = httpx.AsyncClient(base_url=router_url.rstrip("/"), headers=headers, limits=limits,
                                        timeout=httpx.Timeout(30.0, connect=10.0))
        self.engines = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.slo = {"ttft_ms": ttft_ms, "itl_ms": itl_ms}
        self.counts = {"routed": 0, "failed": 0, "completed": 0}
        self._pending: dict[str, asyncio.Task] = {}

    async def close(self) -> None:
        await self.router.aclose()
        await self.engines.aclose()

    async def handle(self, path: str, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return JSONResponse({"error": "bad_request", "message": "body: not JSON"}, status_code=400)
        rid = f"gw-{uuid.uuid4().hex[:16]}"
        ask = {"request_id": rid, "input_tokens": prompt_words(body), "slo": self.slo, "critical": True}
        try:
            try:
                route = await self.router.post("/v1/route", json=ask)
            except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError):
                # The routing service closed a kept-alive connection as it was reused (seen once in ~600 requests
                # at a peak): asked once more on a fresh connection, under the same request id, so a route the first
                # call did make is refused as a duplicate, never counted twice.
                route = await self.router.post("/v1/route", json=ask)
        except httpx.HTTPError as exc:
            self.counts["failed"] += 1
            return JSONResponse({"error": "no_route", "message": f"routing service: {type(exc).__name__}: {exc}"},
                                status_code=503)
        if route.status_code != 200:
            self.counts["failed"] += 1
            return JSONResponse({"error": "no_route", "message": f"routing service answered HTTP "
                                 f"{route.status_code}: {route.text[:300]}"}, status_code=503)
        choice = route.json().get("decode") or route.json().get("prefill")
        self.counts["routed"] += 1
        timing = Timing(time.monotonic())
        upstream = self.engines.build_request("POST", f"{choice['url'].rstrip('/')}{path}", content=raw,
                                              headers={"Content-Type": "application/json"})
        try:
            try:
                resp = await self.engines.send(upstream, stream=True)
            except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError):
                # The engine closed a kept-alive connection as it was reused, before reading the request: the
                # request never ran there, so it is sent once more on a fresh connection.
                resp = await self.engines.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            self.counts["failed"] += 1
            await self._completed(rid, timing)
            return JSONResponse({"error": "engine_unreachable",
                                 "message": f"{choice['endpoint_id']}: {type(exc).__name__}: {exc}"},
                                status_code=502)
        if not body.get("stream"):
            content = await resp.aread()
            await resp.aclose()
            timing.end_s = time.monotonic()
            try:
                timing.usage_tokens = int(json.loads(content)["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError):
                pass
            await self._completed(rid, timing)
            return Response(content, status_code=resp.status_code, media_type="application/json")
        return StreamingResponse(self._relay(rid, resp, timing), status_code=resp.status_code,
                                 media_type="text/event-stream")

    async def _relay(self, rid: str, resp: httpx.Response, timing: Timing):
        reported_first, buffer = False, b""
        try:
            # Bytes pass through unchanged; events are read from whole lines split on newlines only (a token's
            # text may hold U+2028, which str.splitlines, and so aiter_lines, also splits on).
            async for chunk in resp.aiter_raw():
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        try:
                            timing.saw_chunk(json.loads(line[6:]), time.monotonic())
                        except ValueError:
                            pass
                if timing.first_s is not None and not reported_first:
                    reported_first = True
                    self._later("first_token", rid, observed_ttft_ms=1000.0 * (timing.first_s - timing.start_s))
                yield chunk
        finally:
            await resp.aclose()
            timing.end_s = time.monotonic()
            await self._completed(rid, timing)

    async def _completed(self, rid: str, timing: Timing) -> None:
        self.counts["completed"] += 1
        fields = {"output_tokens": timing.output_tokens}
        if timing.tpot_ms() is not None:
            fields["observed_tpot_ms"] = timing.tpot_ms()
        self._later("completed", rid, **fields)

    def _later(self, event: str, rid: str, **fields) -> None:
        """Send a lifecycle event without holding up the answer; a request's events go in order."""
        before = self._pending.get(rid)
        task = asyncio.get_running_loop().create_task(self._send(event, rid, fields, after=before))
        self._pending[rid] = task
        task.add_done_callback(lambda t: self._pending.pop(rid, None) if self._pending.get(rid) is t else None)

    async def _send(self, event: str, rid: str, fields: dict, *, after: asyncio.Task | None) -> None:
        if after is not None:
            await asyncio.wait([after])
        try:
            resp = await self.router.post(f"/v1/requests/{rid}/{event}", json=fields)
            measured = [k for k in fields if k.startswith("observed_")]
            if resp.status_code == 422 and measured:
                # A latency the router refuses (a TPOT below its floor: the stream's chunks reached this process
                # bunched up while its loop was busy): the event still counts, timed by the router's clock.
                log.warning("router %s %s: %s; sent again without %s", event, rid, resp.text[:200], measured)
                resp = await self.router.post(f"/v1/requests/{rid}/{event}",
                                              json={k: v for k, v in fields.items() if k not in measured})
            if resp.status_code >= 300:
                log.warning("router %s %s: HTTP %d %s", event, rid, resp.status_code, resp.text[:200])
        except httpx.HTTPError as exc:
            log.warning("router %s %s: %s: %s", event, rid, type(exc).__name__, exc)


def build_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="sla-planner gateway", docs_url=None, redoc_url=None)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await gateway.handle("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await gateway.handle("/v1/chat/completions", request)

    @app.get("/healthz")
    async def healthz():
        return gateway.counts

    @app.get("/v1/models")
    async def models():
        """The models of the first engine the router knows (every engine serves the same one)."""
        listed = await gateway.router.get("/v1/endpoints")
        for endpoint in listed.json() if listed.status_code == 200 else ():
            if endpoint.get("url") and not endpoint.get("draining"):
                resp = await gateway.engines.get(f"{endpoint['url'].rstrip('/')}/v1/models")
                return Response(resp.content, status_code=resp.status_code, media_type="application/json")
        return JSONResponse({"object": "list", "data": []})

    @app.on_event("shutdown")
    async def shutdown():
        await gateway.close()

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m executor.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--router-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, required=True, help="TTFT target sent with every route call, ms")
    parser.add_argument("--itl-ms", type=float, required=True, help="ITL target sent with every route call, ms")
    parser.add_argument("--data-token-env", default="SLA_ROUTER_DATA_TOKEN")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s gateway: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per proxied call otherwise
    gateway = Gateway(router_url=args.router_url, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
                      token=os.environ.get(args.data_token_env))
    uvicorn.run(build_app(gateway), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
