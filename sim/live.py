"""Live mode: the simulated fleet in wall-clock time, behind real interfaces.

`FleetSim` normally runs as fast as it can in virtual time. Here its clock
follows the wall clock (times `speed`), and it talks to the rest of the stack
the way a Dynamo deployment does:

- `/metrics` in Prometheus text: the series a Dynamo 1.6.1 frontend exports
  (requests_started_total at arrival, requests_total at completion, the TTFT /
  ITL / ISL / OSL histograms with its label sets and bucket boundaries), and per pod `vllm:kv_cache_usage_perc`,
  `vllm:num_requests_waiting` and `vllm:num_requests_running` (label `pod`,
  named `<prefix>prefill-N` / `<prefix>decode-N`, which the collector's
  default pod-name mapping attributes to the pools); `/status` as JSON.
- every request is routed by the routing service over HTTP (`/v1/route`),
  and its first token and completion are reported back as lifecycle events;
  workers register when ready and deregister when they start draining, and
  push their load to the router every second.
- the virtual connector's etcd keys: a new `decision_id` makes the fleet
  start or drain workers (new ones serve after the startup delay), and
  `scaled_decision_id` is written once every pool has reached its target.

Nothing is dropped: requests are sent as critical (the router takes the
least negative headroom instead of shedding; shed load would hide demand
from the planner), and when the router is unreachable or answers an error
the fleet routes the request itself (least loaded) and counts the fallback.

Speed: simulated seconds per wall second. Prometheus stamps samples with the
wall clock, so at speed k the planner sees k times the trace's request rate;
keep speed 1 for faithful sizing and compress the trace (`time_scale`) or
multiply its load to make things happen sooner.

Run: `python -m sim.live --config live.yaml` (a `LiveConfig` file).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.engine import FleetSim, SimConfig
from sim.fleet import DecodeWorker, PrefillWorker
from sim.lookup import ProfileTables
from sim.routing import LeastLoadedRouter
from sim.traces import Trace, load_trace, multiply_load, scale_time, time_window

log = logging.getLogger("sla_planner.sim.live")

# A Dynamo 1.6.1 frontend's histogram boundaries (its /metrics; tests check them against a real scrape).
TTFT_BUCKETS_S = (0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48, 100, 220, 480)
ITL_BUCKETS_S = (0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2, 2.3, 4.1,
                 7.4, 13, 24, 44, 80)
ISL_BUCKETS = (0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000)
OSL_BUCKETS = (0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000)
# The label values a real frontend gives a streamed chat completion.
REQUEST_LABELS = {"endpoint": "chat_completions", "request_type": "stream"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TraceSegment(_Strict):
    """One window of the source trace, replayed with its load multiplied."""

    duration_s: float = Field(gt=0, description="window length in trace time, s")
    load_multiplier: float = Field(1.0, gt=0, le=1000, description="copies of the window's requests superposed")


class TraceReplayConfig(_Strict):
    """Which requests to replay: a window or shape of a trace, its load multiplied, its time scaled."""

    trace_path: str = Field(description="Azure CSV or Mooncake JSONL trace, plain or gzip")
    trace_start_s: float = Field(0.0, ge=0, description="replay the trace from this offset, s")
    trace_duration_s: float | None = Field(None, gt=0, description="replay only this much of it, s; None: to the end")
    shape: list[TraceSegment] | None = Field(
        None, description="consecutive windows from trace_start_s, each with its own load multiplier "
        "(replaces trace_duration_s and load_multiplier)",
    )
    load_multiplier: float = Field(1.0, gt=0, le=1000, description="superpose this many copies of the trace")
    jitter_s: float = Field(
        1.0, ge=0, le=3600,
        description="each copy's requests shift by up to ± this, s: ~30 models independent tenants, "
        "1 synchronised copies (a stress case: every burst arrives k times at once)",
    )
    time_scale: float = Field(1.0, gt=0, description="stretch (>1) or compress (<1) the trace's time axis")
    seed: int = Field(0, description="seed of the load multiplier's offsets")

    @model_validator(mode="after")
    def _check(self) -> "TraceReplayConfig":
        if self.shape is not None and (self.trace_duration_s is not None or self.load_multiplier != 1.0):
            raise ValueError("shape replaces trace_duration_s and load_multiplier: set one or the other")
        return self


class LiveConfig(TraceReplayConfig):
    """Everything `python -m sim.live` needs (one YAML file)."""

    speed: float = Field(1.0, gt=0, le=1000, description="simulated seconds per wall second")
    profile_dir: str = Field(description="Dynamo profiler folder the simulated engines follow")
    startup_s: float = Field(60.0, ge=0, description="a new worker serves this long after it is added, simulated s")
    prefill_latency_scale: float = Field(
        1.0, gt=0, le=10, description="engines take this many times the profile's prefill time (drift from profiling)")
    decode_latency_scale: float = Field(
        1.0, gt=0, le=10, description="engines take this many times the profile's decode step time")
    initial_prefill: int = Field(1, ge=1, description="prefill workers before any decision")
    initial_decode: int = Field(1, ge=1, description="decode workers before any decision")
    host: str = Field("127.0.0.1", description="address of /metrics and /status")
    port: int = Field(8090, ge=1, le=65535, description="port of /metrics and /status")
    model: str = Field("llama-3.1-8b-instruct-fp8", min_length=1, description="`model` label of frontend metrics")
    pod_prefix: str = Field("sim-", description="prefix of pod names and router endpoint ids")
    namespace: str = Field("dynamo", min_length=1, description="Dynamo namespace of the virtual connector's keys")
    key_prefix: str = Field("v1/{namespace}/planner/", description="the decision keys' prefix (Dynamo 1.6.1's)")
    etcd_url: str | None = Field(None, description="follow the virtual connector's keys here; None: fixed fleet")
    etcd_poll_s: float = Field(0.5, gt=0, description="how often the etcd keys are read, wall s")
    router_url: str | None = Field(None, description="routing service base URL; None: route in-process")
    router_token_env: str = Field("SLA_ROUTER_TOKEN", min_length=1, description="env var with the router's admin token")
    router_data_token_env: str = Field(
        "SLA_ROUTER_DATA_TOKEN", min_length=1,
        description="env var with the router's data-plane token (routes, events, load pushes); unset: the admin token")
    router_timeout_s: float = Field(1.0, gt=0, description="timeout of one router call, wall s")
    router_retry_after_s: float = Field(1.0, gt=0, description="after a failed router call, route locally this long")
    metrics_push_s: float = Field(1.0, gt=0, description="push worker load to the router this often, wall s")
    slo_ttft_ms: float = Field(200.0, gt=0, description="TTFT SLO sent with every request, ms")
    slo_tpot_ms: float = Field(10.0, gt=0, description="TPOT SLO sent with every request, ms")
    tick_s: float = Field(0.02, gt=0, le=1, description="wall time between simulation steps, s")
    status_path: str | None = Field(None, description="write the final /status JSON here on exit")


def build_trace(cfg: TraceReplayConfig) -> Trace:
    """The request stream to replay: the configured window(s) of the trace, transformed."""
    source = load_trace(cfg.trace_path)
    if cfg.shape is not None:
        trace = shaped_trace(source, cfg.shape, start_s=cfg.trace_start_s, seed=cfg.seed, jitter_s=cfg.jitter_s)
    else:
        end_s = source.duration_s + 1.0 if cfg.trace_duration_s is None else cfg.trace_start_s + cfg.trace_duration_s
        trace = source if cfg.trace_start_s == 0 and cfg.trace_duration_s is None else time_window(
            source, cfg.trace_start_s, end_s)
        if cfg.load_multiplier != 1.0:
            trace = multiply_load(trace, cfg.load_multiplier, seed=cfg.seed, jitter_s=cfg.jitter_s)
    if cfg.time_scale != 1.0:
        trace = scale_time(trace, cfg.time_scale)
    if not len(trace):
        raise ValueError(f"{cfg.trace_path}: the configured window holds no requests")
    return trace


def shaped_trace(source: Trace, segments: list[TraceSegment], *, start_s: float, seed: int,
                 jitter_s: float = 1.0) -> Trace:
    """Consecutive windows of `source` from start_s, each with its load multiplied.

    Real requests keep their lengths and relative times; a multiplier of 4
    superposes four copies of that window, each request shifted by up to ±jitter_s, so a shape like
    [60 s x1, 90 s x4, 90 s x1] is a clear rise and fall of real traffic.
    Copies jittered past a window's end are dropped so segments do not overlap.
    """
    if not segments:
        raise ValueError("shape: give at least one segment")
    arrival, isl, osl = [], [], []
    offset_s = 0.0
    for i, seg in enumerate(segments):
        lo = start_s + offset_s
        window = time_window(source, lo, lo + seg.duration_s)
        if not len(window):
            raise ValueError(
                f"shape[{i}]: trace {source.name} has no requests in [{lo:g}, {lo + seg.duration_s:g}) s "
                f"(it lasts {source.duration_s:.0f} s)"
            )
        if seg.load_multiplier != 1.0:
            window = multiply_load(window, seg.load_multiplier, seed=seed + i, jitter_s=jitter_s)
        keep = window.arrival_s < seg.duration_s
        arrival.append(window.arrival_s[keep] + offset_s)
        isl.append(window.isl_tokens[keep])
        osl.append(window.osl_tokens[keep])
        offset_s += seg.duration_s
    desc = ",".join(f"{s.duration_s:g}sx{s.load_multiplier:g}" for s in segments)
    return Trace(
        name=f"{source.name}[{start_s:g}+shape {desc}]",
        arrival_s=np.concatenate(arrival),
        isl_tokens=np.concatenate(isl),
        osl_tokens=np.concatenate(osl),
    )


class DriftedTables(ProfileTables):
    """The profile's lookups, with engines slower (scale > 1) or faster than profiled.

    Production rarely matches the profiling run (other hardware revision, driver,
    interference); this is the drift the planner's correction factors and the
    retrained latency predictor exist for, made explicit.
    """

    def __init__(self, profile, *, prefill_scale: float, decode_scale: float):
        super().__init__(profile)
        self.prefill_scale = prefill_scale
        self.decode_scale = decode_scale

    def prefill_ms(self, tokens: int) -> float:
        return super().prefill_ms(tokens) * self.prefill_scale

    def itl_ms(self, kv_frac: float, context_tokens: float) -> float:
        return super().itl_ms(kv_frac, context_tokens) * self.decode_scale


def make_tables(cfg: LiveConfig) -> ProfileTables:
    from connectors.profiles import load_profile_dir

    profile = load_profile_dir(cfg.profile_dir)
    if cfg.prefill_latency_scale == 1.0 and cfg.decode_latency_scale == 1.0:
        return ProfileTables(profile)
    return DriftedTables(profile, prefill_scale=cfg.prefill_latency_scale, decode_scale=cfg.decode_latency_scale)


# -- the routing service over HTTP ---------------------------------------------


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

    def __init__(self, client: RouterClient, *, pod_prefix: str, slo_ttft_ms: float, slo_tpot_ms: float,
                 retry_after_s: float, max_kv_tokens: int, request_prefix: str, clock=time.monotonic):
        self.client = client
        self.pod_prefix = pod_prefix
        self.slo = {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms}
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
        """Register ready workers and remove the rest; False when the router is unreachable."""
        if self.sim is None:
            return True
        serving = {self.endpoint_id(w): w for w in (*self.sim.prefill_serving, *self.sim.decode_serving)}
        if serving.keys() == self.registered:
            return True
        try:
            for eid in sorted(self.registered - serving.keys()):
                resp = self.client.call("DELETE", f"/v1/endpoints/{eid}", admin=True)
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


# -- the virtual connector's keys ------------------------------------------------


class EtcdFollower:
    """The deployment environment's side of the virtual protocol: read targets, confirm."""

    def __init__(self, etcd_url: str, *, namespace: str, key_prefix: str = "v1/{namespace}/planner/",
                 timeout_s: float = 2.0):
        from etcd3gw.client import Etcd3Client

        from connectors.virtual import KEY_DECISION_ID, KEY_DECODE, KEY_PREFILL, KEY_SCALED_ID

        parts = urlsplit(etcd_url)
        self.url = etcd_url
        self.prefix = key_prefix.format(namespace=namespace)
        self.keys = (KEY_DECISION_ID, KEY_PREFILL, KEY_DECODE, KEY_SCALED_ID)
        self._client = Etcd3Client(host=parts.hostname or "127.0.0.1", port=parts.port or 2379,
                                   protocol=parts.scheme or "http", timeout=timeout_s)

    def read(self) -> dict[str, int]:
        """The stored integer keys that exist (decision_id, targets, scaled_decision_id)."""
        out: dict[str, int] = {}
        for value, meta in self._client.get_prefix(self.prefix):
            key = meta["key"].decode() if isinstance(meta["key"], bytes) else meta["key"]
            name = key[len(self.prefix):]
            if name in self.keys:
                try:
                    out[name] = int(value.decode())
                except ValueError:
                    raise ValueError(f"etcd {key}: expected an integer, got {value!r}") from None
        return out

    def confirm(self, decision_id: int) -> None:
        self._client.put(self.prefix + self.keys[3], str(decision_id))


