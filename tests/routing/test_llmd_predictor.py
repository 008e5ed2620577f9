"""llm-d's latency-predictor API on the routing service: proven by llm-d's own sidecar test suite, plus ours.

The suite (`../shared/llmd/predictor/test_dual_server_client.py`, llm-d-latency-predictor @ 04e44cd8,
verbatim, never copied into the project) runs unmodified against `sla-planner router --llmd-listen`, as a
separate pytest process with llm-d's two URL variables pointing at our one listener. The tests it runs
but we do not pass are deselected by name below, each with its reason; docs/llmd.md lists the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import numpy as np
import pytest

from routing.config import RouterConfig, listen_address
from routing.features import FEATURE_SETS, RAW_FIELDS
from routing.llmd.app import create_llmd_app
from routing.llmd.sidecar import LLMD_SOURCE, LatencyPredictorSidecar
from routing.service import RoutingService
from routing.training.export import model_document
from tests.conftest import PROJECT_ROOT
from tests.support.fixtures_routing import PROFILE_DIR, RunningServer, free_port, h200_profile, linear_document

CLI = Path(sys.executable).with_name("sla-planner")
SUITE = PROJECT_ROOT.parent / "shared" / "llmd" / "predictor" / "test_dual_server_client.py"
_ENUM = "asserts model_type is one of llm-d's own (bayesian_ridge, xgboost, lightgbm); ours names its model " \
        "for what it is (hist_gradient_boosting, linear, or profile_estimate before a model is published)"
_RETRAIN = "needs retraining inside the sidecar seconds after rows are posted (it watches llm-d's model files " \
           "grow, then calls /reload); here training is the retrain flow's, gated, on its schedule"
DESELECTED = {
    "test_prediction_server_status": _ENUM,
    "test_training_server_model_info": _ENUM,
    "test_training_server_models_list": "asserts llm-d's model file names (ttft_gated, tpot_gated: the files of "
                                        "its two-regime ensemble); ours lists ttft and tpot",
    "test_training_server_metrics": "asserts llm-d's metric names (model_type{}, *_importance{} or *_coef{}, "
                                    "ensemble_*); /metrics here is the routing service's own exposition",
    "test_model_export": "asserts a tar.gz of joblib pickles; our models are JSON documents, never pickled",
    "test_dual_server_quantile_regression_learns_distribution_stress": _RETRAIN + "; also " + _ENUM,
    "test_tif_features_mean_learns_equation_stress": "mean objective only (it skips under quantile); " + _RETRAIN,
    "test_tif_features_quantile_learns_distribution_stress": _RETRAIN,
}
ROW = {"kv_cache_percentage": 0.4, "input_token_length": 900, "num_request_waiting": 2, "num_request_running": 3,
       "num_tokens_generated": 1, "prefix_cache_score": 0.25, "prefill_tokens_in_flight": 4000,
       "decode_tokens_in_flight": 9000}


def set1_linear(target: str, intercept: float, **coefs: float) -> dict:
    names = FEATURE_SETS[1][target]
    return {"kind": "linear", "link": "identity", "intercept": intercept,
            "coef": [float(coefs.get(n, 0.0)) for n in names]}


def set1_document(version: str) -> dict:
    """TTFT = 40 + 0.01 prefill_tokens_in_flight + 0.02 input_tokens; TPOT = 6 + 0.5 running (feature set 1)."""
    return model_document(
        version=version, feature_set=1,
        ttft_mean=set1_linear("ttft", 40.0, prefill_tokens_in_flight=0.01, input_tokens=0.02),
        ttft_p90=set1_linear("ttft", 60.0, prefill_tokens_in_flight=0.01, input_tokens=0.02),
        tpot_mean=set1_linear("tpot", 6.0, running_requests=0.5),
        tpot_p90=set1_linear("tpot", 8.0, running_requests=0.5))


@pytest.fixture()
def llmd(tmp_path):
    """A routing service and its llm-d API on 127.0.0.1 (uvicorn in a thread)."""
    cfg = RouterConfig(profile_dir=str(PROFILE_DIR), samples={"capacity": 5000})
    service = RoutingService(cfg, profile=h200_profile())
    with RunningServer(create_llmd_app(LatencyPredictorSidecar(service), address="http://test")) as server:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            yield service, client


def test_llmd_sidecar_suite_runs_unmodified_against_our_router(tmp_path):
    """llm-d's functional and stress tests against `sla-planner router --llmd-listen`: every test not
    deselected passes, none skips (its ready-check skips everything when the servers never answer)."""
    assert SUITE.is_file(), f"llm-d's sidecar suite not found at {SUITE}: tests need ../shared beside the project"
    port = free_port()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    router = subprocess.Popen(
        [str(CLI), "router", "--port", str(free_port()), "--profile-dir", str(PROFILE_DIR),
         "--llmd-listen", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert router.poll() is None, f"router exited: {router.stdout.read()}"
            assert time.monotonic() < deadline, "the llm-d listener never answered /readyz"
            time.sleep(0.2)
        report = tmp_path / "suite.xml"
        deselect = [f"--deselect={SUITE.name}::{name}" for name in DESELECTED]
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(SUITE.parent),
             "-c", os.devnull, f"--junitxml={report}", str(SUITE), *deselect],
            cwd=tmp_path, env={**env, "PREDICTION_SERVER_URL": url, "TRAINING_SERVER_URL": url},
            capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        suite = ET.parse(report).getroot().find("testsuite")
        counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
        assert counts == {"tests": 33, "failures": 0, "errors": 0, "skipped": 0}, counts
    finally:
        router.terminate()
        router.wait(timeout=20)


def test_the_docs_list_every_deselected_test_with_its_reason():
    doc = (PROJECT_ROOT / "docs" / "llmd.md").read_text()
    missing = [name for name in DESELECTED if f"`{name}`" not in doc]
    assert missing == [], "docs/llmd.md does not list these deselected llm-d tests"


def test_before_a_model_the_profile_estimate_answers_and_says_so(llmd):
    service, client = llmd
    rows = [ROW, {**ROW, "pod_type": "prefill"}, {**ROW, "pod_type": "decode"}]
    body = client.post("/predict/bulk/strict", json={"requests": rows}).json()
    preds = body["predictions"]
    assert [p["model_type"] for p in preds] == ["profile_estimate"] * 3
    assert all(p["ttft_ms"] > 0 for p in preds)
    assert preds[1]["tpot_ms"] == 0.0 and preds[0]["tpot_ms"] > 0 and preds[2]["tpot_ms"] > 0
    # The estimate's p90 is its mean (an estimate has no spread).
    assert preds[0]["ttft_ms"] == preds[0]["ttft_mean_ms"]
    status = client.get("/status").json()
    assert status["models_exist"] == {"ttft_model": False, "tpot_model": False}
    assert "no model is published" in status["serving"]


def test_a_feature_set_1_model_is_served_as_our_picker_would_serve_it(llmd):
    service, client = llmd
    service.publish(set1_document("llmd-1"))
    body = client.post("/predict/bulk/strict", json={"requests": [ROW, {**ROW, "num_request_running": 9}]}).json()
    p = body["predictions"]
    assert p[0]["model_type"] == "linear" and p[0]["model_version"] == "llmd-1"
    # p90: 60 + 0.01 * 4000 + 0.02 * 900 = 118 ms; mean 98 ms; TPOT p90 8 + 0.5 * 3 = 9.5, then 12.5 at 9 running.
    assert p[0]["ttft_ms"] == pytest.approx(118.0) and p[0]["ttft_mean_ms"] == pytest.approx(98.0)
    assert p[0]["tpot_ms"] == pytest.approx(9.5) and p[1]["tpot_ms"] == pytest.approx(12.5)
    info = client.get("/model/download/info").json()
    assert info["model_status"] == {"ttft": True, "tpot": True} and info["model_type"] == "linear"
    assert client.get("/model/ttft/download").json()["version"] == "llmd-1"


def test_a_model_needing_fields_llmd_does_not_send_is_not_served(llmd):
    """Feature set 2 reads the running prefill batch, which an EPP's rows do not carry: the estimate serves."""
    service, client = llmd
    service.publish(linear_document("set2-1"))
    status = client.get("/status").json()
    assert status["model_type"] == "profile_estimate"
    assert "feature set 2" in status["serving"] and "prefill_batch_tokens" in status["serving"]


