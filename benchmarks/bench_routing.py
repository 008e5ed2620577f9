"""Routing service speed: in-process pick latency and HTTP /v1/route under load.

1. In-process `Picker.pick` for fleets of 10 / 100 / 1000 endpoints (half
   prefill, half decode, in 3 zones x 2 racks; SLO routing on, topology level
   zone with soft scoring), in steady state: every routed request is
   dispatched and the oldest completes, so about 4 requests are in flight per
   endpoint. Timed with two latency models: the profile-derived estimate
   (measured Dynamo H200 Llama-3.1-8B profile) and a published
   HistGradientBoosting model (300 trees of <= 31 leaves per target, mean and
   p90, as the retrain flow's defaults allow at most; trained here on samples
   the router recorded). Requests are critical, so none is shed and every pick
   runs both stages. Only the pick is timed (not dispatch bookkeeping).
   Wall-clock percentiles include preemption by other processes on this shared
   machine; the thread-CPU-time percentiles show the picker's own cost.
2. HTTP: `sla-planner router` in its own process (uvicorn, one worker) with
   100 endpoints and the published model, its data plane authenticated
   (every call carries the data token, as a gateway's would); a separate load-generator process
   sends POST /v1/route (critical requests: routed, never shed) open-loop at
   a fixed rate (keep-alive connections) and, for every routed request, a
   `completed` event 0.2-1.5 s later, batched every 50 ms into
   POST /v1/requests/events as a gateway would (load stays in steady state). Route latency
   is measured from the scheduled send time (no coordinated omission) and
   from the actual send. Recorded beside it: the server's CPU per call and
   per routed request (from /proc), the load generator's own CPU per request
   (it shares the machine), and the machine's load average.
3. The same route + batched-completion calls made in-process on the ASGI app
   (no server, no sockets), CPU time over the batch, and once more on the
   service object alone: the differences are the HTTP layer's share. The
   server's CPU for calls that do no routing (404s) gives the HTTP floor, and
   the in-process calls with 1 ms of idle between them what waking up costs.

Writes benchmarks/results/routing.json and prints a markdown table.
Run: .venv/bin/python benchmarks/bench_routing.py [--http-seconds 60] [--http-rps 500]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE_DIR = ROOT.parent / "shared" / "data" / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
OUT = ROOT / "benchmarks" / "results" / "routing.json"
TOKEN = "bench-token-not-secret"
# The data plane's token: every route, event and probe call carries it, as a gateway's would.
DATA_TOKEN = "bench-data-token-not-secret"
QOS = {
    "none": {"latency_ms": 5.0, "bandwidth_gbyte_per_s": 10.0},
    "zone": {"latency_ms": 1.0, "bandwidth_gbyte_per_s": 25.0},
    "rack": {"latency_ms": 0.2, "bandwidth_gbyte_per_s": 50.0},
    "host": {"latency_ms": 0.0, "bandwidth_gbyte_per_s": 400.0},
}
PICKER = {
    "slo": {"strategy": "least", "exploration_frac": 0.01},
    "topology": {"level": "zone", "policy": "fallback", "qos": QOS, "kv_bytes_per_token": 131072},
}
SLO = {"ttft_ms": 400.0, "itl_ms": 30.0}


def fleet_specs(n: int) -> list[tuple[str, str, dict]]:
    out = []
    for i in range(n):
        role = "prefill" if i % 2 == 0 else "decode"
        zone = f"z{(i // 2) % 3}"
        out.append((f"{role[0]}{i}", role, {"zone": zone, "rack": f"{zone}-r{(i // 6) % 2}"}))
    return out


def make_registry(n: int, profile):
    from routing.fleet.registry import Endpoint, EndpointRegistry

    reg = EndpointRegistry(default_max_kv_tokens=profile.decode.max_kv_tokens)
    for eid, role, domains in fleet_specs(n):
        reg.register(Endpoint(id=eid, role=role, domains=domains))
    return reg


def request_stream(seed: int, *, critical: bool = False):
    from routing.picking.picker import RouteRequest

    rng = np.random.default_rng(seed)
    k = 0
    while True:
        isl = int(min(rng.lognormal(7.0, 0.8), 16000))
        yield RouteRequest(request_id=f"r{k}", input_tokens=isl, ttft_ms=SLO["ttft_ms"],
                           itl_ms=SLO["itl_ms"], prefix_cache_hit_frac=float(rng.uniform(0, 0.5)),
                           critical=critical)
        k += 1


def collect_samples(profile, *, n_requests: int, seed: int) -> list:
    """Route requests through the picker (profile estimate) and record noisy observed latencies."""
    from routing.config import PickerConfig
    from routing.picking.picker import Picker, dispatch_record
    from routing.models.predictor import LatencyPredictor, ProfileEstimator
    from routing.samples.store import SampleStore

    rng = np.random.default_rng(seed)
    reg = make_registry(100, profile)
    picker = Picker(PickerConfig.model_validate(PICKER), LatencyPredictor(estimate=ProfileEstimator(profile)), rng=seed)
    store = SampleStore(capacity=n_requests * 2)
    in_flight: list[str] = []
    stream = request_stream(seed)
    now = 0.0
    for _ in range(n_requests):
        now += rng.exponential(0.01)
        req = next(stream)
        result = picker.pick(req, reg, now)
        if result.routed:
            reg.dispatched(dispatch_record(req, result, now_s=now))
            in_flight.append(req.request_id)
        # A varying in-flight window gives samples across load levels.
        target = int(200 + 180 * np.sin(now / 5.0))
        while len(in_flight) > max(target, 1):
            rid = in_flight.pop(0)
            rec = reg.in_flight(rid)
            noise = rng.lognormal(0.0, 0.15, 2)
            for s in reg.completed(rid, now_s=now, output_tokens=int(rng.integers(2, 400)),
                                   observed_ttft_ms=(rec.predicted_ttft_ms or 1.0) * noise[0],
                                   observed_tpot_ms=(rec.predicted_tpot_ms or 1.0) * noise[1]):
                store.add(s)
    return store.page(limit=10 * n_requests).samples


def train_document(samples: list, *, version: str, max_iter: int) -> tuple[dict, float]:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    from routing.features import features_from_samples
    from routing.training.export import export_hist_gradient_boosting, model_document

    t0 = time.perf_counter()
    regs = {}
    for target in ("ttft", "tpot"):
        rows = [{**s["features"], "role": s["role"]} for s in samples if s["target"] == target]
        y = np.array([s["observed_ms"] for s in samples if s["target"] == target])
        x = features_from_samples(target, rows)
        kw = dict(max_iter=max_iter, max_leaf_nodes=31, early_stopping=False, random_state=0)
        with threadpool_limits(1):
            regs[f"{target}_mean"] = export_hist_gradient_boosting(HistGradientBoostingRegressor(**kw).fit(x, y))
            regs[f"{target}_p90"] = export_hist_gradient_boosting(
                HistGradientBoostingRegressor(loss="quantile", quantile=0.9, **kw).fit(x, y))
    return model_document(version=version, **regs, notes="bench_routing synthetic"), time.perf_counter() - t0


def bench_picks(profile, *, sizes, picks: int, document: dict | None, seed: int) -> list[dict]:
    import gc

    from routing.config import PickerConfig
    from routing.models.store import ModelStore
    from routing.picking.picker import Picker, dispatch_record
    from routing.models.predictor import LatencyPredictor, ProfileEstimator

    store = ModelStore()
    if document is not None:
        store.publish(document, now_s=0.0)
    predictor = LatencyPredictor(estimate=ProfileEstimator(profile), models=store, quantile="p90")
    rows = []
    for n in sizes:
        reg = make_registry(n, profile)
        picker = Picker(PickerConfig.model_validate(PICKER), predictor, rng=seed)
        # Critical requests are never shed, so every pick runs both stages
        # (a shed request stops after the prefill stage and is cheaper).
        stream = request_stream(seed, critical=True)
        in_flight: list[str] = []
        wall, cpu = [], []
        outcomes = {"routed": 0, "shed": 0}
        tiers: list[str] = []
        warmup = 200
        gc.collect()
        load0 = os.getloadavg()[0]
        for k in range(picks + warmup):
            req = next(stream)
            now = k * 0.002
            t0, c0 = time.perf_counter(), time.thread_time()
            result = picker.pick(req, reg, now)
            c1, t1 = time.thread_time(), time.perf_counter()
            if k >= warmup:
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
                outcomes[result.outcome] += 1
                tiers.append(result.tier)
            if result.routed:
                reg.dispatched(dispatch_record(req, result, now_s=now))
                in_flight.append(req.request_id)
            while len(in_flight) > 4 * n:
                reg.completed(in_flight.pop(0), now_s=now, output_tokens=100)
        w, c = np.array(wall) * 1e3, np.array(cpu) * 1e3
        rows.append({
            "endpoints": n,
            "model": "published HGB p90 (300 trees x 31 leaves)" if document else "profile estimate",
            "picks": len(wall),
            "p50_ms": round(float(np.percentile(w, 50)), 4),
            "p99_ms": round(float(np.percentile(w, 99)), 4),
            "cpu_p50_ms": round(float(np.percentile(c, 50)), 4),
            "cpu_p99_ms": round(float(np.percentile(c, 99)), 4),
            "routed_frac": round(outcomes["routed"] / len(wall), 4),
            "tiers": {t: tiers.count(t) for t in sorted(set(tiers))},
            "load_avg_1m_before": round(load0, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
        })
        print(f"  pick n={n:5d} {rows[-1]['model']}: p50 {rows[-1]['p50_ms']:.3f} ms, p99 {rows[-1]['p99_ms']:.3f} ms "
              f"(cpu p99 {rows[-1]['cpu_p99_ms']:.3f} ms)", flush=True)
    return rows


# -- HTTP --------------------------------------------------------------------------


def bench_http(*, rps: float, seconds: float, endpoints: int, document: dict | None) -> dict:
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "routing.yaml"
        cfg.write_text(json.dumps({"profile_dir": str(PROFILE_DIR), "seed": 0, "picker": PICKER}))
        env = {**os.environ, "SLA_ROUTER_TOKEN": TOKEN, "SLA_ROUTER_DATA_TOKEN": DATA_TOKEN}
        server = subprocess.Popen(
            [sys.executable, "-m", "planner_cli.main", "router", "--host", "127.0.0.1", "--port", str(port),
             "--config", str(cfg), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"router did not start: {server.stdout.read().decode()[-2000:]}")
                time.sleep(0.2)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
                for eid, role, domains in fleet_specs(endpoints):
                    client.put(f"/v1/endpoints/{eid}", json={"role": role, "domains": domains}).raise_for_status()
                if document is not None:
                    client.post("/v1/models", json=document).raise_for_status()
                model = client.get("/v1/models").json()["active"]
            out = Path(tmp) / "loadgen.json"
            cpu0, load0 = _cpu_seconds(server.pid), os.getloadavg()
            gen = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--loadgen", "--url", url, "--http-rps", str(rps),
                 "--http-seconds", str(seconds), "--out", str(out)],
                cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120,
            )
            if gen.returncode != 0:
                raise RuntimeError(f"load generator failed: {gen.stderr[-2000:]}")
            result = json.loads(out.read_text())
            server_cpu_s = _cpu_seconds(server.pid) - cpu0
            health = httpx.get(f"{url}/healthz", timeout=5).json()
            # The HTTP floor: a call through the same server, guard, validation and
            # error answer that does no routing work (a 404 for an unknown request).
            with httpx.Client(base_url=url, timeout=5, headers={"Authorization": f"Bearer {DATA_TOKEN}"}) as client:
                probe_calls, cpu1 = 2000, _cpu_seconds(server.pid)
                for _ in range(probe_calls):
                    client.post("/v1/requests/no-such-request/first_token", json={})
                floor_cpu_s = _cpu_seconds(server.pid) - cpu1
        finally:
            server.terminate()
            server.wait(timeout=30)
    calls = result["route_requests"] + result["events_calls"]
    load1 = os.getloadavg()
    result.update({
        "endpoints": endpoints,
        "data_token": True,
        "model": model,
        "requests_in_flight_at_end": health["requests_in_flight"],
        "server_cpu_s": round(server_cpu_s, 2),
        "server_cpu_ms_per_call": round(server_cpu_s / calls * 1e3, 3) if calls else None,
        # Per routed request, its share of the batched completion calls included.
        "server_cpu_ms_per_route": round(server_cpu_s / result["route_requests"] * 1e3, 3)
        if result["route_requests"] else None,
        "server_cpu_ms_per_404_call": round(floor_cpu_s / probe_calls * 1e3, 3),
        "load_avg_1m_before": round(load0[0], 2),
        "load_avg_1m_after": round(load1[0], 2),
        "load_avg_5m_before": round(load0[1], 2),
        "load_avg_5m_after": round(load1[1], 2),
    })
    return result


def bench_asgi_cpu(*, endpoints: int, document: dict | None, routes: int, seed: int = 1) -> dict:
    """Service CPU per route call without an HTTP server: the ASGI app called in-process.

    Same calls as the HTTP run (critical route requests, each completed in
    batches of 25 through the events call), timed with process_time over the
    whole batch; the difference to the HTTP figure is uvicorn, the event loop
    and the sockets.
    """
    import gc

    from routing.http.app import create_app
    from routing.config import RouterConfig
    from routing.picking.picker import RouteRequest
    from routing.fleet.registry import Endpoint

    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 0, "picker": PICKER})
    app = create_app(cfg, token=TOKEN, data_token=DATA_TOKEN)
    svc = app.state.service
    for eid, role, domains in fleet_specs(endpoints):
        svc.register(Endpoint(id=eid, role=role, domains=domains))
    if document is not None:
        svc.publish(document)
    rng = np.random.default_rng(seed)
    statuses: dict[str, int] = {}

    async def call(path: str, payload: dict) -> None:
        body = json.dumps(payload).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                             (b"authorization", b"Bearer " + DATA_TOKEN.encode()),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
        started = {}

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                started["status"] = message["status"]

        await app(scope, receive, send)
        statuses[str(started["status"])] = statuses.get(str(started["status"]), 0) + 1

    async def run(n: int, first: int, *, idle_s: float = 0.0) -> int:
        due: list[str] = []
        events = 0
        for i in range(first, first + n):
            rid = f"asgi-{i}"
            await call("/v1/route", {"request_id": rid, "input_tokens": int(min(rng.lognormal(7.0, 0.8), 16000)),
                                     "slo": SLO, "prefix_cache_hit_frac": 0.2, "critical": True})
            due.append(rid)
            if idle_s:
                await asyncio.sleep(idle_s)
            if len(due) >= 400 and i % 25 == 0:  # about 0.8 s of traffic at 500 req/s in flight
                batch, due = due[:25], due[25:]
                await call("/v1/requests/events", {"events": [
                    {"event": "completed", "request_id": r, "output_tokens": 100, "observed_ttft_ms": 120.0,
                     "observed_tpot_ms": 9.0} for r in batch]})
                events += 1
        return events

    def direct(n: int, first: int) -> None:
        # The service alone: the same route and completion calls without HTTP or ASGI.
        due: list[str] = []
        for i in range(first, first + n):
            req = RouteRequest(request_id=f"svc-{i}", input_tokens=int(min(rng.lognormal(7.0, 0.8), 16000)),
                               ttft_ms=SLO["ttft_ms"], itl_ms=SLO["itl_ms"], prefix_cache_hit_frac=0.2,
                               critical=True)
            svc.route(req)
            due.append(req.request_id)
            if len(due) > 400:
                svc.completed(due.pop(0), output_tokens=100, observed_ttft_ms=120.0, observed_tpot_ms=9.0)

    async def main() -> dict:
        await run(1000, 0)  # warm-up and steady state, not counted
        gc.collect()
        statuses.clear()
        c0 = time.process_time()
        events = await run(routes, 1000)
        cpu_s = time.process_time() - c0
        c0 = time.process_time()
        direct(routes, 0)
        svc_cpu_s = time.process_time() - c0
        # The same calls with the process idle 1 ms between them, as a server is
        # between requests: what waking up costs (caches, the VM's idle exits).
        idle_routes = routes // 2
        c0 = time.process_time()
        await run(idle_routes, 1000 + routes, idle_s=0.001)
        idle_cpu_s = time.process_time() - c0
        return {"routes": routes, "events_calls": events, "statuses": dict(statuses),
                "cpu_ms_per_route": round(cpu_s / routes * 1e3, 3),
                "cpu_ms_per_call": round(cpu_s / (routes + events) * 1e3, 3),
                "service_only_cpu_ms_per_route": round(svc_cpu_s / routes * 1e3, 3),
                "cpu_ms_per_route_idle_1ms_between": round(idle_cpu_s / idle_routes * 1e3, 3)}

    load0 = os.getloadavg()[0]
    out = asyncio.run(main())
    out.update({"endpoints": endpoints, "model": document["version"] if document else None,
                "load_avg_1m_before": round(load0, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)})
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, s (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(url: str, rps: float, seconds: float, out: str) -> None:
    # uvloop when installed: the generator shares the 2 CPUs with the service
    # under test, so its own cost per request is kept down.
    try:
        import uvloop
    except ImportError:
        loop_factory, loop_name = None, "asyncio"
    else:
        loop_factory, loop_name = uvloop.new_event_loop, "uvloop"
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_loadgen(url, rps, seconds, Path(out), loop_name=loop_name))


class _Conn:
    """One keep-alive HTTP/1.1 connection (stdlib asyncio streams)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {DATA_TOKEN}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        try:
            self.writer.write(head + data)
            await self.writer.drain()
            header = await self.reader.readuntil(b"\r\n\r\n")
            lines = header.split(b"\r\n")
            status = int(lines[0].split()[1])
            length = next(int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:]) if k.lower() == b"content-length")
            return status, await self.reader.readexactly(length)
        except Exception:
            self.writer.close()
            self.reader = self.writer = None
            raise