# -- the live fleet ----------------------------------------------------------------


class LiveFleet:
    """A FleetSim stepped by the wall clock, with metrics, routing and the etcd protocol."""

    def __init__(self, cfg: LiveConfig, *, trace: Trace, tables: ProfileTables, clock=time.monotonic,
                 token: str | None = None, data_token: str | None = None):
        self.cfg = cfg
        self.trace = trace
        self.clock = clock
        self.lock = threading.RLock()
        self.follower = (EtcdFollower(cfg.etcd_url, namespace=cfg.namespace, key_prefix=cfg.key_prefix)
                         if cfg.etcd_url else None)
        self.applied_id: int | None = None  # newest decision the fleet follows
        self.confirmed_id: int | None = None  # newest decision written as scaled_decision_id
        self.decisions: list[dict] = []
        self.etcd_errors = 0
        self.etcd_last_error = ""
        self._confirm_failed_at = -math.inf
        prefill, decode = cfg.initial_prefill, cfg.initial_decode
        stored = self._read_etcd_at_start()
        if stored is not None and "decision_id" in stored:
            # The fleet was already running at the stored targets (a restart of this process).
            prefill, decode = stored.get("num_prefill_workers", prefill), stored.get("num_decode_workers", decode)
            self.applied_id = stored["decision_id"]
            self.confirmed_id = stored.get("scaled_decision_id")
        self.router: HttpRouter | None = None
        self.client: RouterClient | None = None
        if cfg.router_url:
            self.client = RouterClient(cfg.router_url, token=token, data_token=data_token,
                                       timeout_s=cfg.router_timeout_s)
            self.router = HttpRouter(
                self.client, pod_prefix=cfg.pod_prefix, slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms,
                retry_after_s=cfg.router_retry_after_s, max_kv_tokens=tables.max_kv_tokens,
                request_prefix=f"{cfg.pod_prefix}{os.getpid()}-{int(time.time())}-", clock=clock,
            )
        self.sim = FleetSim(trace, tables, config=SimConfig(startup_s=cfg.startup_s), router=self.router,
                            initial_prefill=max(prefill, 1), initial_decode=max(decode, 1))
        if self.router is not None:
            self.router.sim = self.sim
            self.router.forget_foreign_endpoints()
        self.registry = CollectorRegistry(auto_describe=True)
        self._frontend_metrics()
        self.registry.register(_PodCollector(self))
        self._open: dict[int, bool] = {}  # arrived, unfinished request -> first token reported
        self._seen_arrivals = 0
        self.wall0 = clock()
        self.unix0 = time.time()
        self.lag_s = 0.0
        self.started = False

    # -- clock ---------------------------------------------------------------

    def sim_time(self, wall_s: float | None = None) -> float:
        return ((self.clock() if wall_s is None else wall_s) - self.wall0) * self.cfg.speed

    @property
    def finished(self) -> bool:
        return self.sim.done

    # -- main loop -------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Step the simulation every tick until `stop` is set."""
        cfg = self.cfg
        next_etcd = next_push = self.clock()
        self.started = True
        while not stop.is_set():
            tick_start = self.clock()
            self.step(self.sim_time(tick_start))
            if self.follower is not None and tick_start >= next_etcd:
                self.follow_etcd()
                next_etcd = tick_start + cfg.etcd_poll_s
            if self.router is not None and tick_start >= next_push:
                with self.lock:
                    self.router.sync_endpoints()
                    self.router.push_load(self.sim.now_s)
                next_push = tick_start + cfg.metrics_push_s
            elapsed = self.clock() - tick_start
            self.lag_s = max(0.0, elapsed - cfg.tick_s)
            stop.wait(max(0.0, cfg.tick_s - elapsed))

    def step(self, t_s: float) -> None:
        """Advance to simulated time t_s and export what happened."""
        with self.lock:
            if t_s > self.sim.now_s:
                self.sim.run_until(t_s)
            self._export_requests()
            if self.clock() - self._confirm_failed_at >= self.cfg.etcd_poll_s:
                self._confirm_if_scaled()

    def _export_requests(self) -> None:
        sim = self.sim
        for rid in range(self._seen_arrivals, sim.next_arrival):
            self._started.inc()
            self._isl.observe(sim.isl[rid])
            self._open[rid] = False
        self._seen_arrivals = sim.next_arrival
        done = []
        for rid, reported in self._open.items():
            first = sim.first_token_s[rid]
            if not reported and first == first:
                ttft_s = first - sim.arrival_s[rid]
                self._ttft.observe(ttft_s)
                self._open[rid] = True
                self._event(rid, "first_token", {"observed_ttft_ms": ttft_s * 1e3})
            finish = sim.finish_s[rid]
            if finish == finish:
                done.append(rid)
        for rid in done:
            del self._open[rid]
            osl = int(sim.osl[rid])
            self._osl.observe(osl)
            ttft_s = sim.first_token_s[rid] - sim.arrival_s[rid]
            body = {"output_tokens": osl, "observed_ttft_ms": ttft_s * 1e3}
            if osl > 1:
                itl_s = (sim.finish_s[rid] - sim.first_token_s[rid]) / (osl - 1)
                self._itl.observe(itl_s)
                body["observed_tpot_ms"] = itl_s * 1e3
            self._completed.inc()
            self._finished.inc()
            self._event(rid, "completed", body)
            if self.router is not None:
                self.router.tracked.discard(rid)

    def _event(self, rid: int, kind: str, body: dict) -> None:
        if self.router is not None and rid in self.router.tracked:
            self.client.post_later("POST", f"/v1/requests/{self.router.request_prefix}{rid}/{kind}", body)

    # -- etcd --------------------------------------------------------------------

    def _read_etcd_at_start(self) -> dict | None:
        if self.follower is None:
            return None
        try:
            return self.follower.read()
        except Exception as exc:  # noqa: BLE001 - etcd down at start: follow it once it is up
            self._etcd_failed("reading the keys at start", exc)
            return None

    def follow_etcd(self) -> None:
        """Apply a new decision's targets; confirm the newest one once it is carried out."""
        try:
            stored = self.follower.read()
        except Exception as exc:  # noqa: BLE001 - any etcd failure: retry at the next poll
            self._etcd_failed("reading the keys", exc)
            return
        decision_id = stored.get("decision_id")
        with self.lock:
            if decision_id is not None and (self.applied_id is None or decision_id > self.applied_id):
                prefill, decode = stored.get("num_prefill_workers"), stored.get("num_decode_workers")
                if prefill is None or decode is None:
                    self._etcd_failed("reading the targets", ValueError(f"decision {decision_id} has no targets"))
                    return
                now = self.sim.now_s
                self.sim.set_target("prefill", prefill, now)
                self.sim.set_target("decode", decode, now)
                self.applied_id = decision_id
                self.decisions.append({"decision_id": decision_id, "prefill": prefill, "decode": decode,
                                       "seen_sim_s": now, "seen_unix_s": time.time(), "confirmed_unix_s": None})
                log.info("decision %d: prefill -> %d, decode -> %d (t=%.1f s)", decision_id, prefill, decode, now)
            self._confirm_if_scaled()

    def _confirm_if_scaled(self) -> None:
        """Write scaled_decision_id once both pools serve exactly their targets."""
        if self.follower is None or self.applied_id is None:
            return
        if self.confirmed_id is not None and self.confirmed_id >= self.applied_id:
            return
        sim = self.sim
        for pool in ("prefill", "decode"):
            live = sim.live_workers(pool)
            if any(not w.ready for w in live) or sim.ready_count(pool) != len(live):
                return
        try:
            self.follower.confirm(self.applied_id)
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            self._etcd_failed(f"writing scaled_decision_id {self.applied_id}", exc)
            self._confirm_failed_at = self.clock()
            return
        self.confirmed_id = self.applied_id
        for d in self.decisions:
            if d["confirmed_unix_s"] is None and d["decision_id"] <= self.applied_id:
                d["confirmed_unix_s"] = time.time()
                d["confirmed_sim_s"] = sim.now_s
        log.info("decision %d carried out (t=%.1f s)", self.applied_id, sim.now_s)

    def _etcd_failed(self, doing: str, exc: Exception) -> None:
        self.etcd_errors += 1
        message = f"etcd {self.cfg.etcd_url}: {doing}: {type(exc).__name__}: {exc}"
        if message != self.etcd_last_error:
            log.warning("%s", message)
        self.etcd_last_error = message

    # -- metrics and status --------------------------------------------------------

    def _frontend_metrics(self) -> None:
        """The series a Dynamo 1.6.1 frontend exports for the planner: names, label sets, buckets."""
        labels = {"model": self.cfg.model}
        reg = self.registry
        started = {**REQUEST_LABELS, **labels}
        self._started = Counter("dynamo_frontend_requests_started", "Total number of LLM requests accepted by the "
                                "frontend handler", sorted(started), registry=reg).labels(**started)
        finished = {**started, "status": "success", "error_type": ""}
        self._finished = Counter("dynamo_frontend_requests", "Total number of LLM requests processed",
                                 sorted(finished), registry=reg).labels(**finished)
        self._ttft = Histogram("dynamo_frontend_time_to_first_token_seconds", "Time to first token, s",
                               list(labels), buckets=TTFT_BUCKETS_S, registry=reg).labels(**labels)
        # One observation per request: its mean inter-token latency (what the simulator measures).
        self._itl = Histogram("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency, s",
                              list(labels), buckets=ITL_BUCKETS_S, registry=reg).labels(**labels)
        self._isl = Histogram("dynamo_frontend_input_sequence_tokens", "Input sequence length, tokens",
                              list(labels), buckets=ISL_BUCKETS, registry=reg).labels(**labels)
        self._osl = Histogram("dynamo_frontend_output_sequence_tokens", "Output sequence length, tokens",
                              list(labels), buckets=OSL_BUCKETS, registry=reg).labels(**labels)
        self._completed = Counter("sla_sim_requests_completed", "Requests finished by the simulated fleet",
                                  registry=reg)
        Gauge("sla_sim_time_seconds", "Simulated clock, s", registry=reg).set_function(lambda: self.sim.now_s)
        Gauge("sla_sim_requests_in_flight", "Requests arrived and not finished", registry=reg).set_function(
            lambda: len(self._open))
        Gauge("sla_sim_decision_id_applied", "Newest decision the fleet follows (-1: none)", registry=reg
              ).set_function(lambda: -1 if self.applied_id is None else self.applied_id)
        Gauge("sla_sim_decision_id_confirmed", "Newest decision written as scaled_decision_id (-1: none)",
              registry=reg).set_function(lambda: -1 if self.confirmed_id is None else self.confirmed_id)

    def status(self) -> dict:
        """What the fleet is doing, for people and tests (GET /status)."""
        with self.lock:
            sim = self.sim
            pools = {}
            for pool in ("prefill", "decode"):
                workers = sim.prefill_workers if pool == "prefill" else sim.decode_workers
                pools[pool] = {
                    "target": len(sim.live_workers(pool)),
                    "ready": sim.ready_count(pool),
                    "starting": sum(1 for w in workers if not w.ready and not w.retired),
                    "draining": sum(1 for w in workers if w.draining and not w.retired),
                }
            out = {
                "trace": {"name": self.trace.name, "requests": len(self.trace), "duration_s": self.trace.duration_s},
                "speed": self.cfg.speed,
                "started_unix_s": self.unix0,
                "sim_time_s": sim.now_s,
                "lag_s": self.lag_s,
                "arrived": sim.next_arrival,
                "completed": sim.completed,
                "in_flight": len(self._open),
                "finished": sim.done,
                "workers": pools,
                "decisions": {"applied": self.applied_id, "confirmed": self.confirmed_id, "log": list(self.decisions),
                              "etcd_errors": self.etcd_errors, "etcd_last_error": self.etcd_last_error},
            }
            if self.router is not None:
                r = self.router
                out["router"] = {"url": self.client.base_url, "routed": r.routed, "fallbacks": dict(r.fallbacks),
                                 "model_versions": dict(r.model_versions), "registered": sorted(r.registered),
                                 "events_sent": self.client.events_sent, "events_failed": self.client.events_failed,
                                 "last_error": r.last_error}
            return out

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class _PodCollector:
    """Per-pod vLLM gauges, read from the fleet at scrape time."""

    def __init__(self, fleet: LiveFleet):
        self.fleet = fleet

    def describe(self):
        return []

    def collect(self):
        fleet = self.fleet
        labels = ["pod", "model_name"]
        kv = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage, 0-1 (peak since the last scrape)",
                               labels=labels)
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting", labels=labels)
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests running", labels=labels)
        with fleet.lock:
            sim = fleet.sim
            running_by_name = {w.name: len(w.batch) for w in sim.prefill_serving}
            running_by_name.update({d.name: d.n for d in sim.decode_serving})
            # Prometheus is the one scraper: each scrape reports the peak since the previous one.
            for pod in sim.pod_metrics(sim.now_s):
                values = [fleet.cfg.pod_prefix + pod.pod, fleet.cfg.model]
                kv.add_metric(values, pod.kv_usage_frac)
                waiting.add_metric(values, pod.queue_length)
                running.add_metric(values, float(running_by_name.get(pod.pod, 0)))
        yield kv
        yield waiting
        yield running