def test_training_rows_become_samples_scored_against_the_served_model(llmd):
    service, client = llmd
    service.publish(set1_document("llmd-1"))
    entries = [{**ROW, "actual_ttft_ms": 150.0, "actual_tpot_ms": 0.0},
               {**ROW, "pod_type": "decode", "actual_ttft_ms": 0.0, "actual_tpot_ms": 11.0,
                "num_tokens_generated": 120, "timestamp": "2026-11-29T10:00:00Z"},
               {**ROW, "pod_type": "prefill", "actual_ttft_ms": 90.0, "actual_tpot_ms": 5.0}]
    r = client.post("/add_training_data_bulk", json={"entries": entries})
    assert r.status_code == 202 and r.json()["message"] == "Accepted 3 training samples."
    samples = service.samples.page(after_seq=0, limit=10).samples
    # Three TTFT/TPOT samples: a prefill pod's TPOT is not one (it decodes nothing).
    assert sorted((s["target"], s["role"]) for s in samples) == [
        ("tpot", "decode"), ("ttft", "aggregated"), ("ttft", "prefill")]
    tpot = next(s for s in samples if s["target"] == "tpot")
    assert tpot["endpoint_id"] == LLMD_SOURCE and tpot["model_version"] == "llmd-1"
    assert tpot["features"]["tokens_generated"] == 120 and tpot["features"]["running_requests"] == 3
    assert tpot["predicted_ms"] == pytest.approx(9.5) and tpot["recorded_at_s"] == pytest.approx(1795946400.0)
    assert set(RAW_FIELDS) <= set(tpot["features"])
    status = client.get("/data/status").json()
    assert status["training_data"]["total_samples"] == 3


