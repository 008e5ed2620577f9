"""The retrain flow end to end against a running routing service (`sla-planner router` process).

The service records samples from the simulated fleet replaying the Azure
conversation trace (lifecycle calls over HTTP); its latency estimate comes
from aiconfigurator's H100 figures while the fleet runs the measured H200
profile, so a trained model has something to fix. Flows run on Prefect's test
harness. Order matters only through the module fixtures: `first_run` publishes
the first model; every later test reads the served model before acting.
"""

from __future__ import annotations

import base64
import math
import os

import pytest

from connectors.router_admin import RouterAdminClient, RouterRequestError, RouterUnavailableError
from flows import retrain as retrain_mod
from flows.retrain import ARTIFACT_KEY, retrain_flow
from routing.training.config import TrainingConfig
from tasks.retry import NETWORK_RETRY_DELAYS_S, RETRYABLE, retry_if_transient
from tasks.retrain import fetch_current_model, fetch_samples, publish_model, rollback_model
from tests.support.fixtures_net import free_port
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401 - session fixture
from tests.support.fixtures_retrain import (
    ROUTER_PROFILE,
    TOKEN,
    TOKEN_ENV,
    FaultProxy,
    feed_simulated_requests,
    router_process,
    simulated_requests,
)

pytestmark = [pytest.mark.integration]

# 80 s of the Azure conversation trace x2 from minute 5: ~720 requests.
SIM = dict(window_s=80.0, start_s=300.0, load_multiplier=2.0)
TRAINING = TrainingConfig(min_train_samples=300, min_holdout_samples=80, max_iter=80, n_iter_no_change=10)
# Quick to fit, still far better than the estimate: for the runs that force a publish.
FAST = TRAINING.model_copy(update={"max_iter": 25, "learning_rate": 0.3})
# A crippled learner: two-leaf trees, few rounds. Still a model, clearly worse than TRAINING's.
WEAK = TRAINING.model_copy(update={"max_leaf_nodes": 2, "max_iter": 8, "learning_rate": 0.3})
PROBE = {"input_tokens": 3000, "prefix_cache_hit_frac": 0.0}


@pytest.fixture(scope="module")
def token_env():
    old = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = TOKEN
    yield TOKEN_ENV
    if old is None:
        os.environ.pop(TOKEN_ENV, None)
    else:
        os.environ[TOKEN_ENV] = old


@pytest.fixture(scope="module")
def router(tmp_path_factory, token_env):
    # The router refuses a 50 min TTFT at ingest (tests/routing/test_routing_security.py); its plausibility
    # ceiling is opened wide here so the flow's own check meets such samples, as in a store filled
    # by an older router.
    with router_process(tmp_path_factory.mktemp("retrain-router"),
                        extra_yaml="sample_validation: {max_latency_factor: 100000}\n") as r:
        n = feed_simulated_requests(r, simulated_requests(**SIM))
        assert n > 600, f"only {n} simulated requests"
        # Two absurd measurements (50 min TTFT) the flow must drop and count.
        with r.client(admin=False) as c:
            for i in range(2):
                rid = f"absurd-{i}"
                c.post(f"/v1/requests/{rid}/dispatched", json={"prefill_endpoint_id": "prefill-0",
                                                              "decode_endpoint_id": "decode-0", "input_tokens": 500})
                c.post(f"/v1/requests/{rid}/first_token", json={"observed_ttft_ms": 3_000_000}).raise_for_status()
                c.post(f"/v1/requests/{rid}/completed", json={"output_tokens": 1}).raise_for_status()
        yield r


def run(router_url: str, **kw):
    return retrain_flow(router_url=router_url, profile_dir=str(ROUTER_PROFILE), token_env=TOKEN_ENV,
                        **({"training": TRAINING} | kw))


def predict(router) -> dict:
    with router.client() as c:
        resp = c.post("/v1/predict", json=PROBE)
        resp.raise_for_status()
        return resp.json()


def active(router) -> str | None:
    with router.client() as c:
        return c.get("/v1/models").json()["active"]


@pytest.fixture(scope="module")
def first_run(router, prefect_harness):  # noqa: F811
    before = predict(router)
    result = run(router.url)
    return before, result, predict(router)


