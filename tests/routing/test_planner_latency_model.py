"""The planner's TTFT from the routing service's published model: a real in-process service over HTTP.

The service (routing.http.app on uvicorn, 127.0.0.1) serves the measured H200 profile; documents are
published through the admin client as the retrain flow publishes them. Linear documents make the
idle-engine TTFT hand-checkable: mean 50 + 0.01 x input_tokens ms, p90 60 + 0.012 x input_tokens ms.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from connectors.config import LatencyModelConfig
from connectors.router_admin import RouterAdminClient
from flows.config import PlannerRunConfig, ReplayInputs
from planner.config import parse_yaml
from routing.http.app import create_app
from routing.config import RouterConfig
from routing.training.export import model_document
from sim.published_ttft import load_ttft_view
from tasks.latency_model import read_ttft_view
from tests.support.fixtures_routing import PROFILE_DIR, TOKEN, RunningServer, free_port, h200_profile, linear

DATA_TOKEN = "planner-data-token-0123456789"
TOKEN_ENV = "PLANNER_LATENCY_MODEL_TEST_TOKEN"
PROFILE = h200_profile()


def document(version: str, *, with_p90: bool = True) -> dict:
    return model_document(
        version=version,
        ttft_mean=linear("ttft", 50.0, input_tokens=0.01),
        ttft_p90=linear("ttft", 60.0, input_tokens=0.012) if with_p90 else None,
        tpot_mean=linear("tpot", 5.0, running_requests=1.0),
        metrics={"ttft_mape": 0.05},
    )


@pytest.fixture
def service():
    """A fresh routing service (no model) with a protected data plane; yields its URL."""
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 1})
    app = create_app(cfg, token=TOKEN, data_token=DATA_TOKEN, profile=PROFILE)
    with RunningServer(app) as server:
        yield server.url


@pytest.fixture
def token_env():
    os.environ[TOKEN_ENV] = DATA_TOKEN
    yield TOKEN_ENV
    os.environ.pop(TOKEN_ENV, None)


def publish(url: str, doc: dict) -> None:
    with RouterAdminClient(url, token=TOKEN) as client:
        client.publish(doc)


def published(url: str, **kw) -> LatencyModelConfig:
    return LatencyModelConfig(**{"source": "published", "router_url": url, "token_env": TOKEN_ENV, **kw})


def test_fresh_model_is_the_view(service, token_env):
    publish(service, document("lin-p90"))
    choice = read_ttft_view(published(service, max_age_s=600.0), PROFILE, now_s=time.time())
    assert choice.source == "published model lin-p90"
    view = choice.view
    lo = view.isl_tokens[0]
    # On a tabulated point the view is the model exactly; between points log-log interpolation of a line.
    assert view.mean_ms[0] == pytest.approx(50.0 + 0.01 * lo)
    assert view.p90_ms[0] == pytest.approx(60.0 + 0.012 * lo)
    assert view.ttft_ms_at(2000.0) == pytest.approx(70.0, rel=2e-3)
    assert view.ttft_ms_at(2000.0, quantile="p90") == pytest.approx(84.0, rel=2e-3)
    assert re.match(r"published \d+ s ago \(max_age_s 600\); idle-engine TTFT mean", choice.reason), choice.reason


def test_stale_model_is_refused_with_its_age(service, token_env):
    publish(service, document("lin-old"))
    choice = read_ttft_view(published(service, max_age_s=3600.0), PROFILE, now_s=time.time() + 7200.0)
    assert choice.view is None and choice.source == "profile"
    assert "published model lin-old is stale: published 720" in choice.reason
    assert "more than max_age_s 3600" in choice.reason


def test_no_model_and_no_p90_fall_back_to_the_profile(service, token_env):
    cfg = published(service)
    none = read_ttft_view(cfg, PROFILE, now_s=time.time())
    assert (none.view, none.reason) == (None, "no latency model is published")
    publish(service, document("lin-mean-only", with_p90=False))
    mean_only = read_ttft_view(cfg, PROFILE, now_s=time.time())
    assert mean_only.view is None
    assert mean_only.reason == "published model lin-mean-only has no TTFT p90 model"


def test_unreadable_service_falls_back_with_the_reason(service, token_env):
    publish(service, document("lin-p90"))
    no_token = read_ttft_view(published(service).model_copy(update={"token_env": None}), PROFILE, now_s=time.time())
    assert no_token.view is None and "HTTP 401" in no_token.reason
    dead = read_ttft_view(published(f"http://127.0.0.1:{free_port()}", timeout_s=2.0), PROFILE, now_s=time.time())
    assert dead.view is None and dead.reason.startswith("published model not read: listing published models")
    unset = read_ttft_view(published(service, token_env="PLANNER_TEST_TOKEN_NOT_SET"), PROFILE, now_s=time.time())
    assert unset.view is None and "HTTP 401" in unset.reason
    assert unset.reason.endswith("(environment variable PLANNER_TEST_TOKEN_NOT_SET is not set)")


def test_an_open_data_plane_needs_no_token(token_env):
    """The token variable unset and the service's data plane open: the model is read without one."""
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 1})
    with RunningServer(create_app(cfg, token=TOKEN, profile=PROFILE)) as server:
        publish(server.url, document("lin-open"))
        choice = read_ttft_view(published(server.url, token_env="PLANNER_TEST_TOKEN_NOT_SET"), PROFILE,
                                now_s=time.time())
    assert choice.source == "published model lin-open"


