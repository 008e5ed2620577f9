"""Online p90 calibration: the served p90 follows drift so ~90% of outcomes fall below it, per cell."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from routing.config import OnlineCalibrationConfig, RouterConfig
from routing.features import feature_matrix
from routing.models.online_calibration import OnlineCalibration, online_calibration
from routing.picking.picker import RouteRequest
from routing.fleet.registry import Endpoint
from routing.service import RoutingService
from tests.support.fixtures_routing import PROFILE_DIR, h200_profile, linear, linear_document


def calib(**kw) -> OnlineCalibration:
    args = dict(window=10, min_samples=5, max_shift=1.0, queue_edges=(1.0, 4.0), prompt_edges=(1024.0, 4096.0)) | kw
    return OnlineCalibration(**args)


def rows(waiting, input_tokens) -> np.ndarray:
    return feature_matrix("ttft", role="prefill", input_tokens=np.asarray(input_tokens, dtype=float),
                          prefix_cache_hit_frac=0.0, kv_usage_frac=0.0, waiting_requests=np.asarray(waiting, dtype=float),
                          running_requests=0.0, prefill_tokens_in_flight=0.0, decode_tokens_in_flight=0.0,
                          prefill_batch_tokens=0.0, prefill_batch_elapsed_ms=0.0, prefill_queued_tokens=0.0)


@pytest.mark.parametrize("waiting, tokens, cell", [
    (0, 100, 0), (0, 1024, 1), (0, 5000, 2), (1, 100, 3), (3, 4096, 5), (4, 0, 6), (40, 100_000, 8),
])
def test_cells_are_queue_depth_by_prompt_length(waiting, tokens, cell):
    c = calib()
    assert c.n_cells == 9
    assert c.cells(rows([waiting], [tokens]))[0] == cell


def test_a_cells_shift_is_the_conformal_90th_percentile_of_its_last_window_once_it_has_min_samples():
    c = calib()
    assert c.shifts("v1") is None  # a new model starts at 0
    ratios = np.log([1.0, 1.1, 1.2, 1.3])
    assert c.add("ttft", np.full(4, 4), ratios, version="v1") == 4
    assert not c.shifts("v1")["ttft"].any()  # 4 < min_samples
    c.add("ttft", np.array([4]), np.log([1.4]), version="v1")
    # 5 outcomes: rank ceil(6 x 0.9) = 6 -> capped at 5, the largest.
    assert c.shifts("v1")["ttft"][4] == pytest.approx(math.log(1.4))
    # The window keeps the last 10: after ten outcomes of 0.5x the older ones are forgotten.
    c.add("ttft", np.full(10, 4), np.log(np.full(10, 0.5)), version="v1")
    assert c.shifts("v1")["ttft"][4] == pytest.approx(math.log(0.5))
    # Other cells and the other target are untouched.
    assert np.count_nonzero(c.shifts("v1")["ttft"]) == 1 and not c.shifts("v1")["tpot"].any()
    assert c.state()["targets"]["ttft"]["samples"][4] == 15


def test_another_models_outcomes_do_not_count_and_a_new_model_starts_again():
    c = calib()
    c.shifts("v1")
    c.add("tpot", np.zeros(6, dtype=int), np.log(np.full(6, 2.0)), version="v1")
    assert c.add("tpot", np.zeros(6, dtype=int), np.log(np.full(6, 9.0)), version="v0") == 0
    assert c.shifts("v1")["tpot"][0] == pytest.approx(math.log(2.0))
    assert c.shifts("v2") is None
    assert not c.shifts("v2")["tpot"].any()
    assert c.add("tpot", np.zeros(1, dtype=int), np.zeros(1), version="v1") == 0


def test_non_finite_ratios_do_not_count_and_the_shift_stays_within_max_shift():
    c = calib(max_shift=0.5)
    c.shifts("v1")
    assert c.add("ttft", np.zeros(3, dtype=int), np.array([np.nan, np.inf, -np.inf]), version="v1") == 0
    c.add("ttft", np.zeros(6, dtype=int), np.full(6, 3.0), version="v1")
    assert c.shifts("v1")["ttft"][0] == pytest.approx(0.5)
    c.add("ttft", np.zeros(10, dtype=int), np.full(10, -3.0), version="v1")
    assert c.shifts("v1")["ttft"][0] == pytest.approx(-0.5)


@pytest.mark.parametrize("bias", [0.6, 1.0, 1.8])
def test_coverage_converges_to_90_percent_whatever_the_models_bias(bias):
    """Latencies lognormal around 100 ms; the model's p90 is `bias` x the true p90: served coverage ~90%."""
    rng = np.random.default_rng(0)
    c = calib(window=300, min_samples=50)
    c.shifts("v1")
    model_p90 = bias * 100.0 * math.exp(0.3 * 1.2816)
    hits = []
    for i in range(20_000):
        served = model_p90 * math.exp(c.shifts("v1")["ttft"][0])
        y = 100.0 * math.exp(0.3 * rng.standard_normal())
        c.add("ttft", np.zeros(1, dtype=int), np.array([math.log(y / model_p90)]), version="v1")
        if i >= 1000:
            hits.append(y <= served)
    assert 0.88 <= np.mean(hits) <= 0.92
    if bias != 1.0:  # the fixed p90 alone is far off
        fixed = 100.0 * np.exp(0.3 * rng.standard_normal(20_000)) <= model_p90
        assert not 0.85 <= fixed.mean() <= 0.95
    assert c.shifts("v1")["ttft"][0] == pytest.approx(-math.log(bias), abs=0.1)


