"""Real components for the retrain tests: the routing service as a process, fed by the simulator.

`router_process` starts `sla-planner router` on 127.0.0.1 (free port, temp
model folder, admin token in an environment variable) and stops it by pid.
`feed_simulated_requests` replays a real trace through the simulated fleet and
sends every request's lifecycle calls to the service over HTTP, so the samples
the retrain flow reads are the ones the service recorded itself.
`FaultProxy` sits between the flow and the service and can drop the publish
call, before or after forwarding it, like a router pod dying mid-request.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.fixtures_net import free_port, wait_http_ok

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA = PROJECT_ROOT.parent / "shared" / "data"
# The fleet runs the measured H200 profile; the router's estimate comes from
# aiconfigurator's H100 figures (estimates, ~12% low on ITL): the situation a
# trained model is for.
FLEET_PROFILE = DATA / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
ROUTER_PROFILE = DATA / "profiles" / "aiconfigurator" / "Llama-3.1-8B_H100_vllm_TP1P_TP1D"
AZURE_CONV = DATA / "traces" / "azure2023_conv.csv.gz"
TOKEN_ENV = "RETRAIN_TEST_ROUTER_TOKEN"
TOKEN = "retrain-test-token-5f1c9e"


def require_data(*paths: Path) -> None:
    for p in paths:
        if not p.exists():
            pytest.fail(f"{p}: test data not found (tests need ../shared/data beside the project)")


@dataclass
class RouterProcess:
    url: str
    proc: subprocess.Popen
    log_path: Path
    models_dir: Path

    def client(self, *, admin: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {TOKEN}"} if admin else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)


@contextlib.contextmanager
def router_process(tmp: Path, *, profile_dir: Path = ROUTER_PROFILE, extra_yaml: str = ""):
    """`sla-planner router` on a free port with a persisted model folder; stopped by pid afterwards.

    extra_yaml: more top-level config lines (e.g. a samples block)."""
    require_data(profile_dir)
    port = free_port()
    models_dir = tmp / "models"
    cfg = tmp / "routing.yaml"
    cfg.write_text(
        f"profile_dir: {profile_dir}\n"
        f"models: {{dir: {models_dir}}}\n"
        f"auth: {{token_env: {TOKEN_ENV}}}\n"
        "seed: 0\n" + extra_yaml
    )
    log_path = tmp / "router.log"
    env = {**_base_env(), TOKEN_ENV: TOKEN}
    cli = Path(sys.executable).with_name("sla-planner")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(cli), "router", "--host", "127.0.0.1", "--port", str(port), "--config", str(cfg),
             "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/healthz", timeout_s=90, proc=proc, log_path=log_path, what="sla-planner router")
        yield RouterProcess(url, proc, log_path, models_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _base_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


@lru_cache(maxsize=4)
def simulated_requests(*, window_s: float, start_s: float = 120.0, load_multiplier: float = 4.0):
    """window_s seconds from start_s of the Azure conversation trace x load_multiplier, replayed
    by the simulated fleet under the planner (measured H200 profile): each request's outcome and workers."""
    from sim.samples import simulate_routed
    from workloads.traces import load_trace, multiply_load, time_window

    require_data(AZURE_CONV, FLEET_PROFILE)
    trace = time_window(multiply_load(load_trace(AZURE_CONV), load_multiplier, seed=0), start_s, start_s + window_s)
    return simulate_routed(trace, profile_dir=str(FLEET_PROFILE))


def feed_simulated_requests(router: RouterProcess, routed) -> int:
    """Register the fleet's endpoints and send every request's lifecycle calls; returns the request count."""
    from sim.samples import HttpSink, endpoints, lifecycle_events, replay_events

    with router.client(admin=False) as client:
        sink = HttpSink(client)
        for ep in endpoints(routed):
            sink.register(ep, token=TOKEN)
        n = sum(1 for ev in replay_events(lifecycle_events(routed), sink) if ev.kind == "completed")
    return n


class FaultProxy:
    """HTTP proxy to the router that can lose POST /v1/models (counting every attempt).

    mode "pass": forward everything; "drop_request": close the connection
    without forwarding (the router never sees it); "drop_response": forward,
    then close without answering (the router accepted it, the caller never
    hears). `faults` limits how many publishes are affected (None: all).
    """

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.mode = "pass"
        self.faults: int | None = None
        self.publish_attempts = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                publish = self.command == "POST" and self.path == "/v1/models"
                fault = None
                if publish:
                    proxy.publish_attempts += 1
                    if proxy.mode != "pass" and (proxy.faults is None or proxy.faults > 0):
                        fault = proxy.mode
                        if proxy.faults is not None:
                            proxy.faults -= 1
                if fault == "drop_request":
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                resp = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                     timeout=60.0)
                if fault == "drop_response":
                    self.close_connection = True
                    return
                self.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