async def _loadgen(url: str, rps: float, seconds: float, out: Path, *, loop_name: str) -> None:
    # A plain asyncio HTTP/1.1 client: at this rate httpx's async connection
    # pool added more latency on this machine than the service itself.
    host, port = url.removeprefix("http://").split(":")
    pool: asyncio.Queue[_Conn] = asyncio.Queue()
    for _ in range(32):
        pool.put_nowait(_Conn(host, int(port)))
    rng = np.random.default_rng(1)
    lat_sched, lat_send, completed_lat = [], [], []
    completed_events = [0]
    statuses: dict[str, int] = {}
    errors: list[str] = []
    pending: set[asyncio.Task] = set()

    async def call(method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        conn = await pool.get()
        try:
            return await conn.request(method, path, body)
        finally:
            pool.put_nowait(conn)

    due: list[tuple[float, str]] = []  # heap of (completion time, request id)
    stop = asyncio.Event()

    async def flush_completions() -> None:
        # As a gateway batches its telemetry: one events call per 50 ms.
        while not (stop.is_set() and not due):
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            batch = []
            # At most 400 events (~46 KB): a batch stays under the 64 KiB body limit.
            while due and due[0][0] <= now and len(batch) < 400:
                batch.append(heapq.heappop(due)[1])
            if not batch:
                continue
            t = time.perf_counter()
            try:
                status, text = await call("POST", "/v1/requests/events", {"events": [
                    {"event": "completed", "request_id": rid, "output_tokens": 100,
                     "observed_ttft_ms": 120.0, "observed_tpot_ms": 9.0} for rid in batch]})
                completed_lat.append(time.perf_counter() - t)
                completed_events[0] += len(batch)
                if status != 200:
                    errors.append(f"events {status}: {text[:200]!r}")
                else:
                    bad = [r for r in json.loads(text)["results"] if r["status"] != 200]
                    errors.extend(f"completed {r['status']}: {r['error']}" for r in bad[:5])
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                errors.append(f"events: {type(exc).__name__}: {exc}")

    async def one(i: int, scheduled: float, isl: int) -> None:
        t = time.perf_counter()
        try:
            status, text = await call("POST", "/v1/route", {
                "request_id": f"lg-{i}", "input_tokens": isl, "slo": SLO, "prefix_cache_hit_frac": 0.2,
                "critical": True})
        except Exception as exc:  # noqa: BLE001
            errors.append(f"route: {type(exc).__name__}: {exc}")
            return
        done = time.perf_counter()
        if i >= 0:
            lat_sched.append(done - scheduled)
            lat_send.append(done - t)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 200:
            heapq.heappush(due, (time.perf_counter() + float(rng.uniform(0.2, 1.5)), f"lg-{i}"))
        elif status != 429:
            errors.append(f"route {status}: {text[:200]!r}")

    flusher = asyncio.create_task(flush_completions())
    # Warm the connections and the server's code paths first (not counted).
    await asyncio.gather(*(one(-k - 1, time.perf_counter(), 1000) for k in range(64)))
    n = int(rps * seconds)
    cpu0 = time.process_time()
    start = time.perf_counter() + 0.1
    max_lag = 0.0
    for i in range(n):
        scheduled = start + i / rps
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            max_lag = max(max_lag, -delay)
        task = asyncio.create_task(one(i, scheduled, int(min(rng.lognormal(7.0, 0.8), 16000))))
        pending.add(task)
        task.add_done_callback(pending.discard)
    elapsed = time.perf_counter() - start
    while pending:
        await asyncio.gather(*list(pending))
    stop.set()
    await flusher
    cpu_s = time.process_time() - cpu0
    sched = np.array(lat_sched) * 1e3
    sent = np.array(lat_send) * 1e3
    comp = np.array(completed_lat) * 1e3

    def pct(a, q):
        return round(float(np.percentile(a, q)), 3) if a.size else None

    out.write_text(json.dumps({
        "target_rps": rps,
        "seconds": seconds,
        "route_requests": int(sum(statuses.values())),
        "achieved_rps": round(sum(statuses.values()) / elapsed, 1),
        "statuses": statuses,
        "errors": len(errors),
        "error_examples": errors[:5],
        "p50_ms": pct(sched, 50),
        "p99_ms": pct(sched, 99),
        "max_ms": round(float(sched.max()), 3) if sched.size else None,
        "p50_from_send_ms": pct(sent, 50),
        "p99_from_send_ms": pct(sent, 99),
        "completed_events": completed_events[0],
        "events_calls": int(comp.size),
        "events_call_p99_ms": pct(comp, 99),
        "generator_max_lag_ms": round(max_lag * 1e3, 3),
        "client": f"asyncio streams on {loop_name}, HTTP/1.1 keep-alive, 32 connections",
        "generator_cpu_ms_per_route": round(cpu_s / n * 1e3, 3) if n else None,
    }))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--picks", type=int, default=5000, help="timed picks per fleet size (default: %(default)s)")
    ap.add_argument("--http-rps", type=float, default=500.0)
    ap.add_argument("--http-seconds", type=float, default=60.0)
    ap.add_argument("--http-endpoints", type=int, default=100)
    ap.add_argument("--http-lower-rates", default="100,250",
                    help="also run these rates (req/s) for --http-lower-seconds each (default: %(default)s; '' for none)")
    ap.add_argument("--http-lower-seconds", type=float, default=20.0)
    ap.add_argument("--train-requests", type=int, default=12000, help="requests routed to collect training samples")
    ap.add_argument("--max-iter", type=int, default=300, help="boosting iterations of the published model")
    ap.add_argument("--asgi-routes", type=int, default=3000, help="route calls timed in-process (default: %(default)s)")
    ap.add_argument("--skip-picks", action="store_true", help="HTTP only (with --out elsewhere: no pick rows)")
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--keep-http", action="store_true",
                    help="with --skip-http: still run the in-process ASGI part, keep the HTTP sections of the "
                         "existing --out file (a re-run without another HTTP load test)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loadgen:
        loadgen(args.url, args.http_rps, args.http_seconds, args.out)
        return 0

    from connectors.profiles import load_profile_dir

    profile = load_profile_dir(PROFILE_DIR)
    print("collecting training samples ...", flush=True)
    samples = collect_samples(profile, n_requests=args.train_requests, seed=0)
    document, train_s = train_document(samples, version="bench-hgb", max_iter=args.max_iter)
    print(f"  {len(samples)} samples, 4 models trained in {train_s:.1f} s", flush=True)
    picks = []
    for doc in (None, document) if not args.skip_picks else ():
        picks += bench_picks(profile, sizes=(10, 100, 1000), picks=args.picks, document=doc, seed=0)
    http = asgi = None
    lower: list[dict] = []
    if not args.skip_http or args.keep_http:
        print(f"in-process ASGI: {args.asgi_routes} route calls ...", flush=True)
        asgi = bench_asgi_cpu(endpoints=args.http_endpoints, document=document, routes=args.asgi_routes)
        print(f"  CPU {asgi['cpu_ms_per_route']} ms per route call (completions included)", flush=True)
    if not args.skip_http:
        print(f"HTTP: {args.http_rps:g} req/s for {args.http_seconds:g} s ...", flush=True)
        http = bench_http(rps=args.http_rps, seconds=args.http_seconds, endpoints=args.http_endpoints,
                          document=document)
        print(f"  route p50 {http['p50_ms']} ms, p99 {http['p99_ms']} ms, errors {http['errors']}, "
              f"statuses {http['statuses']}", flush=True)
        for rate in [float(r) for r in args.http_lower_rates.split(",") if r.strip()]:
            print(f"HTTP: {rate:g} req/s for {args.http_lower_seconds:g} s ...", flush=True)
            lower.append(bench_http(rps=rate, seconds=args.http_lower_seconds, endpoints=args.http_endpoints,
                                    document=document))
            print(f"  route p50 {lower[-1]['p50_ms']} ms, p99 {lower[-1]['p99_ms']} ms, errors {lower[-1]['errors']}",
                  flush=True)
    kept = {}
    if args.skip_http and args.keep_http and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        kept = {k: old.get(k) for k in ("http_route", "http_route_lower_rates")}
        http, lower = kept["http_route"], kept["http_route_lower_rates"] or []
    result = {
        "benchmark": "routing",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
        "profile": PROFILE_DIR.name,
        "training": {"samples": len(samples), "seconds": round(train_s, 2), "max_iter": args.max_iter,
                     "max_leaf_nodes": 31},
        "pick": picks,
        "asgi_in_process": asgi,
        "http_route": http,
        "http_route_lower_rates": lower,
        "targets": {"pick_p99_ms_at_100": 1.0, "http_p99_ms": 10.0, "http_errors": 0},
        "see_also": "SLO attainment per router in the fleet simulator: bench_routing_sim.py, results/routing_sim.json",
    }
    if kept:
        result["http_sections_from_earlier_run"] = True
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(markdown(result))
    return 0


def markdown(result: dict) -> str:
    lines = ["| endpoints | latency model | pick p50 (ms) | pick p99 (ms) | CPU p50 (ms) | CPU p99 (ms) | load avg |",
             "|---|---|---|---|---|---|---|"]
    for r in result["pick"]:
        lines.append(f"| {r['endpoints']} | {r['model']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['cpu_p50_ms']:.3f} | "
                     f"{r['cpu_p99_ms']:.3f} | {r.get('load_avg_1m_before')} |")
    h = result["http_route"]
    if h:
        lines += ["", "| HTTP /v1/route | value |", "|---|---|",
                  f"| offered / achieved | {h['target_rps']:g} / {h['achieved_rps']:g} req/s for {h['seconds']:g} s |",
                  f"| p50 / p99 / max (from scheduled send) | {h['p50_ms']} / {h['p99_ms']} / {h['max_ms']} ms |",
                  f"| p50 / p99 (from actual send) | {h['p50_from_send_ms']} / {h['p99_from_send_ms']} ms |",
                  f"| statuses | {h['statuses']} |", f"| errors | {h['errors']} |",
                  f"| server CPU per HTTP call (route, or a batch of completions) | {h['server_cpu_ms_per_call']} ms |",
                  f"| server CPU per routed request (its completion included) | {h['server_cpu_ms_per_route']} ms |",
                  f"| same calls in-process (ASGI app, no server or sockets) | "
                  f"{(result.get('asgi_in_process') or {}).get('cpu_ms_per_route')} ms |",
                  f"| same calls on the service object (no HTTP layer at all) | "
                  f"{(result.get('asgi_in_process') or {}).get('service_only_cpu_ms_per_route')} ms |",
                  f"| in-process ASGI calls with the process idle 1 ms between them | "
                  f"{(result.get('asgi_in_process') or {}).get('cpu_ms_per_route_idle_1ms_between')} ms |",
                  f"| server CPU per call that does no routing (404, same server) | "
                  f"{h['server_cpu_ms_per_404_call']} ms |",
                  f"| load generator CPU per request ({h['client'].split(',')[0]}) | "
                  f"{h['generator_cpu_ms_per_route']} ms |",
                  f"| machine load average (1 min) before / after | {h['load_avg_1m_before']} / "
                  f"{h['load_avg_1m_after']} on {result['machine']['cpus']} CPUs (5 min: "
                  f"{h['load_avg_5m_before']} / {h['load_avg_5m_after']}) |"]
    lower = result.get("http_route_lower_rates") or []
    if lower:
        lines += ["", "| offered req/s (s) | achieved | p50 (ms) | p99 (ms) | errors | server CPU/route (ms) | load avg |",
                  "|---|---|---|---|---|---|---|"]
        for r in [*lower, h]:
            lines.append(f"| {r['target_rps']:g} ({r['seconds']:g}) | {r['achieved_rps']:g} | {r['p50_ms']} | "
                         f"{r['p99_ms']} | {r['errors']} | {r['server_cpu_ms_per_route']} | {r['load_avg_1m_before']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
