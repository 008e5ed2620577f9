"""The routing service over real HTTP: uvicorn on 127.0.0.1, a free port, httpx as the client."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from routing.http.app import create_app
from routing.config import RouterConfig
from tests.support.fixtures_routing import (
    PROFILE_DIR,
    PROJECT_ROOT,
    TOKEN,
    RunningServer,
    free_port,
    h200_profile,
    linear_document,
    trained_document,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLO = {"ttft_ms": 500.0, "itl_ms": 50.0}


@contextlib.contextmanager
def serve(overrides: dict | None = None, *, token: str | None = TOKEN, fleet: int = 2):
    """A running service with `fleet` prefill + `fleet` decode endpoints (zones a/b)."""
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 1, **(overrides or {})})
    app = create_app(cfg, token=token, profile=PROFILE)
    with RunningServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        svc = app.state.service
        for i in range(fleet):
            for role in ("prefill", "decode"):
                from routing.fleet.registry import Endpoint

                svc.register(Endpoint(id=f"{role[0]}{i}", role=role, url=None,
                                      domains={"zone": "ab"[i % 2]}))
        yield client, svc


PROFILE = h200_profile()


@pytest.fixture(scope="module")
def api():
    with serve() as (client, svc):
        yield client, svc


def route(client, **body):
    return client.post("/v1/route", json={"input_tokens": 1000, "slo": SLO, **body})


def test_health_and_openapi(api):
    client, _ = api
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["endpoints"] == 4 and health["estimate"] == "profile:H200_TP1P_TP1D;budget=8192"
    spec = client.get("/openapi.json").json()
    assert {"/v1/route", "/v1/models", "/v1/models/rollback", "/v1/samples", "/metrics"} <= set(spec["paths"])
    assert spec["paths"]["/v1/models"]["post"]["security"] == [{"HTTPBearer": []}]


@pytest.mark.parametrize("headers, status, error", [
    pytest.param({}, 401, "bearer token required", id="no header"),
    pytest.param({"Authorization": "Bearer wrong"}, 401, "bearer token is not valid", id="wrong token"),
    pytest.param({"Authorization": f"Basic {TOKEN}"}, 401, "bearer token required", id="not bearer"),
])
def test_unauthenticated_publish_is_refused(api, headers, status, error):
    client, svc = api
    before = svc.models.active
    resp = client.post("/v1/models", json=linear_document("unauth"), headers=headers)
    assert resp.status_code == status and resp.json()["message"] == error
    assert resp.headers["www-authenticate"] == "Bearer"
    assert svc.models.active is before
    assert client.post("/v1/models/rollback", json={}, headers=headers).status_code == 401
    assert client.get("/v1/samples", headers=headers).status_code == 401
    assert client.put("/v1/endpoints/x", json={"role": "decode"}, headers=headers).status_code == 401


def test_no_token_configured_disables_the_admin_api():
    with serve(token=None, fleet=1) as (client, _):
        resp = client.post("/v1/models", json=linear_document("x"), headers=AUTH)
        assert resp.status_code == 403 and "SLA_ROUTER_TOKEN" in resp.json()["message"]
        assert route(client).status_code == 200  # the data plane works without a token


def _predict_ttft(client) -> float:
    preds = client.post("/v1/predict", json={"input_tokens": 2000, "endpoint_ids": ["p0"]}).json()
    return preds["predictions"][0]["predicted_ttft_ms"], preds["model_version"]


def test_published_model_is_used_and_bad_models_leave_it_serving(api):
    client, _ = api
    estimate_ms, version = _predict_ttft(client)
    assert version is None
    v1 = trained_document("http-v1")
    resp = client.post("/v1/models", json=v1, headers=AUTH)
    assert resp.status_code == 201 and resp.json() == {"version": "http-v1", "active": True}
    v1_ms, version = _predict_ttft(client)
    assert version == "http-v1" and v1_ms != pytest.approx(estimate_ms, rel=0.05)
    assert route(client).json()["model_version"] == "http-v1"

    mismatched = trained_document("http-bad")
    mismatched["targets"]["ttft"]["feature_names"][0] = "input_words"
    cyclic = json.loads(json.dumps(v1))
    cyclic["version"] = "http-cyclic"
    tree = cyclic["targets"]["tpot"]["mean"]["trees"][0]
    tree["left"][tree["is_leaf"].index(False)] = tree["left"][0]  # a node reachable twice
    tree["left"][0] = tree["right"][0]
    for body, status, field in (
        (mismatched, 422, "body.targets.ttft.feature_names"),
        (cyclic, 422, "body.targets.tpot.mean.trees[0]"),
        (v1, 409, "body.version"),
    ):
        resp = client.post("/v1/models", json=body, headers=AUTH)
        assert resp.status_code == status, resp.text
        assert resp.json()["fields"][0]["field"] == field
    raw = client.post("/v1/models", content=b'{"format": "sla-planner/latency-model", "version": ',
                      headers={**AUTH, "content-type": "application/json"})
    assert raw.status_code == 422 and raw.json()["error"] == "invalid_request"
    nan = client.post("/v1/models", content=json.dumps(v1).replace('"baseline": ', '"baseline": NaN, "x": ', 1),
                      headers={**AUTH, "content-type": "application/json"})
    assert nan.status_code == 422
    assert _predict_ttft(client) == (v1_ms, "http-v1")  # the old model kept serving throughout

    assert client.post("/v1/models", json=trained_document("http-v2", scale=2.0), headers=AUTH).status_code == 201
    v2_ms, _ = _predict_ttft(client)
    assert v2_ms == pytest.approx(2 * v1_ms, rel=0.15)
    listing = client.get("/v1/models").json()
    assert listing["active"] == "http-v2" and [v["version"] for v in listing["versions"]][-2:] == ["http-v1", "http-v2"]
    assert client.post("/v1/models/rollback", json={}, headers=AUTH).json()["active"] == "http-v1"
    assert _predict_ttft(client) == (v1_ms, "http-v1")
    assert client.get("/v1/models/http-v1").json()["targets"]["ttft"]["feature_names"][0] == "input_tokens"
    assert client.post("/v1/models/rollback", json={"to_version": "nope"}, headers=AUTH).status_code == 404


def test_route_lifecycle_and_sample_paging(api):
    client, _ = api
    ids = []
    for k in range(3):
        resp = route(client, request_id=f"life-{k}", critical=True)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["mode"] == "disaggregated" and body["prefill"]["role"] == "prefill"
        ids.append(body["request_id"])
    start = client.get("/v1/samples", params={"limit": 1}, headers=AUTH).json()["stats"]["last_seq"]
    for rid in ids:
        assert client.post(f"/v1/requests/{rid}/first_token", json={"observed_ttft_ms": 80.0}).json()[
            "samples_recorded"] == 1
        assert client.post(f"/v1/requests/{rid}/progress", json={"tokens_generated": 20, "observed_tpot_ms": 9.0}
                           ).json()["samples_recorded"] == 1
        assert client.post(f"/v1/requests/{rid}/completed", json={"output_tokens": 50, "observed_tpot_ms": 8.5}
                           ).json()["samples_recorded"] == 1
    seen, cursor = [], start
    while True:
        page = client.get("/v1/samples", params={"after_seq": cursor, "limit": 4}, headers=AUTH).json()
        seen += page["samples"]
        cursor = page["next_after_seq"]
        if not page["has_more"]:
            break
    assert len(seen) == 9 and [s["seq"] for s in seen] == list(range(start + 1, start + 10))
    assert {s["target"] for s in seen} == {"ttft", "tpot"}
    assert page["feature_names"]["tpot"][-1] == "tokens_generated"
    assert client.post(f"/v1/requests/{ids[0]}/completed", json={"output_tokens": 1}).status_code == 404


def test_externally_routed_requests_are_tracked(api):
    client, svc = api
    resp = client.post("/v1/requests/ext-1/dispatched",
                       json={"prefill_endpoint_id": "p1", "decode_endpoint_id": "d1", "input_tokens": 3000})
    assert resp.status_code == 201
    loads = {e["id"]: e["load"] for e in client.get("/v1/endpoints").json()}
    assert loads["p1"]["prefill_tokens_in_flight"] >= 3000
    assert client.post("/v1/requests/ext-1/dispatched",
                       json={"decode_endpoint_id": "d1", "input_tokens": 1}).status_code == 409
    assert client.post("/v1/requests/ext-2/dispatched",
                       json={"decode_endpoint_id": "nope", "input_tokens": 1}).status_code == 404
    assert client.post("/v1/requests/ext-1/completed", json={"output_tokens": 3}).status_code == 200


def test_decode_named_when_prefill_returns(api):
    """Dynamo's frontend order over HTTP: dispatched to prefill only, prefill_done names decode."""
    client, svc = api
    before = client.get("/v1/samples", params={"limit": 1}, headers=AUTH).json()["stats"]["last_seq"]
    assert client.post("/v1/requests/dyn-1/dispatched",
                       json={"prefill_endpoint_id": "p0", "input_tokens": 2500}).status_code == 201
    loads = {e["id"]: e["load"] for e in client.get("/v1/endpoints").json()}
    assert loads["p0"]["prefill_tokens_in_flight"] >= 2500 and svc.registry.in_flight("dyn-1").decode_id is None
    resp = client.post("/v1/requests/dyn-1/prefill_done", json={"decode_endpoint_id": "d0"})
    assert resp.status_code == 200 and resp.json() == {"request_id": "dyn-1", "samples_recorded": 0}
    req = svc.registry.in_flight("dyn-1")
    assert req.decode_id == "d0" and req.tpot_features["role"] == "decode" and req.predicted_tpot_ms > 0
    loads = {e["id"]: e["load"] for e in client.get("/v1/endpoints").json()}
    assert loads["p0"]["prefill_tokens_in_flight"] == 0 and loads["d0"]["decode_tokens_in_flight"] >= 2500
    assert client.post("/v1/requests/dyn-1/first_token", json={"observed_ttft_ms": 300.0}).json()[
        "samples_recorded"] == 1
    assert client.post("/v1/requests/dyn-1/completed", json={"output_tokens": 40, "observed_tpot_ms": 9.0}).json()[
        "samples_recorded"] == 1
    page = client.get("/v1/samples", params={"after_seq": before}, headers=AUTH).json()["samples"]
    assert [(s["target"], s["endpoint_id"]) for s in page if s["request_id"] == "dyn-1"] == [
        ("ttft", "p0"), ("tpot", "d0")]
    # refusals name what is wrong
    client.post("/v1/requests/dyn-2/dispatched", json={"prefill_endpoint_id": "p0", "input_tokens": 10})
    bad = client.post("/v1/requests/dyn-2/prefill_done", json={"decode_endpoint_id": "nope"})
    assert bad.status_code == 404 and bad.json()["message"] == "unknown endpoint 'nope'"
    assert svc.registry.in_flight("dyn-2").decode_id is None  # nothing half-applied
    assert client.post("/v1/requests/never/prefill_done", json={}).status_code == 404
    wrong = client.post("/v1/requests/dyn-2/prefill_done", json={"decode_endpoint_id": "p1"})
    assert wrong.status_code == 422 and "has role prefill, expected decode" in wrong.json()["message"]
    both = client.post("/v1/requests/events", json={"events": [
        {"event": "prefill_done", "request_id": "dyn-2", "decode_endpoint_id": "d1"},
        {"event": "completed", "request_id": "dyn-2", "output_tokens": 2}]}).json()["results"]
    assert [r["status"] for r in both] == [200, 200]
    assert client.post("/v1/requests/dyn-3/dispatched", json={"input_tokens": 1}).status_code == 422