def test_profile_source_reads_nothing():
    choice = read_ttft_view(LatencyModelConfig(), PROFILE, now_s=0.0)
    assert (choice.view, choice.source, choice.reason) == (None, "profile", "latency_model.source is profile")


PLANNER = "planner: {profile: {dir: /x}}\n"


@pytest.mark.parametrize("section, message", [
    pytest.param("{source: published}", "latency_model: router_url is required when source is "
                 "'published'", id="published without a URL"),
    pytest.param("{source: published, router_url: router:8080}", "router_url must start with http:// or https://",
                 id="URL without a scheme"),
    pytest.param("{source: model}", "latency_model.source: Input should be 'profile' or 'published'",
                 id="unknown source"),
    pytest.param("{max_age_s: -5}", "latency_model.max_age_s: Input should be greater than 0", id="negative age"),
    pytest.param("{max_age: 60}", "unknown field 'latency_model.max_age'", id="misspelt field"),
])
def test_bad_config_is_one_line(section, message):
    with pytest.raises(ValueError) as e:
        parse_yaml(PLANNER + f"latency_model: {section}\n", PlannerRunConfig, source="planner.yaml")
    text = str(e.value)
    assert "\n" not in text and text.startswith("planner.yaml: ") and message in text, text


def test_a_replay_reads_a_document_file(tmp_path):
    """The simulator's what-if input: the same view from a file; a bad file is one line naming it."""
    path = tmp_path / "model.json"
    path.write_text(json.dumps(document("lin-file")))
    view = load_ttft_view(path, PROFILE)
    assert view.source == "published model lin-file"
    assert view.ttft_ms_at(2000.0) == pytest.approx(70.0, rel=2e-3)
    path.write_text(json.dumps(document("lin-file", with_p90=False)))
    with pytest.raises(ValueError, match=f"^{path}: model lin-file has no TTFT p90 model$"):
        load_ttft_view(path, PROFILE)
    with pytest.raises(ValueError, match=f"^{tmp_path / 'missing.json'}: cannot read the latency model"):
        load_ttft_view(tmp_path / "missing.json", PROFILE)