@pytest.mark.parametrize("bad, message", [
    ({"window": 5}, "window"),
    ({"window": 20, "min_samples": 30}, "min_samples \\(30\\) must be <= window \\(20\\)"),
    ({"queue_edges": [4, 1]}, "queue_edges must be increasing"),
    ({"prompt_edges": [1024, 1024]}, "prompt_edges must be increasing"),
    ({"queue_edges": [-1]}, "queue_edges must be increasing non-negative"),
])
def test_bad_config_is_one_line_naming_the_field(bad, message):
    with pytest.raises(ValidationError, match=message):
        OnlineCalibrationConfig.model_validate(bad)
    assert online_calibration(OnlineCalibrationConfig(enabled=False)) is None


def test_bad_arguments_given_directly_are_refused():
    with pytest.raises(ValueError, match="queue_edges must be increasing"):
        calib(queue_edges=(4.0, 1.0))
    with pytest.raises(ValueError, match="min_samples <= window"):
        calib(min_samples=11)


# -- in the routing service ------------------------------------------------------


def service(**online) -> tuple[RoutingService, list[float]]:
    now = [0.0]
    cfg = RouterConfig(profile_dir=str(PROFILE_DIR), online_calibration=online)
    svc = RoutingService(cfg, profile=h200_profile(), clock=lambda: now[0])
    svc.register(Endpoint(id="p0", role="prefill"))
    svc.register(Endpoint(id="d0", role="decode"))
    # TTFT 50 ms flat, no p90 model: the p90 served is the mean model's (times the online factor).
    svc.publish(linear_document("m1", ttft=linear("ttft", 50.0), tpot=linear("tpot", 5.0)))
    return svc, now


def served_ttft(svc: RoutingService, input_tokens: int = 500) -> float:
    pred = svc.predict(RouteRequest(request_id="q", input_tokens=input_tokens), ["p0"])
    return pred["predictions"][0]["predicted_ttft_ms"]


def run_requests(svc: RoutingService, now: list[float], n: int, *, ttft_ms: float, input_tokens: int = 500) -> None:
    for i in range(n):
        rid = f"r{now[0]:.3f}-{i}"
        svc.dispatched(RouteRequest(request_id=rid, input_tokens=input_tokens), prefill_id="p0", decode_id="d0")
        now[0] += ttft_ms / 1000.0
        svc.first_token(rid, observed_ttft_ms=ttft_ms)
        svc.completed(rid, output_tokens=10, observed_tpot_ms=5.0)
        now[0] += 1.0