def test_drained_endpoint_finishes_its_requests_with_samples_and_is_not_picked():
    with serve(fleet=2) as (client, svc):
        before = client.get("/v1/samples", params={"limit": 1}, headers=AUTH).json()["stats"]["last_seq"]
        assert client.post("/v1/requests/dr-1/dispatched",
                           json={"prefill_endpoint_id": "p0", "input_tokens": 2000}).status_code == 201
        assert client.post("/v1/requests/dr-1/prefill_done", json={"decode_endpoint_id": "d0"}).status_code == 200
        gone = client.delete("/v1/endpoints/d0", params={"drain": "true"}, headers=AUTH)
        assert gone.status_code == 200 and gone.json() == {"id": "d0", "detached_requests": 0, "draining_requests": 1}
        listed = {e["id"]: e for e in client.get("/v1/endpoints").json()}
        assert listed["d0"]["draining"] and not listed["d1"]["draining"]
        for k in range(4):  # every decode pick goes to d1 now
            body = route(client, request_id=f"dr-new-{k}").json()
            assert body["decode"]["endpoint_id"] == "d1"
        client.post("/v1/requests/dr-1/first_token", json={"observed_ttft_ms": 120.0})
        done = client.post("/v1/requests/dr-1/completed", json={"output_tokens": 30, "observed_tpot_ms": 9.0})
        assert done.json()["samples_recorded"] == 1
        assert "d0" not in {e["id"] for e in client.get("/v1/endpoints").json()}
        page = client.get("/v1/samples", params={"after_seq": before}, headers=AUTH).json()["samples"]
        assert [(s["target"], s["endpoint_id"]) for s in page if s["request_id"] == "dr-1"] == [
            ("ttft", "p0"), ("tpot", "d0")]
        from routing.fleet.registry import Endpoint

        svc.register(Endpoint(id="p9", role="prefill"))
        idle = client.delete("/v1/endpoints/p9", params={"drain": "true"}, headers=AUTH).json()
        assert idle == {"id": "p9", "detached_requests": 0, "draining_requests": 0}  # nothing in flight: gone
        assert client.delete("/v1/endpoints/p9", params={"drain": "true"}, headers=AUTH).status_code == 404


