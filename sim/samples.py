"""Training samples from the simulator: what the routing service records for a replayed trace.

A replay runs with a `RecordingRouter` that remembers where each request went.
The finished requests are then turned into the routing service's request
lifecycle calls, in time order, as the simulated fleet routed them: the
simulator picks a decode worker when prefill ends, as Dynamo's frontend does,
so by default `dispatched` at arrival names the prefill endpoint only and
`prefill_done` at the end of prefill names the decode endpoint (its TPOT
features are taken then); `decode_pick="at_dispatch"` names both at arrival
instead, as a router that picks both at once (llm-d's) would. Then
`first_token` with the observed TTFT, `completed` with the observed mean TPOT. Fed into a real
`routing.service.RoutingService` on the simulated clock (`record_samples`),
or over HTTP into a running one, they produce the service's own training
samples: features computed by its registry exactly as at serving time (from
lifecycle calls; no scraped engine metrics), observed latencies from the
simulator, in the sample store's format.

Observed latencies follow the simulator's definitions: TTFT = first token
(decode admission) - arrival; TPOT = (finish - first token) / (osl - 1), only
for requests with more than one output token. A request with osl <= 1 never
reaches a decode worker: it is dispatched to its prefill endpoint alone.
The simulator has no prefix cache, so prefix_cache_hit_frac is 0.
"""

from __future__ import annotations

import math
import warnings
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from sim.config import SimConfig
from sim.fleet import DecodeWorker, PrefillWorker
from sim.routing import Router
from workloads.traces import Trace

EventKind = Literal["dispatched", "prefill_done", "first_token", "completed"]
DecodePick = Literal["after_prefill", "at_dispatch"]
# Tie order at one instant: a request is dispatched before its prefill returns,
# which comes before its first token and its completion (a one-token request
# has both at once).
_KIND_ORDER: dict[str, int] = {"dispatched": 0, "prefill_done": 1, "first_token": 2, "completed": 3}


class RecordingRouter:
    """Wraps a simulator router and remembers each request's prefill and decode worker."""

    def __init__(self, inner: Router, *, n_requests: int):
        self.inner = inner
        self.name = inner.name
        self.prefill_wid = array("q", [-1]) * n_requests
        self.decode_wid = array("q", [-1]) * n_requests

    def pick_prefill(self, rid: int, isl_tokens: int, workers: list[PrefillWorker]) -> PrefillWorker:
        w = self.inner.pick_prefill(rid, isl_tokens, workers)
        self.prefill_wid[rid] = w.wid
        return w

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers) -> DecodeWorker | None:
        w = self.inner.pick_decode(rid, isl_tokens, osl_tokens, source, workers)
        if w is not None:
            self.decode_wid[rid] = w.wid
        return w


@dataclass(frozen=True)
class RoutedRequests:
    """Finished requests of a replay with the workers that served them.

    Times in seconds of simulated time; prefill_wid / decode_wid index the
    simulator's worker lists (-1: none, e.g. no decode for osl <= 1).
    domains: topology domain ("zone/rack") per prefill and per decode worker id.
    """

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    isl_tokens: np.ndarray
    osl_tokens: np.ndarray
    prefill_wid: np.ndarray
    decode_wid: np.ndarray
    prefill_domains: tuple[str, ...]
    decode_domains: tuple[str, ...]
    prefill_done_s: np.ndarray | None = None  # when prefill returned (None: not recorded)
    join_wait_s: np.ndarray | None = None  # at decode admission, the wait for the step in progress (RequestResults)
    join_step_s: np.ndarray | None = None  # and that step's length

    def __len__(self) -> int:
        return len(self.arrival_s)