def test_service_serves_a_p90_that_catches_up_with_slower_engines():
    svc, now = service()
    assert served_ttft(svc) == pytest.approx(50.0)
    run_requests(svc, now, 200, ttft_ms=80.0)
    # 192 outcomes scored (6 batches of 32; 8 wait for the next), every one 1.6x the model's p90.
    assert served_ttft(svc) == pytest.approx(80.0)
    # The cell of long prompts saw nothing: still the model's 50 ms.
    assert served_ttft(svc, input_tokens=5000) == pytest.approx(50.0)
    state = svc.model_list()["online_calibration"]
    assert state["version"] == "m1"
    assert state["targets"]["ttft"]["samples"][0] == 192 and sum(state["targets"]["ttft"]["samples"]) == 192
    assert state["targets"]["ttft"]["factor"][0] == pytest.approx(1.6, abs=1e-4)
    # TPOT was as predicted (5 ms): factor 1.
    assert state["targets"]["tpot"]["factor"][0] == pytest.approx(1.0)


def test_service_follows_engines_getting_faster_again_within_a_window():
    svc, now = service(window=100, min_samples=50, batch=10)
    run_requests(svc, now, 100, ttft_ms=80.0)
    assert served_ttft(svc) == pytest.approx(80.0)
    run_requests(svc, now, 100, ttft_ms=40.0)
    assert served_ttft(svc) == pytest.approx(40.0)


def test_service_starts_again_at_the_models_own_p90_when_another_model_is_published():
    svc, now = service()
    run_requests(svc, now, 100, ttft_ms=80.0)
    assert served_ttft(svc) == pytest.approx(80.0)
    svc.publish(linear_document("m2", ttft=linear("ttft", 40.0), tpot=linear("tpot", 5.0)))
    assert served_ttft(svc) == pytest.approx(40.0)
    # Outcomes of requests m1 predicted do not count for m2.
    assert sum(svc.model_list()["online_calibration"]["targets"]["ttft"]["samples"]) == 0


def test_disabled_or_mean_prediction_serves_the_model_unchanged():
    svc, now = service(enabled=False)
    run_requests(svc, now, 50, ttft_ms=80.0)
    assert served_ttft(svc) == pytest.approx(50.0)
    assert svc.model_list()["online_calibration"] is None
    cfg = RouterConfig(profile_dir=str(PROFILE_DIR), picker={"slo": {"prediction": "mean"}})
    assert RoutingService(cfg, profile=h200_profile()).predictor.online is None


# -- the held-out p90 as served (retrain evaluation) ---------------------------------------


@pytest.mark.parametrize("batch, row2", [(1, 20.0), (2, 20.0), (3, 10.0)])
def test_served_p90_counts_an_outcome_only_once_it_is_recorded_and_its_batch_is_full(batch, row2):
    from routing.training.online import served_p90

    cfg = OnlineCalibrationConfig(window=10, min_samples=1, batch=batch)
    x = rows([0, 0, 0], [100, 100, 100])
    p90 = np.array([10.0, 10.0, 10.0])
    y = np.array([20.0, 20.0, 20.0])  # every outcome 2x the model's p90
    # Row 0 dispatched at 0, recorded at 10; row 1 dispatched at 5 (row 0 still in flight); row 2 at 11.
    served = served_p90("ttft", x, p90, y, dispatched_s=np.array([0.0, 5.0, 11.0]),
                        recorded_s=np.array([10.0, 10.5, 12.0]), config=cfg)
    assert served.tolist() == pytest.approx([10.0, 10.0, row2])


def test_served_p90_serves_a_row_without_dispatch_time_at_its_record():
    from routing.training.online import served_p90

    cfg = OnlineCalibrationConfig(window=10, min_samples=1, batch=1)
    x, p90, y = rows([0, 0, 0], [100, 100, 100]), np.full(3, 10.0), np.full(3, 20.0)
    late = served_p90("ttft", x, p90, y, dispatched_s=np.array([0.0, np.nan, 13.0]),
                      recorded_s=np.array([10.0, 10.5, 12.0]), config=cfg)
    # Row 1 served at 10.5 (after row 0 counted); row 2's dispatch after its record is not believed.
    assert late.tolist() == pytest.approx([10.0, 20.0, 20.0])
    assert served_p90("ttft", x, p90, y, dispatched_s=np.zeros(3), recorded_s=np.ones(3),
                      config=OnlineCalibrationConfig(enabled=False)) is None
    with pytest.raises(ValueError, match="row counts differ"):
        served_p90("ttft", x, p90[:2], y, dispatched_s=np.zeros(3), recorded_s=np.ones(3), config=cfg)