def test_publishes_a_model_the_service_then_predicts_with(router, first_run):
    before, result, after = first_run
    assert result["decision"] == "publish", result["reason"]
    assert result["published"] and result["active_before"] is None
    version = result["version"]
    assert active(router) == version
    assert before["model_version"] is None and after["model_version"] == version
    # The same request on the same endpoints now gets the model's prediction, not the estimate's.
    b = {p["endpoint_id"]: p for p in before["predictions"]}
    changed = [p["endpoint_id"] for p in after["predictions"]
               if p["predicted_ttft_ms"] is not None
               and abs(p["predicted_ttft_ms"] - b[p["endpoint_id"]]["predicted_ttft_ms"]) > 0.01 * p["predicted_ttft_ms"]]
    assert changed, (before, after)
    with router.client() as c:
        listed = {v["version"]: v for v in c.get("/v1/models").json()["versions"]}
    assert listed[version]["metrics"]["ttft_mape"] == pytest.approx(result["metrics"]["ttft_mape"])
    # It beat the profile estimate on the held-out samples (the gate's floor).
    for t in ("ttft", "tpot"):
        assert result["metrics"][f"{t}_mape"] <= result["metrics"][f"{t}_estimate_mape"]


def test_absurd_latencies_dropped_and_counted(first_run):
    _, result, _ = first_run
    assert result["dropped"]["ttft"]["absurd_latency"] == 2
    assert sum(result["dropped"]["tpot"].values()) == 0


