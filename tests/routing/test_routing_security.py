"""The routing service's data plane against an attacker on the same network.

Each test replays an attack on the real service (uvicorn on 127.0.0.1 with the
protocol and limits `sla-planner router` uses, routing.http.server.uvicorn_options)
and shows it holds: tokens, the context-length bound, the in-flight bound and
TTL, per-source rate limits, head and body deadlines, sample validation and
the retrain gate's per-source cap on held-out rows.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import uvicorn

from routing.http.app import create_app
from routing.config import RouterConfig
from routing.fleet.registry import Endpoint
from routing.http.server import uvicorn_options
from routing.service import RoutingService
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, TargetData, prepare_samples
from routing.training.split import Split, holdout_rows, time_split
from tests.support.fixtures_routing import PROFILE_DIR, TOKEN, free_port, h200_profile

DATA_TOKEN = "test-data-token-9f8e7d6c5b4a"
DATA = {"Authorization": f"Bearer {DATA_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SLO = {"ttft_ms": 500.0, "itl_ms": 50.0}
PROFILE = h200_profile()


class Clock:
    def __init__(self, now_s: float = 1.7e9):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@contextlib.contextmanager
def serve(overrides: dict | None = None, *, data_token: str | None = DATA_TOKEN, clock=None, fast: bool = True,
          guard_clock=None):
    """The service with 2 prefill + 2 decode endpoints, served as `sla-planner router` serves it.
    guard_clock: the rate limits' clock (default: monotonic time)."""
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 1, **(overrides or {})})
    svc = RoutingService(cfg, profile=PROFILE, **({"clock": clock} if clock else {}))
    for i in range(2):
        for role in ("prefill", "decode"):
            svc.register(Endpoint(id=f"{role[0]}{i}", role=role, domains={"zone": "ab"[i]}))
    app = create_app(cfg, token=TOKEN, data_token=data_token, service=svc)
    if not fast:
        app.guard.fast_path = None
    if guard_clock is not None:
        app.guard.clock = guard_clock
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                                           lifespan="on", **uvicorn_options(cfg)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client, svc, port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def metric(client: httpx.Client, name: str, **labels) -> float:
    text = client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}(?:\{{{re.escape(want)}\}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def dispatch(client, rid: str, *, headers=DATA, input_tokens: int = 1000, prefill: str = "p0", decode: str = "d0"):
    return client.post(f"/v1/requests/{rid}/dispatched", headers=headers, json={
        "prefill_endpoint_id": prefill, "decode_endpoint_id": decode, "input_tokens": input_tokens})


# -- authentication ----------------------------------------------------------------------

DATA_CALLS = [
    pytest.param("POST", "/v1/route", {"input_tokens": 100, "slo": SLO}, id="route"),
    pytest.param("POST", "/v1/predict", {"input_tokens": 100}, id="predict"),
    pytest.param("POST", "/v1/requests/a/dispatched",
                 {"prefill_endpoint_id": "p0", "decode_endpoint_id": "d0", "input_tokens": 100}, id="dispatched"),
    pytest.param("POST", "/v1/requests/a/first_token", {}, id="first_token"),
    pytest.param("POST", "/v1/requests/a/progress", {"tokens_generated": 1}, id="progress"),
    pytest.param("POST", "/v1/requests/a/completed", {"output_tokens": 1}, id="completed"),
    pytest.param("POST", "/v1/requests/events", {"events": [{"event": "completed", "request_id": "a",
                                                             "output_tokens": 1}]}, id="events"),
    pytest.param("PUT", "/v1/endpoints/d0/metrics",
                 {"kv_usage_frac": 1.0, "waiting_requests": 1e6, "running_requests": 1e6}, id="pushed metrics"),
    pytest.param("GET", "/v1/endpoints", None, id="endpoint list"),
    pytest.param("GET", "/v1/models", None, id="model list"),
]


@pytest.fixture(scope="module")
def pair():
    with serve(fast=True) as fast, serve(fast=False) as slow:
        yield fast, slow


@pytest.mark.parametrize("method, path, body", DATA_CALLS)
def test_every_data_plane_call_needs_the_data_or_admin_token(pair, method, path, body):
    (fast, _, _), (slow, _, _) = pair
    for client in (fast, slow):
        for headers, message in (({}, "bearer token required"),
                                 ({"Authorization": "Bearer wrong"}, "bearer token is not valid"),
                                 ({"Authorization": f"Basic {DATA_TOKEN}"}, "bearer token required")):
            resp = client.request(method, path, json=body, headers=headers)
            assert resp.status_code == 401, (path, headers, resp.text)
            assert resp.json() == {"error": "unauthorized", "message": message, "fields": []}
            assert resp.headers["www-authenticate"] == "Bearer"
        for headers in (DATA, ADMIN):  # operators' admin token is accepted wherever the data token is
            assert client.request(method, path, json=body, headers=headers).status_code != 401


def test_health_and_metrics_stay_open_and_the_data_token_is_not_an_admin_token(pair):
    (client, _, _), _ = pair
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200
    resp = client.put("/v1/endpoints/x9", json={"role": "decode"}, headers=DATA)
    assert resp.status_code == 401 and resp.json()["message"] == "bearer token is not valid"


def test_an_unauthenticated_load_push_no_longer_sheds_every_route():
    """Measured before: one PUT of waiting_requests=1e6 made every non-critical route 429."""
    with serve() as (client, _, _):
        for eid in ("p0", "p1", "d0", "d1"):
            resp = client.put(f"/v1/endpoints/{eid}/metrics",
                              json={"kv_usage_frac": 1.0, "waiting_requests": 1e6, "running_requests": 1e6})
            assert resp.status_code == 401
        resp = client.post("/v1/route", json={"input_tokens": 1000, "slo": SLO}, headers=DATA)
        assert resp.status_code == 200, resp.text


def test_without_a_data_token_the_data_plane_is_open_and_a_warning_says_so(caplog):
    with caplog.at_level("WARNING", logger="sla_planner.routing.http.app"), serve(data_token=None) as (client, _, _):
        assert client.post("/v1/route", json={"input_tokens": 100, "slo": SLO}).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "data-plane token" in r.getMessage()]
    assert len(warnings) == 1 and "SLA_ROUTER_DATA_TOKEN" in warnings[0]


# -- request size --------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [pytest.param(True, id="fast path"), pytest.param(False, id="FastAPI route")])
def test_a_prompt_beyond_the_context_length_is_a_422_naming_field_and_bound(fast):
    """Measured before: one dispatched with input_tokens 1e7 made every non-critical route 429 for up to 900 s."""
    with serve(fast=fast) as (client, svc, _):
        resp = dispatch(client, "huge", input_tokens=10_000_000)
        assert resp.status_code == 422
        (field,) = resp.json()["fields"]
        assert field["field"] == "body.input_tokens" and "131072" in field["message"]
        resp = client.post("/v1/route", json={"input_tokens": 200_000, "slo": SLO}, headers=DATA)
        assert resp.status_code == 422 and resp.json()["fields"][0]["field"] == "body.input_tokens"
        assert svc.registry.in_flight_count() == 0
        assert client.post("/v1/route", json={"input_tokens": 1000, "slo": SLO}, headers=DATA).status_code == 200


def test_context_length_comes_from_the_config_or_the_profile():
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "limits": {"max_context_tokens": None}})
    assert RoutingService(cfg, profile=PROFILE).max_context_tokens == PROFILE.decode.max_kv_tokens == 945029
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "limits": {"max_context_tokens": 8192}})
    assert RoutingService(cfg, profile=PROFILE).max_context_tokens == 8192