@pytest.mark.parametrize("body, field", [
    pytest.param({"input_tokens": 10, "slo": {"ttft_ms": -5}}, "body.slo.ttft_ms", id="negative SLO"),
    pytest.param({"input_tokens": 10}, "body.slo", id="missing SLO with SLO routing on"),
    pytest.param({"input_tokens": 10, "slo": SLO, "colour": 1}, "body.colour", id="unknown field"),
    pytest.param({"slo": SLO}, "body.input_tokens", id="missing input_tokens"),
    pytest.param({"input_tokens": 10, "slo": SLO, "prefix_cache_hit_frac_by_endpoint": {"p0": 2}},
                 "body.prefix_cache_hit_frac_by_endpoint.p0", id="hit fraction above 1"),
])
def test_bad_input_gets_422_naming_the_field(api, body, field):
    client, _ = api
    resp = client.post("/v1/route", json=body)
    assert resp.status_code == 422
    assert field in [f["field"] for f in resp.json()["fields"]], resp.json()


def test_body_size_limits():
    with serve({"limits": {"max_body_bytes": 2048, "max_model_bytes": 4096}}, fleet=1) as (client, svc):
        big = {"input_tokens": 10, "slo": SLO, "request_id": "x" * 100, "prefix_cache_hit_frac_by_endpoint":
               {f"e{i}": 0.1 for i in range(300)}}
        assert client.post("/v1/route", json=big).status_code == 413

        def chunks():
            yield b'{"input_tokens": 10, "slo": {"ttft_ms": 100}, "request_id": "'
            for _ in range(10):
                yield b"a" * 500
            yield b'"}'

        streamed = client.post("/v1/route", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and "exceeds the limit of 2048" in streamed.json()["message"]
        assert client.post("/v1/models", json=trained_document("big"), headers=AUTH).status_code == 413
        assert client.post("/v1/models", json=linear_document("small"), headers=AUTH).status_code == 201
        assert svc.models.active.version == "small"


def test_no_headroom_is_shed_with_429_and_critical_still_routes():
    with serve(fleet=1) as (client, svc):
        for eid in ("p0", "d0"):
            client.put(f"/v1/endpoints/{eid}/metrics",
                       json={"kv_usage_frac": 0.9, "waiting_requests": 40, "running_requests": 200})
        tight = {"ttft_ms": 5.0, "itl_ms": 1.0}
        shed = client.post("/v1/route", json={"input_tokens": 4000, "slo": tight})
        assert shed.status_code == 429
        assert shed.json()["error"] == "shed" and "no endpoint with headroom" in shed.json()["message"]
        ok = client.post("/v1/route", json={"input_tokens": 4000, "slo": tight, "critical": True})
        assert ok.status_code == 200 and ok.json()["tier"] == "critical_negative"
        text = client.get("/metrics").text
        assert 'router_requests_total{mode="disaggregated",outcome="shed",tier="shed"} 1.0' in text
        assert 'router_active_model{version="profile"} 1.0' in text


def test_topology_fail_is_an_error_to_the_client():
    with serve({"picker": {"topology": {"level": "zone", "policy": "fail"}}}, fleet=0) as (client, svc):
        from routing.fleet.registry import Endpoint

        svc.register(Endpoint(id="p", role="prefill", domains={"zone": "a"}))
        svc.register(Endpoint(id="d", role="decode", domains={"zone": "b"}))
        resp = route(client)
        assert resp.status_code == 503 and resp.json()["error"] == "topology"
        assert "no prefill endpoint shares a zone domain" in resp.json()["message"]


class _VllmMetrics(http.server.BaseHTTPRequestHandler):
    body = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="llama"} 17.0\n'
    )

    def do_GET(self):  # noqa: N802
        data = self.body.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_scraped_vllm_metrics_feed_the_registry():
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _VllmMetrics)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    try:
        with serve({"scrape": {"interval_s": 0.05}}, fleet=0) as (client, _):
            resp = client.put("/v1/endpoints/d-vllm", headers=AUTH, json={
                "role": "decode", "url": f"http://127.0.0.1:{engine.server_port}", "domains": {"zone": "a"}})
            assert resp.status_code == 200 and resp.json()["created"]
            deadline = time.monotonic() + 10
            while True:
                load = client.get("/v1/endpoints").json()[0]["load"]
                if load["metrics_fresh"] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert (load["kv_usage_frac"], load["waiting_requests"], load["running_requests"]) == (0.42, 3, 17)
    finally:
        engine.shutdown()