class _Handler(BaseHTTPRequestHandler):
    fleet: LiveFleet

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.fleet.metrics_text(), CONTENT_TYPE_LATEST)
        elif path == "/status":
            self._send(200, json.dumps(self.fleet.status()).encode(), "application/json")
        elif path == "/healthz":
            ok = self.fleet.started
            self._send(200 if ok else 503, json.dumps({"status": "ok" if ok else "starting"}).encode(),
                       "application/json")
        else:
            self._send(404, b'{"error": "not_found"}', "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - quiet: Prometheus scrapes every second
        pass


def serve(fleet: LiveFleet) -> ThreadingHTTPServer:
    """/metrics, /status and /healthz on the configured address, in a daemon thread."""
    handler = type("Handler", (_Handler,), {"fleet": fleet})
    server = ThreadingHTTPServer((fleet.cfg.host, fleet.cfg.port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="live-http", daemon=True).start()
    return server


def load_config(path: str | Path) -> LiveConfig:
    from planner.config import parse_yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read live config: {exc.strerror}") from None
    return parse_yaml(text, LiveConfig, source=str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.live", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="LiveConfig YAML file")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per router call otherwise
    disable_created_metrics()  # a Dynamo frontend exports no _created series
    try:
        cfg = load_config(args.config)
        trace = build_trace(cfg)
        tables = make_tables(cfg)
    except (ValueError, OSError) as exc:
        print(f"sim.live: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get(cfg.router_token_env) or None
    if cfg.router_url and not token:
        print(f"sim.live: set ${cfg.router_token_env}: registering endpoints needs the router's admin token",
              file=sys.stderr)
        return 2
    data_token = os.environ.get(cfg.router_data_token_env) or None
    fleet = LiveFleet(cfg, trace=trace, tables=tables, token=token, data_token=data_token)
    server = serve(fleet)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("replaying %s (%d requests over %.0f s) at speed %g; metrics on http://%s:%d/metrics",
             trace.name, len(trace), trace.duration_s, cfg.speed, cfg.host, cfg.port)
    try:
        fleet.run(stop)
    finally:
        status = fleet.status()
        if cfg.status_path:
            Path(cfg.status_path).write_text(json.dumps(status, indent=1))
        server.shutdown()
        fleet.close()
        log.info("stopped at t=%.1f s: %d arrived, %d completed", status["sim_time_s"], status["arrived"],
                 status["completed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