# -- the in-flight map ------------------------------------------------------------------------


def test_requests_never_completed_are_bounded_and_counted_lost():
    """Measured before: the in-flight map grew by ~2.4 KB per request never completed, without bound."""
    with serve({"inflight_max_requests": 50}) as (client, svc, _):
        for i in range(80):
            assert dispatch(client, f"r{i}").status_code == 201
        assert svc.registry.in_flight_count() == 50
        assert client.get("/healthz").json()["requests_in_flight"] == 50
        assert metric(client, "router_requests_lost_total", reason="capacity") == 30
        # The oldest went: r0..r29 are unknown, r30 is still tracked.
        assert client.post("/v1/requests/r29/first_token", json={}, headers=DATA).status_code == 404
        assert client.post("/v1/requests/r30/first_token", json={}, headers=DATA).status_code == 200


def test_requests_older_than_the_ttl_expire_into_the_lost_counter():
    clock = Clock()
    with serve({"inflight_ttl_s": 60}, clock=clock) as (client, svc, _):
        for i in range(5):
            assert dispatch(client, f"old{i}").status_code == 201
        clock.now_s += 61
        assert dispatch(client, "new").status_code == 201  # a dispatch runs the expiry, as a route does
        assert svc.registry.in_flight_count() == 1
        assert metric(client, "router_requests_lost_total", reason="ttl") == 5