def model_cards() -> list[str]:
    """Every model card artifact's Markdown, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        cards = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[ARTIFACT_KEY])),
                                      sort=ArtifactSort.CREATED_DESC)
    return [a.data for a in reversed(cards)]


def test_model_card_artifact(first_run):
    _, result, _ = first_run
    card = next(c for c in model_cards() if result["version"] in c)
    assert f"# Latency model {result['version']}: PUBLISHED" in card
    for needle in ("## Samples", "absurd_latency 2", "## Held-out comparison", "| ttft | candidate |",
                   "| ttft | profile estimate |", "## Per load bucket", "waiting_requests = 0", "running_requests",
                   "p90 calibration factor"):
        assert needle in card, needle
    png = base64.b64decode(card.split("data:image/png;base64,", 1)[1].split(")", 1)[0])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_worse_model_refused_and_served_model_unchanged(router, first_run):
    served, before = active(router), predict(router)
    result = run(router.url, training=WEAK)
    assert result["decision"] == "refused_current", result["reason"]
    assert not result["published"] and result["active_after"] == served
    assert active(router) == served and predict(router) == before


def test_model_off_the_probe_grid_refused_even_forced_and_the_card_says_where(router, first_run):
    """A ceiling of 0.05 x the largest training TTFT: the fitted trees predict more than that under load
    somewhere on the grid, so the run refuses, forced or not, and says which probe failed."""
    served, before = active(router), predict(router)
    result = run(router.url, force=True, training=FAST.model_copy(update={"probe_ceiling_factor": 0.05}))
    assert result["decision"] == "refused_probe", result["reason"]
    assert result["reason"].startswith("probe grid: ") and "above the ceiling, at input_tokens=" in result["reason"]
    assert "0.05 x the largest training" in result["reason"] and "\n" not in result["reason"]
    assert not result["published"] and active(router) == served and predict(router) == before
    card = next(c for c in model_cards() if result["version"] in c)
    assert ": REFUSED" in card and f"`refused_probe`: {result['reason']}" in card and "## Probe grid" in card


def test_too_few_samples_skips_with_the_reason(router, first_run):
    served = active(router)
    result = run(router.url, training=TRAINING.model_copy(update={"min_train_samples": 1_000_000}))
    assert result["decision"] == "skipped" and "too few samples" in result["reason"]
    assert active(router) == served


def test_routing_down_at_publish_retries_then_fails_visibly(router, first_run, monkeypatch):
    served, before = active(router), predict(router)
    # Same retry count as deployed, shorter waits.
    monkeypatch.setattr(retrain_mod, "publish_model", publish_model.with_options(retry_delay_seconds=[0.1] * 3))
    with FaultProxy(router.url) as proxy:
        proxy.mode = "drop_request"
        state = run(proxy.url, force=True, training=FAST, return_state=True)
    assert state.is_failed()
    assert "publishing model" in state.message or "publishing model" in str(state.result(raise_on_failure=False))
    assert proxy.publish_attempts == 1 + len(NETWORK_RETRY_DELAYS_S)
    assert active(router) == served and predict(router) == before
    failed_cards = [c for c in model_cards() if ": PUBLISH FAILED" in c]
    assert failed_cards and f"The served model is unchanged ({served})" in failed_cards[-1]


def test_lost_publish_answer_is_retried_then_rolled_back(router, first_run, monkeypatch):
    served = active(router)
    monkeypatch.setattr(retrain_mod, "publish_model", publish_model.with_options(retry_delay_seconds=[0.1] * 3))
    with FaultProxy(router.url) as proxy:
        proxy.mode, proxy.faults = "drop_response", 1  # the router accepts it; the answer is lost once
        result = run(proxy.url, force=True, training=FAST)
    assert result["decision"] == "publish_forced" and result["published"], result
    assert proxy.publish_attempts == 2  # the retry met 409 and found its own document there
    assert active(router) == result["version"] != served
    back = retrain_flow(router_url=router.url, token_env=TOKEN_ENV, rollback=True)
    assert back["decision"] == "rollback" and back["active"] == served
    assert active(router) == served


def test_missing_token_fails_at_once_naming_the_variable(router, first_run):
    state = retrain_flow(router_url=router.url, profile_dir=str(ROUTER_PROFILE), token_env="RETRAIN_TEST_UNSET_TOKEN",
                         return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="environment variable RETRAIN_TEST_UNSET_TOKEN is not set"):
        state.result()


def test_samples_over_http_equal_the_in_process_recording(router):
    from sim.samples import record_samples

    with RouterAdminClient(router.url, token=TOKEN) as client:
        served = [s for page in client.iter_sample_pages(limit=500) for s in page["samples"]]
    local = record_samples(simulated_requests(**SIM), profile_dir=str(ROUTER_PROFILE))
    served = [s for s in served if not s["request_id"].startswith("absurd-")]
    assert len(served) == len(local)
    for a, b in zip(served, local):
        assert (a["target"], a["request_id"], a["endpoint_id"], a["role"]) == (
            b["target"], b["request_id"], b["endpoint_id"], b["role"])
        # Clock-valued features differ: the HTTP service runs on the wall clock and the
        # replay sends its calls as fast as it can, the in-process recording on the simulated clock.
        clocked = {"prefill_batch_elapsed_ms"}
        assert {k: v for k, v in a["features"].items() if k not in clocked} == pytest.approx(
            {k: v for k, v in b["features"].items() if k not in clocked}, rel=1e-12)
        assert all(math.isfinite(a["features"][k]) and a["features"][k] >= 0 for k in clocked)
        assert a["observed_ms"] == pytest.approx(b["observed_ms"], rel=1e-9)


# -- the connector and the retry policy ---------------------------------------------------


def test_io_tasks_retry_only_transient_errors():
    for t in (fetch_samples, fetch_current_model, publish_model, rollback_model):
        assert t.retries == len(NETWORK_RETRY_DELAYS_S) and t.retry_delay_seconds == NETWORK_RETRY_DELAYS_S
        assert t.retry_condition_fn is retry_if_transient
    assert issubclass(RouterUnavailableError, RETRYABLE) and not issubclass(RouterRequestError, RETRYABLE)


def test_client_errors_name_the_problem(router):
    with RouterAdminClient(router.url, token="wrong-token") as client:
        with pytest.raises(RouterRequestError, match=r"reading training samples: GET .*/v1/samples: HTTP 401") as e:
            next(client.iter_sample_pages())
    assert e.value.status == 401
    dead = f"http://127.0.0.1:{free_port()}"
    with RouterAdminClient(dead, token=TOKEN) as client, pytest.raises(RouterUnavailableError, match="listing published"):
        client.models()
    with RouterAdminClient(router.url, token=TOKEN) as client, pytest.raises(RouterRequestError) as e:
        client.publish({"format": "sla-planner/latency-model", "format_version": 1, "version": "bad", "targets": {}})
    assert e.value.status == 422 and "publishing model bad" in str(e.value)
    with pytest.raises(ValueError, match="must start with http"):
        RouterAdminClient("127.0.0.1:8080", token=TOKEN)