def test_cli_serves_with_token_from_env_and_refuses_unauthenticated_publish():
    port = free_port()
    env = {**os.environ, "SLA_ROUTER_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_cli.main", "router", "--host", "127.0.0.1", "--port", str(port),
         "--profile-dir", str(PROFILE_DIR), "--log-level", "warning"],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "router did not come up"
            time.sleep(0.1)
        assert httpx.post(f"{url}/v1/models", json=linear_document("cli")).status_code == 401
        assert httpx.post(f"{url}/v1/models", json=linear_document("cli"), headers=AUTH).status_code == 201
        assert httpx.get(f"{url}/v1/models").json()["active"] == "cli"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_cli_startup_fails_clearly_on_a_missing_label_file(tmp_path, capsys):
    from planner_cli.main import main

    cfg = tmp_path / "routing.yaml"
    cfg.write_text(
        f"profile_dir: {PROFILE_DIR}\n"
        "picker: {topology: {level: zone, labels_wait_s: 0.1, labels_poll_s: 0.05}}\n"
        f"endpoints: [{{id: p0, role: prefill, labels_dir: {tmp_path / 'podinfo'}}}]\n"
    )
    assert main(["router", "--config", str(cfg), "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'podinfo' / 'zone'} does not exist after waiting 0.1 s" in err
    cfg.write_text("profile_dir: /x\npicker: {strategy: fastest}\n")
    assert main(["router", "--config", str(cfg)]) == 2
    assert "unknown field 'picker.strategy'" in capsys.readouterr().err


def test_unknown_query_parameter_is_named(api):
    client, _ = api
    resp = client.get("/v1/samples", params={"after_seq": 0, "afterseq": 5}, headers=AUTH)
    assert resp.status_code == 422
    assert resp.json()["fields"] == [{"field": "query.afterseq",
                                      "message": "unknown query parameter (allowed: ['after_seq', 'limit', 'target'])"}]
    assert client.get("/healthz", params={"verbose": 1}).status_code == 422


def test_example_config_parses():
    from planner_cli.router import load_router_config

    cfg = load_router_config(str(PROJECT_ROOT / "configs" / "routing.yaml"), profile_dir=str(PROFILE_DIR))
    assert cfg.picker.topology.level is None and set(cfg.picker.topology.qos) == {"host", "rack", "zone", "none"}


def test_model_swaps_under_traffic_drop_nothing():
    docs = [trained_document(f"swap-{k}", seed=k, scale=1.0 + k) for k in range(2)]
    with serve(fleet=2) as (client, svc):
        seen, statuses, stop = [], [], threading.Event()

        def traffic():
            with httpx.Client(base_url=str(client.base_url), timeout=10) as c:
                k = 0
                while not stop.is_set():
                    r = c.post("/v1/route", json={"request_id": f"swap-r{k}", "input_tokens": 500,
                                                  "slo": SLO, "critical": True})
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        seen.append(r.json()["model_version"])
                        c.post(f"/v1/requests/swap-r{k}/completed", json={"output_tokens": 5})
                    k += 1

        worker = threading.Thread(target=traffic)
        worker.start()
        try:
            for doc in docs:
                time.sleep(0.2)
                assert client.post("/v1/models", json=doc, headers=AUTH).status_code == 201
            time.sleep(0.2)
            assert client.post("/v1/models/rollback", json={}, headers=AUTH).json()["active"] == "swap-0"
            time.sleep(0.2)
        finally:
            stop.set()
            worker.join(timeout=30)
        assert statuses and set(statuses) == {200}
        assert {None, "swap-0", "swap-1"} <= set(seen) <= {None, "swap-0", "swap-1"}
        assert seen[-1] == "swap-0"


def test_lifecycle_events_in_one_batch(api):
    client, _ = api
    ids = [route(client, request_id=f"batch-{k}", critical=True).json()["request_id"] for k in range(2)]
    resp = client.post("/v1/requests/events", json={"events": [
        {"event": "first_token", "request_id": ids[0], "observed_ttft_ms": 70.0},
        {"event": "completed", "request_id": ids[0], "output_tokens": 20, "observed_tpot_ms": 8.0},
        {"event": "completed", "request_id": ids[1], "output_tokens": 1},
        {"event": "completed", "request_id": "never-routed", "output_tokens": 1},
    ]})
    assert resp.status_code == 200
    results = resp.json()["results"]
    assert [(r["status"], r["samples_recorded"]) for r in results] == [(200, 1), (200, 1), (200, 0), (404, 0)]
    assert "unknown request 'never-routed'" in results[3]["error"]
    bad = client.post("/v1/requests/events", json={"events": [{"event": "finished", "request_id": "x"}]})
    assert bad.status_code == 422 and bad.json()["fields"][0]["field"].startswith("body.events.0")
