"""Schema-based fuzzing of the routing API (schemathesis) against uvicorn on 127.0.0.1: never a 5xx.

Every operation is called with generated valid and invalid inputs, both with
the admin token and without it. Checks: no server error, status codes and
bodies as documented, content types. SLO routing is on and the fleet is
large enough that a 503 (no endpoint) cannot happen legitimately.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from routing.http.app import create_app
from routing.config import RouterConfig
from routing.fleet.registry import Endpoint
from tests.support.fixtures_routing import PROFILE_DIR, TOKEN, RunningServer, h200_profile

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _app():
    # Bodies up to 1 MiB reach validation, so oversized negative examples get
    # their 422 (the 413 limit itself is tested in test_routing_http).
    cfg = RouterConfig.model_validate(
        {"profile_dir": str(PROFILE_DIR), "seed": 0, "limits": {"max_body_bytes": 1 << 20}}
    )
    app = create_app(cfg, token=TOKEN, profile=h200_profile())
    for i in range(3):
        for role in ("prefill", "decode", "aggregated"):
            app.state.service.register(Endpoint(id=f"{role}-{i}", role=role, domains={"zone": "a"}))
    return app


APP = _app()
# The schema comes from the app object; the calls go over HTTP to the same app
# under uvicorn. (schemathesis' lazy pytest fixture loader does not run on pytest 9.)
schema = schemathesis.openapi.from_dict(APP.openapi())


@pytest.fixture(scope="module")
def base_url():
    with RunningServer(APP) as server:
        yield server.url


FUZZ = settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
# Model documents are large to generate and to validate: fewer examples, and
# no coverage phase (its boundary cases of every nested field cost seconds).
FUZZ_MODELS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
publish = schemathesis.openapi.from_dict(APP.openapi()).include(path="/v1/models", method="POST")
publish.config.phases.update(phases=["examples", "fuzzing"])
everything_else = schema.exclude(path="/v1/models", method="POST")


def _call(case, base_url, *, token: bool) -> None:
    excluded = []
    if case.operation.path == "/v1/models" and case.operation.method.upper() == "POST":
        # A model document is also checked beyond its JSON schema (equal-length
        # node arrays, child indices forming a tree, finite predictions), so a
        # schema-valid random document is rightly refused with a 422.
        excluded.append(schemathesis.checks.positive_data_acceptance)
    if token:
        case.call_and_validate(base_url=base_url, headers=AUTH, excluded_checks=excluded)
    else:
        case.call_and_validate(base_url=base_url, excluded_checks=[schemathesis.checks.ignored_auth, *excluded])


@everything_else.parametrize()
@FUZZ
def test_api_without_token(case, base_url):
    _call(case, base_url, token=False)


@everything_else.parametrize()
@FUZZ
def test_api_with_token(case, base_url):
    _call(case, base_url, token=True)


@publish.parametrize()
@FUZZ_MODELS
def test_publish_without_token(case, base_url):
    _call(case, base_url, token=False)


@publish.parametrize()
@FUZZ_MODELS
def test_publish_with_token(case, base_url):
    _call(case, base_url, token=True)