def test_prepared_samples_carry_each_requests_dispatch_time():
    from routing.training.config import TrainingConfig
    from routing.training.data import prepare_samples
    from tests.retrain.test_retrain_core import sample

    samples = [
        sample("ttft", 200.0, seq=1, recorded_at_s=10.2) | {"request_id": "a"},
        sample("tpot", 5.0, role="decode", seq=2, recorded_at_s=13.0) | {"request_id": "a"},
        sample("tpot", 5.0, role="decode", seq=3, recorded_at_s=14.0) | {"request_id": "orphan"},
    ]
    prepared = prepare_samples(samples, TrainingConfig())
    assert prepared.by_target["ttft"].dispatched_s.tolist() == pytest.approx([10.0])
    tpot = prepared.by_target["tpot"].dispatched_s
    assert tpot[0] == pytest.approx(10.0) and math.isnan(tpot[1])


def test_the_retrain_evaluation_and_model_card_report_coverage_as_served():
    from flows.retrain import model_card
    from routing.training.evaluation import evaluate_all
    from routing.training.gate import decide_publish
    from tests.retrain.test_retrain_core import SMALL, ConstantEstimate, _log_linear_ttft_document

    doc, prepared = _log_linear_ttft_document()
    ev = evaluate_all(prepared, SMALL, candidate_document=doc, current_document=None, estimate=ConstantEstimate())
    for t in ("ttft", "tpot"):
        served = ev.candidate[t]["served"]
        assert 0.0 <= served["p90_coverage"] <= 1.0
        assert all("served" in s for s in ev.candidate[t]["strata"])
    assert ev.metrics()["ttft_served_p90_coverage"] == ev.candidate["ttft"]["served"]["p90_coverage"]
    decision, probed = decide_publish(doc, ev, prepared, SMALL, current_version=None, force=False)
    card = model_card({"router_url": "http://r", "version": "log-linear", "current_version": None,
                       "estimate": "profile:x"}, prepared, SMALL, decision, evaluation=probed)
    assert "| p90 coverage as served |" in card
    queue0 = next(s for s in ev.candidate["ttft"]["strata"] if s["name"] == "queue 0")
    assert f"| {queue0['served']['p90_coverage'] * 100:.1f}% |" in card


def test_the_model_list_over_http_reports_the_online_calibration():
    import httpx

    from routing.http.app import create_app
    from tests.support.fixtures_routing import TOKEN, RunningServer

    cfg = RouterConfig(profile_dir=str(PROFILE_DIR), seed=1,
                       online_calibration={"window": 10, "min_samples": 5, "batch": 1})
    app = create_app(cfg, token=TOKEN, profile=h200_profile())
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with RunningServer(app) as server, httpx.Client(base_url=server.url, timeout=10, headers=auth) as client:
        svc = app.state.service
        svc.register(Endpoint(id="p0", role="prefill"))
        svc.register(Endpoint(id="d0", role="decode"))
        assert client.post("/v1/models", json=linear_document("m1", ttft=linear("ttft", 50.0),
                                                                 tpot=linear("tpot", 5.0))).status_code == 201
        for k in range(5):
            routed = client.post("/v1/route", json={"request_id": f"h{k}", "input_tokens": 500,
                                                    "slo": {"ttft_ms": 500.0, "itl_ms": 50.0}})
            assert routed.status_code == 200, routed.text
            assert client.post(f"/v1/requests/h{k}/first_token", json={"observed_ttft_ms": 90.0}).status_code == 200
        state = client.get("/v1/models").json()["online_calibration"]
    assert state["version"] == "m1" and state["queue_edges"] == [1.0, 4.0] and state["window"] == 10
    ttft = state["targets"]["ttft"]
    # Five outcomes of 90 ms in the queue-0, prompt-<1k cell (cell 0) against the model's 50 ms.
    assert ttft["samples"][0] == 5
    assert ttft["factor"][0] == pytest.approx(1.8, abs=1e-4)