# -- rate limits ------------------------------------------------------------------------------


def _client_from(port: int, address: str) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, headers=DATA,
                        transport=httpx.HTTPTransport(local_address=address))


def test_lifecycle_and_metrics_calls_are_limited_per_source():
    limits = {"rate_limits": {"lifecycle": {"rate_per_s": 5, "burst": 20}, "metrics": {"rate_per_s": 2, "burst": 5}}}
    # The buckets' clock moves only when the test says so: a slow machine must not refill them mid-test.
    now = [1000.0]
    with serve(limits, guard_clock=lambda: now[0]) as (_, _, port), _client_from(port, "127.0.0.1") as a, _client_from(port, "127.0.0.2") as b:
        statuses = [a.post(f"/v1/requests/x{i}/first_token", json={}).status_code for i in range(25)]
        assert statuses[:20] == [404] * 20 and statuses[20:] == [429] * 5
        resp = a.post("/v1/requests/x/completed", json={"output_tokens": 1})
        assert resp.status_code == 429 and resp.json()["error"] == "rate_limited"
        assert 1 <= int(resp.headers["retry-after"]) <= 2
        # Another source is not affected; a batch counts each of its events.
        batch = {"events": [{"event": "first_token", "request_id": f"y{i}"} for i in range(15)]}
        assert b.post("/v1/requests/events", json=batch).status_code == 200
        assert b.post("/v1/requests/events", json=batch).status_code == 429
        push = {"kv_usage_frac": 0.1, "waiting_requests": 0, "running_requests": 1}
        assert [a.put("/v1/endpoints/d0/metrics", json=push).status_code for _ in range(7)] == [200] * 5 + [429] * 2
        # Routes are not limited here, and the bucket refills.
        assert a.post("/v1/route", json={"input_tokens": 100, "slo": SLO}).status_code == 200
        now[0] += 1.1
        assert a.post("/v1/requests/x/first_token", json={}).status_code == 404


# -- slow clients -------------------------------------------------------------------------------