def test_planner_flow_sizes_with_the_published_model_and_says_so(prefect_harness, service, token_env, tmp_path):
    """A dry run against the service: the run's data, decision table and sizing message name the source;
    with the model gone stale (max_age_s 1e-3 s) the same run says why it used the profile."""
    from flows.planner_flow import planner_flow
    from flows.report import artifact_key
    from tests.flows.test_flow_planner import _artifact, _observation

    publish(service, document("lin-p90"))
    cfg = PlannerRunConfig.model_validate({
        "planner": {"namespace": "ttft-ns", "profile": {"dir": str(PROFILE_DIR)}},
        "connector": {"kind": "local", "state_path": str(tmp_path / "fleet.json")},
        "latency_model": {"source": "published", "router_url": service, "token_env": TOKEN_ENV},
    })
    replay = ReplayInputs(observation=_observation(requests=3000.0), now_s=time.time())
    out = planner_flow(config=cfg, replay=replay, dry_run=True)
    assert out["ttft_source"]["source"] == "published model lin-p90"
    rows = {r["item"]: r for r in json.loads(_artifact(artifact_key("decision", "ttft-ns", what_if=True))[0].data)}
    assert rows["prefill TTFT source"]["value"] == "published model lin-p90"
    assert " ".join(rows["prefill replicas for SLA"]["detail"].split()).endswith("TTFT from published model lin-p90")
    stale_cfg = cfg.model_copy(update={"latency_model": cfg.latency_model.model_copy(update={"max_age_s": 1e-3})})
    time.sleep(0.01)
    stale = planner_flow(config=stale_cfg, replay=replay, dry_run=True)
    assert stale["ttft_source"]["source"] == "profile"
    assert stale["ttft_source"]["reason"].startswith("published model lin-p90 is stale")


def test_a_what_if_sizes_prefill_with_the_document(shared_data, tmp_path):
    """5 minutes of Azure conv x4 (independent tenants, +-30 s): a document whose idle-engine TTFT is several
    times the profile's (150 + 0.12 x input_tokens ms: 270 ms at 1000 tokens, the H200 profile 37 ms; the
    correction factor stops at min_factor 0.5) makes the planner hold more prefill GPU-hours than the profile
    does, and every planned interval's reason names the model."""
    from sim.whatif.scenario import WhatIfScenario, run_what_if
    from tests.sim.test_sim_whatif import _small_azure

    slow = model_document(version="slow", ttft_mean=linear("ttft", 150.0, input_tokens=0.12),
                          ttft_p90=linear("ttft", 160.0, input_tokens=0.13), tpot_mean=linear("tpot", 5.0))
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(slow))
    base = dict(trace=str(_small_azure(shared_data, tmp_path, minutes=5)), profile_dir=str(PROFILE_DIR),
                load_multiplier=4, seed=0)
    by_profile, r_profile = run_what_if(WhatIfScenario(**base))
    by_model, r_model = run_what_if(WhatIfScenario(**base, latency_model_path=str(path)))
    assert (by_profile["ttft_source"], by_model["ttft_source"]) == ("profile", "published model slow")
    assert by_model["gpu_hours_by_pool"]["prefill"] > by_profile["gpu_hours_by_pool"]["prefill"]
    planned = [r for r in r_model.timeline.reasons if "TTFT from" in r]
    assert planned and all("TTFT from published model slow" in r for r in planned)
    assert not any("published model" in r for r in r_profile.timeline.reasons)


def test_what_if_command_takes_a_latency_model(shared_data, tmp_path, capsys):
    """`sla-planner what-if --latency-model FILE` names the source in its summary; a bad file is one line, exit 2."""
    from planner_cli.main import main
    from tests.sim.test_sim_whatif import _cli, _small_azure

    trace = _small_azure(shared_data, tmp_path, minutes=3)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(document("lin-cli")))
    assert main(_cli(trace, PROFILE_DIR, "--latency-model", str(path))) == 0
    assert "(prefill TTFT from published model lin-cli)" in capsys.readouterr().out
    assert main(_cli(trace, PROFILE_DIR)) == 0
    assert "(prefill TTFT from profile)" in capsys.readouterr().out
    path.write_text("{not json")
    assert main(_cli(trace, PROFILE_DIR, "--latency-model", str(path))) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sla-planner what-if: {path}: not JSON") and "\n" not in err
