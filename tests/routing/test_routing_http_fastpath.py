"""The hot calls (route, lifecycle events) answered straight from the request guard
must answer exactly as the FastAPI routes declared for them would.

Two services with the same config and seed, one with the fast path and one
with it switched off, get the same requests over real HTTP (uvicorn on
127.0.0.1); status, body and content type must match.
"""

from __future__ import annotations

import contextlib

import httpx
import pytest

from routing.http.app import create_app
from routing.config import RouterConfig
from routing.fleet.registry import Endpoint
from tests.support.fixtures_routing import PROFILE_DIR, TOKEN, RunningServer, h200_profile

SLO = {"ttft_ms": 500.0, "itl_ms": 50.0}
PROFILE = h200_profile()


@contextlib.contextmanager
def serve(*, fast: bool):
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 3,
                                       "limits": {"max_body_bytes": 4096}})
    app = create_app(cfg, token=TOKEN, profile=PROFILE)
    if not fast:
        app.guard.fast_path = None
    svc = app.state.service
    for i in range(2):
        for role in ("prefill", "decode"):
            svc.register(Endpoint(id=f"{role[0]}{i}", role=role, url=None, domains={"zone": "ab"[i]}))
    with RunningServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        yield client, svc


@pytest.fixture(scope="module")
def pair():
    with serve(fast=True) as fast, serve(fast=False) as slow:
        yield fast, slow


# Applied in this order to both services: later calls see the state earlier ones left.
CALLS = [
    pytest.param("/v1/route", {"request_id": "a1", "input_tokens": 1000, "slo": SLO}, id="route: routed"),
    pytest.param("/v1/route", {"request_id": "a1", "input_tokens": 1000, "slo": SLO}, id="route: duplicate id 409"),
    pytest.param("/v1/route", {"input_tokens": 1000}, id="route: no SLO 422 body.slo"),
    pytest.param("/v1/route", {"input_tokens": "12", "slo": SLO}, id="route: string count 422"),
    pytest.param("/v1/route", {"input_tokens": 10, "slo": {"ttft_ms": -1}},
                 id="route: negative SLO 422 body.slo.ttft_ms"),
    pytest.param("/v1/route", {"input_tokens": 10, "slo": SLO, "colour": 1}, id="route: unknown field 422"),
    pytest.param("/v1/route", b"{not json", id="route: invalid JSON 422"),
    pytest.param("/v1/route", {"input_tokens": 10, "slo": SLO, "request_id": "x" * 5000}, id="route: over 4096 B 413"),
    pytest.param("/v1/route?debug=1", {"input_tokens": 10, "slo": SLO}, id="route: unknown query parameter 422"),
    pytest.param("/v1/requests/a1/first_token", {"observed_ttft_ms": 120.0}, id="first_token: 1 sample"),
    pytest.param("/v1/requests/a1/progress", {"tokens_generated": 10, "observed_tpot_ms": 9.0}, id="progress"),
    pytest.param("/v1/requests/zz/completed", {"output_tokens": 5}, id="completed: unknown request 404"),
    pytest.param("/v1/requests/a1/completed", {"output_tokens": True}, id="completed: boolean count 422"),
    pytest.param("/v1/requests/events", {"events": [
        {"event": "completed", "request_id": "a1", "output_tokens": 20, "observed_tpot_ms": 9.5},
        {"event": "completed", "request_id": "a1", "output_tokens": 20}]}, id="events: 200 then 404 inside"),
    pytest.param("/v1/requests/events", {"events": []}, id="events: empty batch 422"),
]


@pytest.mark.parametrize("path, body", CALLS)
def test_fast_path_answers_like_the_routes(pair, path, body):
    (fast, _), (slow, _) = pair
    if isinstance(body, bytes):
        kw = {"content": body, "headers": {"content-type": "application/json"}}
    else:
        kw = {"json": body}
    a, b = fast.post(path, **kw), slow.post(path, **kw)
    assert (a.status_code, a.json()) == (b.status_code, b.json())
    assert a.headers["content-type"] == b.headers["content-type"] == "application/json"
    if a.status_code == 422:
        assert a.json()["fields"] and all(f["field"] for f in a.json()["fields"])


@pytest.mark.parametrize("fast", [pytest.param(True, id="fast path"), pytest.param(False, id="FastAPI route")])
def test_unexpected_error_is_a_json_500_and_the_service_keeps_serving(fast, monkeypatch):
    with serve(fast=fast) as (client, svc):
        monkeypatch.setattr(svc, "first_token", lambda *a, **k: 1 / 0)
        resp = client.post("/v1/requests/r/first_token", json={})
        assert resp.status_code == 500
        assert resp.json() == {"error": "internal_error", "message": "ZeroDivisionError: division by zero",
                               "fields": []}
        # Starlette closes the connection after re-raising to the server: a new one.
        with httpx.Client(base_url=str(client.base_url), timeout=10) as fresh:
            assert fresh.post("/v1/route", json={"input_tokens": 100, "slo": SLO}).status_code == 200


@pytest.mark.parametrize("fast", [pytest.param(True, id="fast path"), pytest.param(False, id="FastAPI route")])
def test_deprecated_tpot_ms_spelling_of_the_slo_is_still_accepted(fast):
    """slo.tpot_ms is the old spelling of slo.itl_ms (accepted for one release): the same pick follows."""
    answers = []
    for slo in ({"ttft_ms": 500.0, "itl_ms": 50.0}, {"ttft_ms": 500.0, "tpot_ms": 50.0}):
        with serve(fast=fast) as (client, svc):
            resp = client.post("/v1/route", json={"request_id": "r1", "input_tokens": 1000, "slo": slo})
            assert resp.status_code == 200, resp.text
            answers.append(resp.json())
            assert svc.registry.in_flight("r1").itl_ms == 50.0
    assert answers[0] == answers[1]