def test_flush_drops_only_what_llmd_posted(llmd):
    from routing.fleet.requests import Sample

    service, client = llmd
    own = Sample(target="ttft", request_id="r1", endpoint_id="pf-0", role="prefill",
                 features={f: 1.0 for f in RAW_FIELDS}, observed_ms=100.0, predicted_ms=None, model_version=None,
                 recorded_at_s=1.0)
    service.samples.add(own)
    client.post("/add_training_data_bulk", json={"entries": [{**ROW, "actual_ttft_ms": 120.0, "actual_tpot_ms": 9.0}]})
    assert len(service.samples) == 3
    out = client.post("/flush", json={"flush_training_data": True, "flush_test_data": True,
                                      "flush_metrics": False, "reason": "t"}).json()
    assert out["ttft_training_samples_flushed"] == 1 and out["tpot_training_samples_flushed"] == 1
    assert "Successfully flushed 2" in out["message"] and out["metrics_cleared"] is False
    assert [s["endpoint_id"] for s in service.samples.page(after_seq=0).samples] == ["pf-0"]


def test_implausible_rows_are_refused_and_counted(llmd):
    service, client = llmd
    ceiling = service.latency_bounds_ms("ttft")[1]
    r = client.post("/add_training_data_bulk", json={"entries": [
        {**ROW, "actual_ttft_ms": ceiling * 10, "actual_tpot_ms": 0.0},
        {**ROW, "actual_ttft_ms": 100.0, "actual_tpot_ms": 0.0}]})
    assert r.status_code == 202
    assert r.json() == {"message": "Accepted 1 training samples.", "refused_entries": 1}
    assert client.get("/data/status").json()["since_start"]["refused"]["implausible"] == 1


@pytest.mark.parametrize("path", ["/predict/bulk/strict", "/predict/bulk"])
def test_a_malformed_row_fails_the_call_on_both_bulk_routes_naming_the_field(llmd, path):
    """As llm-d's own servers do: the body's schema is checked before any row is predicted."""
    _, client = llmd
    bad = {k: v for k, v in ROW.items() if k != "prefix_cache_score"}
    r = client.post(path, json={"requests": [ROW, bad]})
    assert r.status_code == 422
    assert r.json()["message"] == "requests.1.prefix_cache_score: Field required"
    assert r.json()["detail"][0]["loc"] == ["body", "requests", 1, "prefix_cache_score"]


def test_a_row_we_cannot_serve_fails_a_strict_call_and_only_itself_in_a_lenient_one(llmd):
    _, client = llmd
    rows = [ROW, {**ROW, "pod_type": "encode"}, ROW]
    strict = client.post("/predict/bulk/strict", json={"requests": rows})
    assert strict.status_code == 422
    assert strict.json()["message"].startswith("requests[1].pod_type: 'encode' is not a role")
    lenient = client.post("/predict/bulk", json={"requests": rows}).json()
    assert [p is None for p in lenient["predictions"]] == [False, True, False]
    assert lenient["successful_predictions"] == 2 and lenient["failed_predictions"] == 1
    assert lenient["errors"][0]["index"] == 1 and "pod_type" in lenient["errors"][0]["error"]


def test_the_listener_address_is_checked_and_defaults_to_loopback():
    assert listen_address(":8000") == ("127.0.0.1", 8000)
    assert listen_address("0.0.0.0:9000") == ("0.0.0.0", 9000)
    with pytest.raises(ValueError, match="llm-d listener 'localhost': expected HOST:PORT"):
        RouterConfig(profile_dir="x", llmd={"listen": "localhost"})
    bad = subprocess.run([str(CLI), "router", "--profile-dir", str(PROFILE_DIR),
                          "--llmd-listen", "127.0.0.1:0"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("sla-planner router: ") and "llm-d listener" in bad.stderr


def test_bulk_predictions_are_the_same_rows_as_single_ones(llmd):
    _, client = llmd
    rows = [{**ROW, "num_request_waiting": w, "input_token_length": n} for w, n in [(0, 10), (5, 4000), (40, 100)]]
    bulk = client.post("/predict/bulk/strict", json={"requests": rows}).json()["predictions"]
    single = [client.post("/predict", json=r).json() for r in rows]
    assert np.allclose([b["ttft_ms"] for b in bulk], [s["ttft_ms"] for s in single])
    assert bulk[1]["ttft_ms"] > bulk[0]["ttft_ms"]  # more queued prompt work ahead, longer TTFT
