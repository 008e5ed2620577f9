"""The routing service, called over HTTP, as the simulated fleet's router."""

from __future__ import annotations

import math
import queue
import threading
import time

import httpx

from sim.engine import FleetSim
from sim.fleet import DecodeWorker, PrefillWorker
from sim.routing import LeastLoadedRouter


class RouterClient:
    """Calls to the routing service: routes and registrations now, events in the background.

    Lifecycle events and load pushes go through a queue to one sender thread,
    so the simulation never waits for them; a route call is synchronous
    because the fleet needs its answer. Data-plane calls carry `data_token`
    (the admin token when None), registrations the admin `token`.
    """

    def __init__(self, base_url: str, *, token: str | None, timeout_s: float, data_token: str | None = None):
        self.base_url = base_url.rstrip("/")
        data_token = data_token or token
        self._admin_headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers = {"Authorization": f"Bearer {data_token}"} if data_token else {}
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)
        self._events_client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)
        self._queue: queue.Queue = queue.Queue()
        self.events_sent = 0
        self.events_failed = 0
        self._thread = threading.Thread(target=self._send_events, name="router-events", daemon=True)
        self._thread.start()

    def call(self, method: str, path: str, body: dict | None = None, *, admin: bool = False) -> httpx.Response:
        """One request now (admin: with the admin token); raises httpx.HTTPError when the router cannot be reached."""
        return self._client.request(method, path, json=body, headers=self._admin_headers if admin else None)

    def post_later(self, method: str, path: str, body: dict) -> None:
        self._queue.put((method, path, body))

    def _send_events(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            method, path, body = item
            try:
                resp = self._events_client.request(method, path, json=body)
                ok = resp.status_code < 300
            except httpx.HTTPError:
                ok = False
            if ok:
                self.events_sent += 1
            else:
                # A 404 after a router restart (it forgot the request) or the router down:
                # the event is lost to the router's bookkeeping, never to the fleet.
                self.events_failed += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._client.close()
        self._events_client.close()


class HttpRouter:
    """A `sim.routing.Router` that asks the routing service where each request goes.

    The decode endpoint comes with the route answer at arrival; it is used at
    prefill completion if it still serves. Ready workers are registered (and
    draining ones removed) before each pick, so the router's fleet is the
    simulator's. Any failure routes locally with `fallback` and is counted by
    reason; after a connection failure the router is left alone for
    `retry_after_s` and every worker is registered again (it may have restarted).
    """

    name = "routing-service"

    def __init__(self, client: RouterClient, *, pod_prefix: str, ttft_ms: float, itl_ms: float,
                 retry_after_s: float, max_kv_tokens: int, request_prefix: str, clock=time.monotonic):
        self.client = client
        self.pod_prefix = pod_prefix
        self.slo = {"ttft_ms": ttft_ms, "itl_ms": itl_ms}
        self.retry_after_s = retry_after_s
        self.max_kv_tokens = max_kv_tokens
        self.request_prefix = request_prefix
        self.clock = clock
        self.fallback = LeastLoadedRouter()
        self.sim: FleetSim | None = None
        self.registered: set[str] = set()
        self.tracked: set[int] = set()  # request ids the router knows about
        self.routed = 0
        self.fallbacks: dict[str, int] = {}
        self.model_versions: dict[str, int] = {}
        self.last_error = ""
        self._decode_choice: dict[int, str] = {}
        self._down_until = -math.inf

    # -- Router protocol -----------------------------------------------------

    def pick_prefill(self, rid: int, isl_tokens: int, workers: list[PrefillWorker]) -> PrefillWorker:
        if self.clock() < self._down_until:
            return self._fall_back("router unavailable", rid, isl_tokens, workers)
        answer = None
        for attempt in range(2):
            if not self.sync_endpoints():
                return self._fall_back("router unavailable", rid, isl_tokens, workers)
            answer = self._route(rid, isl_tokens)
            # A router that lost its endpoints (restarted) answers no_endpoint: register, ask again.
            if answer == "no_endpoint" and attempt == 0:
                self.registered.clear()
                continue
            break
        if not isinstance(answer, dict):
            return self._fall_back(answer or "router error", rid, isl_tokens, workers)
        by_name = {w.name: w for w in workers}
        prefill = by_name.get(self.endpoint_to_pod((answer.get("prefill") or {}).get("endpoint_id", "")))
        if prefill is None:
            return self._fall_back("router chose an endpoint that is not serving", rid, isl_tokens, workers)
        self.routed += 1
        self.tracked.add(rid)
        version = answer.get("model_version") or "profile-estimate"
        self.model_versions[version] = self.model_versions.get(version, 0) + 1
        decode = (answer.get("decode") or {}).get("endpoint_id")
        if decode:
            self._decode_choice[rid] = self.endpoint_to_pod(decode)
        return prefill

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers: list[DecodeWorker]):
        name = self._decode_choice.pop(rid, None)
        if name is not None:
            for w in workers:
                if w.name == name:
                    return w
        return self.fallback.pick_decode(rid, isl_tokens, osl_tokens, source, workers)

    # -- endpoints -------------------------------------------------------------

    def endpoint_id(self, worker) -> str:
        return self.pod_prefix + worker.name

    def endpoint_to_pod(self, endpoint_id: str) -> str:
        return endpoint_id[len(self.pod_prefix):] if endpoint_id.startswith(self.pod_prefix) else ""

    def sync_endpoints(self) -> bool:
        """Register ready workers and drain the rest; False when the router is unreachable."""
        if self.sim is None:
            return True
        serving = {self.endpoint_id(w): w for w in (*self.sim.prefill_serving, *self.sim.decode_serving)}
        if serving.keys() == self.registered:
            return True
        try:
            for eid in sorted(self.registered - serving.keys()):  # drained: its requests still report there
                resp = self.client.call("DELETE", f"/v1/endpoints/{eid}?drain=true", admin=True)
                if resp.status_code not in (200, 404):
                    raise RuntimeError(f"DELETE /v1/endpoints/{eid}: HTTP {resp.status_code}: {resp.text[:200]}")
                self.registered.discard(eid)
            for eid in sorted(serving.keys() - self.registered):
                w = serving[eid]
                zone, _, rack = w.domain.partition("/")
                body = {"role": "prefill" if isinstance(w, PrefillWorker) else "decode",
                        "domains": {"zone": zone, "rack": rack or zone}, "max_kv_tokens": self.max_kv_tokens,
                        "gpus": w.gpus}
                resp = self.client.call("PUT", f"/v1/endpoints/{eid}", body, admin=True)
                if resp.status_code >= 300:
                    raise RuntimeError(f"PUT /v1/endpoints/{eid}: HTTP {resp.status_code}: {resp.text[:200]}")
                self.registered.add(eid)
        except (httpx.HTTPError, RuntimeError) as exc:
            self._unavailable(f"registering endpoints: {exc}")
            return False
        return True

    def forget_foreign_endpoints(self) -> None:
        """At start: remove endpoints a previous run of the fleet left registered."""
        try:
            resp = self.client.call("GET", "/v1/endpoints")
            resp.raise_for_status()
            for ep in resp.json():
                if ep["id"].startswith(self.pod_prefix):
                    self.client.call("DELETE", f"/v1/endpoints/{ep['id']}", admin=True)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self._unavailable(f"listing endpoints: {exc}")

    def push_load(self, t_s: float) -> None:
        """Each registered worker's KV usage, waiting and running requests, as vLLM reports them."""
        if self.sim is None or self.clock() < self._down_until:
            return
        cap = float(self.max_kv_tokens)
        for w in self.sim.prefill_serving:
            self._push(w, min(w.batch_tokens / cap, 1.0), len(w.queue), len(w.batch))
        for d in self.sim.decode_serving:
            self._push(d, min(d.kv_tokens_at(t_s) / cap, 1.0), len(d.pending), d.n)

    def _push(self, w, kv_frac: float, waiting: int, running: int) -> None:
        eid = self.endpoint_id(w)
        if eid in self.registered:
            self.client.post_later("PUT", f"/v1/endpoints/{eid}/metrics", {
                "kv_usage_frac": kv_frac, "waiting_requests": float(waiting), "running_requests": float(running)})

    # -- internals -------------------------------------------------------------

    def _route(self, rid: int, isl_tokens: int):
        body = {"request_id": f"{self.request_prefix}{rid}", "input_tokens": int(isl_tokens),
                "slo": self.slo, "critical": True}
        try:
            resp = self.client.call("POST", "/v1/route", body)
        except httpx.HTTPError as exc:
            self._unavailable(f"POST /v1/route: {type(exc).__name__}: {exc}")
            return "router unavailable"
        if resp.status_code == 200:
            return resp.json()
        try:
            code = resp.json().get("error", "")
        except ValueError:
            code = ""
        self.last_error = f"POST /v1/route: HTTP {resp.status_code}: {resp.text[:200]}"
        return code or f"HTTP {resp.status_code}"

    def _unavailable(self, message: str) -> None:
        self.last_error = message
        self._down_until = self.clock() + self.retry_after_s
        self.registered.clear()

    def _fall_back(self, reason: str, rid: int, isl_tokens: int, workers):
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        self._decode_choice.pop(rid, None)
        return self.fallback.pick_prefill(rid, isl_tokens, workers)