def simulate_routed(
    trace: Trace,
    *,
    profile_dir: str,
    policy: str = "planner",
    router: str = "least-loaded",
    ttft_ms: float = 200.0,
    itl_ms: float = 10.0,
    interval_s: float = 60.0,
    sim: SimConfig | None = None,
) -> RoutedRequests:
    """Replay `trace` under a scaling policy and return each request's outcome and workers.

    profile_dir: the Dynamo profiler folder the fleet (and a planner policy) uses.
    policy: a sim.policies name (planner, planner:<predictor>, static:<P>x<D>, ...).
    ttft_ms / itl_ms: the SLA the planner policies size for, ms.
    """
    from connectors.profiles import load_profile_dir
    from planner.latency.profile_checks import ProfileRangeWarning
    from sim.lookup import ProfileTables
    from sim.policies import default_planner_config, make_policy
    from sim.replay import ReplaySettings, replay
    from sim.routing import make_router

    profile = load_profile_dir(profile_dir)
    tables = ProfileTables(profile)
    cfg = default_planner_config(profile_dir=profile_dir, ttft_ms=ttft_ms, itl_ms=itl_ms, interval_s=interval_s)
    scenario = ReplaySettings(slo=cfg.slo, interval_s=interval_s, sim=sim or SimConfig(), router=router)
    rec = RecordingRouter(make_router(router), n_requests=len(trace))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        result = replay(trace, tables, make_policy(policy, cfg=cfg, profile=profile), scenario=scenario, router=rec)
    r = result.requests
    n_prefill = int(max(rec.prefill_wid, default=-1)) + 1
    n_decode = int(max(rec.decode_wid, default=-1)) + 1
    domains = scenario.sim.domains
    return RoutedRequests(
        arrival_s=r.arrival_s,
        first_token_s=r.first_token_s,
        finish_s=r.finish_s,
        isl_tokens=np.asarray(r.isl_tokens, dtype=np.int64),
        osl_tokens=np.asarray(r.osl_tokens, dtype=np.int64),
        prefill_wid=np.frombuffer(rec.prefill_wid, dtype=np.int64).copy(),
        decode_wid=np.frombuffer(rec.decode_wid, dtype=np.int64).copy(),
        prefill_domains=tuple(domains[i % len(domains)] for i in range(n_prefill)),
        decode_domains=tuple(domains[i % len(domains)] for i in range(n_decode)),
        prefill_done_s=r.prefill_done_s,
        join_wait_s=r.join_wait_s,
        join_step_s=r.join_step_s,
    )


@dataclass(frozen=True)
class LifecycleEvent:
    """One routing-service lifecycle call for a simulated request.

    t_s: when it happens, simulated seconds. For "dispatched": the endpoints and
    input_tokens; "first_token": observed_ttft_ms; "completed": output_tokens and
    observed_tpot_ms (None for a single output token).
    """

    t_s: float
    kind: EventKind
    request_id: str
    prefill_endpoint_id: str | None = None
    decode_endpoint_id: str | None = None
    input_tokens: int = 0
    observed_ttft_ms: float | None = None
    output_tokens: int = 0
    observed_tpot_ms: float | None = None


def endpoint_id(role: Literal["prefill", "decode"], wid: int) -> str:
    """The routing-service endpoint id of a simulated worker (its simulator name)."""
    return f"{role}-{wid}"


def endpoints(routed: RoutedRequests) -> list[dict]:
    """The endpoints to register: {"id", "role", "domains"} for every worker that served a request."""
    out = []
    for role, domains in (("prefill", routed.prefill_domains), ("decode", routed.decode_domains)):
        for wid, domain in enumerate(domains):
            zone, _, rack = domain.partition("/")
            out.append({"id": endpoint_id(role, wid), "role": role,
                        "domains": {"zone": zone, "rack": rack} if rack else {"zone": zone}})
    return out