def _read_all(sock: socket.socket, timeout_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or timeout_s passes (False)."""
    sock.settimeout(timeout_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
        return out, True
    except ConnectionResetError:
        return out, True
    except (TimeoutError, socket.timeout):
        return out, False


def _answered(sock: socket.socket) -> bool:
    """The server has sent something (or closed): stop writing, so our bytes do not reset what it sent."""
    return bool(select.select([sock], [], [], 0)[0])


def test_a_body_trickled_slower_than_the_deadline_is_408_and_closed():
    with serve({"limits": {"body_timeout_s": 1.0}}) as (_, _, port):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/requests/r/first_token HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + DATA_TOKEN.encode() + b"\r\ncontent-length: 100\r\n\r\n{")
        t0 = time.monotonic()
        for _ in range(10):  # a byte every 0.3 s: it would take 30 s
            time.sleep(0.3)
            if _answered(sock):
                break
            sock.sendall(b" ")
        answer, closed = _read_all(sock, 5.0)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 ") and b"body not received within 1 s" in answer
        assert closed and time.monotonic() - t0 < 5


def test_slow_and_silent_connections_are_closed_after_the_head_deadline_while_others_are_served():
    """Measured before: 300 slow connections were held open indefinitely."""
    with serve({"limits": {"header_timeout_s": 1.0}}) as (client, _, port):
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        trickling = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        t0 = time.monotonic()
        for i in range(6):  # a header byte every 0.3 s per connection: never a complete head
            for sock in trickling:
                if not _answered(sock):
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nx-slow: " if i == 0 else b"a")
            time.sleep(0.3)
            assert client.get("/healthz").status_code == 200
        for sock in silent + trickling:
            answer, closed = _read_all(sock, max(0.1, t0 + 3.0 - time.monotonic()))
            sock.close()
            assert closed, "the server kept a slow connection open past the head deadline"
            assert answer.startswith(b"HTTP/1.1 408 ")


def test_an_oversized_head_is_431_and_an_idle_keep_alive_connection_is_closed():
    with serve({"limits": {"max_header_bytes": 2048, "keep_alive_s": 1}}) as (_, _, port):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n")
        answer, closed = _read_all(sock, 5.0)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 431 ") and closed
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        t0 = time.monotonic()
        answer, closed = _read_all(sock, 5.0)
        sock.close()
        assert answer.startswith(b"HTTP/1.1 200 ") and closed and time.monotonic() - t0 < 3


# -- samples ----------------------------------------------------------------------------------


def test_an_implausible_latency_is_refused_before_it_is_stored():
    """Measured before: a TTFT of 3,600,000 ms was accepted and stored."""
    with serve() as (client, svc, _):
        lo, hi = svc.latency_bounds_ms("ttft")
        # Defaults: 0.1 x the fastest decode step 4.38 ms; 200 x (375 ms at 16372 tokens x 131072/16372).
        assert lo == pytest.approx(0.438, rel=1e-3) and hi == pytest.approx(200 * 375.48 * 131072 / 16372, rel=1e-3)
        assert dispatch(client, "r").status_code == 201
        resp = client.post("/v1/requests/r/first_token", json={"observed_ttft_ms": 3_600_000}, headers=DATA)
        assert resp.status_code == 422
        (field,) = resp.json()["fields"]
        assert field["field"] == "body.observed_ttft_ms" and field["message"] == f"Input should be less than or equal to {hi}"
        assert len(svc.samples) == 0
        # A TPOT the router's own clock derives (1000 tokens right after the first) is far below any engine's.
        assert client.post("/v1/requests/r/first_token", json={"observed_ttft_ms": 120.0},
                           headers=DATA).json()["samples_recorded"] == 1
        assert client.post("/v1/requests/r/completed", json={"output_tokens": 1000},
                           headers=DATA).json()["samples_recorded"] == 0
        assert len(svc.samples) == 1
        assert metric(client, "router_samples_refused_total", reason="implausible") == 1


def test_one_source_cannot_fill_the_sample_store():
    with serve({"samples": {"capacity": 40}}) as (_, svc, port), \
            _client_from(port, "127.0.0.1") as a, _client_from(port, "127.0.0.2") as b:
        for i in range(40):  # 40 TTFT samples offered by one source
            assert dispatch(a, f"a{i}", headers=None).status_code == 201
            a.post(f"/v1/requests/a{i}/first_token", json={"observed_ttft_ms": 100.0}).raise_for_status()
        assert len(svc.samples) == 20  # max_source_frac 0.5 of capacity 40
        for i in range(10):
            assert dispatch(b, f"b{i}", headers=None).status_code == 201
            assert b.post(f"/v1/requests/b{i}/first_token",
                          json={"observed_ttft_ms": 100.0}).json()["samples_recorded"] == 1
        assert len(svc.samples) == 30
        assert metric(a, "router_samples_refused_total", reason="quota") == 20


# -- the retrain gate's held-out rows -------------------------------------------------------------


def _data(sources: list[str]) -> TargetData:
    n = len(sources)
    return TargetData("ttft", np.zeros((n, 3)), np.ones(n), np.arange(n, dtype=float), np.arange(n), {},
                      source=np.array(sources, dtype=object))


@pytest.mark.parametrize("before, holdout, frac, expected", [
    pytest.param("x" * 10, "aaaaaabbcd", 0.5, "aaaabbcd",
                 id="a 6 of 10: a <= 0.5/0.5 x (2+1+1) = 4 -> 8 rows, a 4/8"),
    pytest.param("x" * 10, "aaaaaaaabb", 0.5, "aabb", id="two sources: a <= 1 x 2, its 2 newest"),
    pytest.param("x" * 10, "abcabcabca", 0.5, "abcabcabca", id="no source above half: all kept"),
    pytest.param("x" * 10, "aaaa", 0.5, "aaaa", id="one source: 1/k = 1, all kept"),
    pytest.param("x" * 10, "aaaaaabbcd", 0.25, "abcd",
                 id="at max(0.25, 1/4): a <= 1/3 x 4 = 1, then b <= 1/3 x 3 = 1"),
    pytest.param("aaaaaaaabb", "aaaaaaaabb", 0.5, "aaaaaaaabb",
                 id="a held 0.8 before too: an endpoint that serves more keeps its share"),
    pytest.param("aaaaabbbbb", "aaaaaaaabb", 0.5, "aabb", id="a held 0.5 before, 0.8 now: cut to 0.5"),
])
def test_holdout_rows_cap_each_source(before, holdout, frac, expected):
    data = _data(list(before + holdout))
    split = Split(slice(0, 10), slice(10, 10), slice(10, 10 + len(holdout)))
    rows = holdout_rows(data, split, max_source_frac=frac)
    assert "".join(data.source[rows]) == expected
    assert list(rows) == sorted(rows) and rows.min() >= 10


def test_a_flood_on_one_endpoint_cannot_dominate_the_held_out_rows():
    """Fabricated samples sent last (so they are the most recent) on one endpoint, while honest traffic goes on."""
    with serve() as (client, svc, _):
        rng = np.random.default_rng(0)
        for i in range(400):
            pre, dec = ("p0", "d0") if i % 2 else ("p1", "d1")
            assert dispatch(client, f"h{i}", prefill=pre, decode=dec).status_code == 201
        client.post("/v1/requests/events", headers=DATA, json={"events": [
            {"event": "first_token", "request_id": f"h{i}", "observed_ttft_ms": float(rng.uniform(50, 150))}
            for i in range(400)]}).raise_for_status()
        # Then the flood on p0, three fabricated samples for every honest one that still arrives on p1.
        events = []
        for i in range(200):
            rid, pre, dec, ttft = ((f"evil{i}", "p0", "d0", 500_000.0) if i % 4 else
                                   (f"g{i}", "p1", "d1", float(rng.uniform(50, 150))))
            assert dispatch(client, rid, prefill=pre, decode=dec).status_code == 201
            events.append({"event": "first_token", "request_id": rid, "observed_ttft_ms": ttft})
        client.post("/v1/requests/events", headers=DATA, json={"events": events}).raise_for_status()
        samples = svc.sample_page(after_seq=0, limit=10_000, target=None)["samples"]
    cfg = TrainingConfig()
    prepared: PreparedSamples = prepare_samples(samples, cfg)
    data = prepared.by_target["ttft"]
    split = time_split(data.n, holdout_frac=cfg.holdout_frac, calibration_frac=cfg.calibration_frac)
    held = data.source[split.holdout]
    assert (held == "p0").mean() >= 0.7  # the most recent slice is mostly the flood
    p0_before = (data.source[: split.holdout.start] == "p0").mean()  # 200 honest + 60 fabricated of 480
    assert p0_before == pytest.approx(260 / 480)
    rows = holdout_rows(data, split, max_source_frac=cfg.holdout_max_source_frac)
    scored = data.source[rows]
    assert (scored == "p0").mean() <= p0_before + 0.01 and (scored == "p1").sum() == (held == "p1").sum()
    assert (data.y_ms[rows] >= 500_000).mean() <= p0_before + 0.01