def lifecycle_events(routed: RoutedRequests, *, decode_pick: DecodePick = "after_prefill") -> list[LifecycleEvent]:
    """All finished requests' lifecycle calls, in time order (see module docstring).

    decode_pick: "after_prefill" (the simulator's own routing, and Dynamo's:
    a prefill_done call names the decode endpoint; needs routed.prefill_done_s)
    or "at_dispatch" (both endpoints at dispatch, no prefill_done call).
    Requests that did not finish, or never got a prefill worker, are left out.
    """
    if decode_pick not in ("after_prefill", "at_dispatch"):
        raise ValueError(f"decode_pick must be 'after_prefill' or 'at_dispatch', got {decode_pick!r}")
    late = decode_pick == "after_prefill"
    if late and routed.prefill_done_s is None:
        raise ValueError("decode_pick='after_prefill' needs the requests' prefill_done_s (not recorded)")
    done = np.flatnonzero(np.isfinite(routed.finish_s) & np.isfinite(routed.first_token_s) & (routed.prefill_wid >= 0))
    ttft_ms = (routed.first_token_s - routed.arrival_s) * 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_ms = (routed.finish_s - routed.first_token_s) * 1e3 / np.maximum(routed.osl_tokens - 1, 1)
    keyed: list[tuple[float, int, int, LifecycleEvent]] = []
    for i in done.tolist():
        rid = f"r{i}"
        osl = int(routed.osl_tokens[i])
        dwid = int(routed.decode_wid[i])
        decode_id = endpoint_id("decode", dwid) if dwid >= 0 and osl > 1 else None
        t0, t1, t2 = float(routed.arrival_s[i]), float(routed.first_token_s[i]), float(routed.finish_s[i])
        keyed.append((t0, 0, i, LifecycleEvent(
            t0, "dispatched", rid, prefill_endpoint_id=endpoint_id("prefill", int(routed.prefill_wid[i])),
            decode_endpoint_id=None if late else decode_id, input_tokens=int(routed.isl_tokens[i]))))
        if late and decode_id is not None:
            tp = float(routed.prefill_done_s[i])
            keyed.append((tp, 1, i, LifecycleEvent(tp, "prefill_done", rid, decode_endpoint_id=decode_id)))
        keyed.append((t1, 2, i, LifecycleEvent(t1, "first_token", rid, observed_ttft_ms=float(ttft_ms[i]))))
        keyed.append((t2, 3, i, LifecycleEvent(
            t2, "completed", rid, output_tokens=osl,
            observed_tpot_ms=float(tpot_ms[i]) if decode_id is not None else None)))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [k[3] for k in keyed]


class LifecycleSink(Protocol):
    """Where lifecycle calls go: an in-process RoutingService or an HTTP client with the same calls."""

    def dispatched(self, event: LifecycleEvent) -> None: ...

    def prefill_done(self, event: LifecycleEvent) -> None: ...

    def first_token(self, event: LifecycleEvent) -> None: ...

    def completed(self, event: LifecycleEvent) -> None: ...


class ServiceSink:
    """Lifecycle calls into an in-process RoutingService whose clock is `now_s` (simulated time)."""

    def __init__(self, service):
        self.service = service
        self.now_s = 0.0

    def clock(self) -> float:
        return self.now_s

    def dispatched(self, event: LifecycleEvent) -> None:
        from routing.picking.picker import RouteRequest

        self.service.dispatched(
            RouteRequest(request_id=event.request_id, input_tokens=event.input_tokens),
            prefill_id=event.prefill_endpoint_id, decode_id=event.decode_endpoint_id,
        )

    def prefill_done(self, event: LifecycleEvent) -> None:
        self.service.prefill_done(event.request_id, decode_id=event.decode_endpoint_id)

    def first_token(self, event: LifecycleEvent) -> None:
        self.service.first_token(event.request_id, observed_ttft_ms=event.observed_ttft_ms)

    def completed(self, event: LifecycleEvent) -> None:
        self.service.completed(
            event.request_id, output_tokens=event.output_tokens, observed_tpot_ms=event.observed_tpot_ms
        )


class HttpSink:
    """Lifecycle calls to a running routing service over HTTP (its clock is the wall clock).

    client: an httpx.Client with the service's base_url. A refused call raises
    RuntimeError naming the request and the service's answer.
    """

    def __init__(self, client):
        self.client = client

    def register(self, endpoint: dict, *, token: str) -> None:
        """Register one endpoint from `endpoints()` (an admin call)."""
        body = {"role": endpoint["role"], "domains": endpoint["domains"]}
        self._post("PUT", f"/v1/endpoints/{endpoint['id']}", body, headers={"Authorization": f"Bearer {token}"})

    def dispatched(self, event: LifecycleEvent) -> None:
        self._post("POST", f"/v1/requests/{event.request_id}/dispatched", {
            "prefill_endpoint_id": event.prefill_endpoint_id, "decode_endpoint_id": event.decode_endpoint_id,
            "input_tokens": event.input_tokens})

    def prefill_done(self, event: LifecycleEvent) -> None:
        self._post("POST", f"/v1/requests/{event.request_id}/prefill_done",
                   {"decode_endpoint_id": event.decode_endpoint_id})

    def first_token(self, event: LifecycleEvent) -> None:
        self._post("POST", f"/v1/requests/{event.request_id}/first_token", {"observed_ttft_ms": event.observed_ttft_ms})

    def completed(self, event: LifecycleEvent) -> None:
        self._post("POST", f"/v1/requests/{event.request_id}/completed", {
            "output_tokens": event.output_tokens, "observed_tpot_ms": event.observed_tpot_ms})

    def _post(self, method: str, path: str, body: dict, headers: dict | None = None) -> None:
        resp = self.client.request(method, path, json=body, headers=headers)
        if resp.status_code >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")


def replay_events(events: list[LifecycleEvent], sink: LifecycleSink) -> Iterator[LifecycleEvent]:
    """Send each event to the sink in order (setting a ServiceSink's clock); yields each one sent."""
    for ev in events:
        if isinstance(sink, ServiceSink):
            sink.now_s = ev.t_s
        getattr(sink, ev.kind)(ev)
        yield ev


def record_samples(
    routed: RoutedRequests, *, profile_dir: str, profile=None, decode_pick: DecodePick = "after_prefill"
) -> list[dict]:
    """The training samples a routing service records for these requests, oldest first.

    Runs the lifecycle calls through a real RoutingService (its registry
    computes the features; the sample store is sized to keep every sample) on
    the simulated clock, so `recorded_at_s` is simulated seconds.
    profile_dir: the routing service's profile folder (its latency estimate);
    profile: that folder's EngineProfile when already loaded.
    decode_pick: when the decode endpoint is named (lifecycle_events).
    """
    from connectors.profiles import load_profile_dir
    from routing.config import RouterConfig
    from routing.fleet.registry import Endpoint
    from routing.service import RoutingService

    events = lifecycle_events(routed, decode_pick=decode_pick)
    capacity = max(1, 2 * sum(1 for e in events if e.kind == "completed"))
    config = RouterConfig(profile_dir=profile_dir, samples={"capacity": capacity})
    sink = ServiceSink(None)
    service = RoutingService(config, profile=profile or load_profile_dir(profile_dir), clock=sink.clock)
    sink.service = service
    for ep in endpoints(routed):
        service.register(Endpoint(id=ep["id"], role=ep["role"], domains=ep["domains"]))
    for _ in replay_events(events, sink):
        pass
    out: list[dict] = []
    after = 0
    while True:
        page = service.samples.page(after_seq=after, limit=10_000)
        out.extend(page.samples)
        after = page.next_after_seq
        if not page.has_more:
            return out


def samples_summary(samples: list[dict]) -> dict:
    """Counts and latency percentiles per target, for logs and benchmark output."""
    out = {}
    for target in ("ttft", "tpot"):
        y = np.array([s["observed_ms"] for s in samples if s["target"] == target], dtype=float)
        out[target] = {
            "count": int(y.size),
            "p50_ms": float(np.percentile(y, 50)) if y.size else math.nan,
            "p90_ms": float(np.percentile(y, 90)) if y.size else math.nan,
        }
    return out
