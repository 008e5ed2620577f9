"""Relative latency models: trained on latency / profile estimate, served as ratio x the router's estimate.

The estimate extrapolates with load (a queue twice as long, twice the wait), where trees stay flat at
the most load training saw; the trees correct the estimate's bias. Real scikit-learn fits on synthetic
rows, a real profile, a real in-process routing service.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from routing.features import FEATURES
from routing.training.export import to_document
from routing.models.validated import document_predictions, parse_model_document
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from routing.training.config import TrainingConfig
from routing.training.data import TargetData
from routing.training.fit import fit_target
from routing.training.split import time_split

PROFILE_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
pytestmark = pytest.mark.skipif(not PROFILE_DIR.exists(), reason="profile data not found")
CFG = TrainingConfig(max_iter=60, min_train_samples=20, min_holdout_samples=10, relative_to_estimate="always")


@pytest.fixture(scope="module")
def estimate():
    return ProfileEstimator(load_profile_dir(PROFILE_DIR))


def rows(target: str, n: int, *, max_waiting: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = FEATURES[target]
    x = np.zeros((n, len(cols)))
    x[:, cols.index("input_tokens")] = rng.uniform(100, 4000, n)
    waiting = rng.integers(0, max_waiting + 1, n)
    x[:, cols.index("waiting_requests")] = waiting
    x[:, cols.index("prefill_tokens_in_flight")] = waiting * rng.uniform(500, 2000, n)
    x[:, cols.index("running_requests")] = rng.integers(0, 40, n)
    x[:, cols.index("decode_tokens_in_flight")] = x[:, cols.index("running_requests")] * 1500
    x[:, cols.index("role_prefill" if target == "ttft" else "role_decode")] = 1.0
    return x


def data(target: str, estimate, *, n: int = 3000, max_waiting: int = 3, seed: int = 0) -> TargetData:
    """Latency = 1.3 x the estimate (a biased profile), 3% lognormal noise."""
    x = rows(target, n, max_waiting=max_waiting, seed=seed)
    est = estimate.predict(target, x)
    y = 1.3 * est * np.random.default_rng(seed + 1).lognormal(0, 0.03, n)
    return TargetData(target, x, y, np.arange(n, dtype=float), np.arange(n), {}, estimate_ms=est,
                      estimate_name=f"profile:{estimate.name}")


@pytest.fixture(scope="module")
def document(estimate):
    models = {}
    for t in ("ttft", "tpot"):
        d = data(t, estimate)
        models[t] = fit_target(d, time_split(d.n, holdout_frac=0.2, calibration_frac=0.1), CFG)
    return to_document(models, version="relative-1", metrics={}), models


def test_relative_document_serves_ratio_times_the_estimate_exactly_as_fitted(document, estimate):
    doc, models = document
    assert doc["base"] == f"profile:{estimate.name}" and models["ttft"].base == doc["base"]
    for t in ("ttft", "tpot"):
        x = rows(t, 500, max_waiting=3, seed=9)
        est = estimate.predict(t, x)
        mean, p90 = models[t].predict(x, est)
        d_mean, d_p90 = document_predictions(doc, t, x, estimate)
        np.testing.assert_allclose(d_mean, mean, rtol=1e-9)
        np.testing.assert_allclose(d_p90, p90, rtol=1e-9)
        # The trees learned the 1.3 bias.
        assert np.median(mean / est) == pytest.approx(1.3, rel=0.03)
    with pytest.raises(ValueError, match="relative to profile:.*given no estimate"):
        document_predictions(doc, "ttft", x)


def test_relative_model_follows_the_estimate_past_the_load_it_was_trained_on(estimate):
    # Trained with at most 3 waiting requests; asked about 12 (four times the queue ahead).
    cfg = CFG.model_copy(update={"max_iter": 100})
    d = data("ttft", estimate, max_waiting=3)
    split = time_split(d.n, holdout_frac=0.2, calibration_frac=0.1)
    absolute = fit_target(d, split, cfg.model_copy(update={"relative_to_estimate": "never"}))
    relative = fit_target(d, split, cfg)
    x = rows("ttft", 2000, max_waiting=12, seed=3)
    deep = x[:, FEATURES["ttft"].index("waiting_requests")] >= 8
    est = estimate.predict("ttft", x)
    truth = 1.3 * est
    ape_rel = np.abs(relative.predict(x, est)[0] - truth) / truth
    ape_abs = np.abs(absolute.predict(x)[0] - truth) / truth
    assert ape_rel[deep].mean() < 0.03 < ape_abs[deep].mean()


def test_router_multiplies_by_its_estimate_and_refuses_another_estimate(document, estimate):
    from routing.config import RouterConfig
    from routing.service import RoutingService

    doc, models = document
    service = RoutingService(RouterConfig(profile_dir=str(PROFILE_DIR)), profile=load_profile_dir(PROFILE_DIR),
                             clock=lambda: 0.0)
    other = dict(doc, version="relative-other", base="profile:some-other-gpu")
    with pytest.raises(ValueError, match="base: the model is relative to 'profile:some-other-gpu', this "
                                         "router's estimate is 'profile:"):
        service.publish(other)
    assert service.models.active is None
    service.publish(doc)
    pinned = service.predictor.snapshot()
    x = rows("ttft", 50, max_waiting=3, seed=4)
    np.testing.assert_allclose(pinned.predict("ttft", x),
                               parse_model_document(doc).predict("ttft", x, quantile="p90")
                               * estimate.predict("ttft", x), rtol=1e-12)


@pytest.mark.parametrize("budget, name", [
    pytest.param(4096, "profile:H200_TP1P_TP1D;budget=4096", id="another token budget"),
    pytest.param(None, "profile:H200_TP1P_TP1D", id="no budget (all queued work as one batch)"),
])
def test_a_router_with_another_token_budget_refuses_the_model(document, budget, name):
    from routing.config import RouterConfig
    from routing.service import RoutingService

    doc, _ = document
    assert doc["base"] == "profile:H200_TP1P_TP1D;budget=8192"  # the estimate the model was fitted on
    service = RoutingService(RouterConfig(profile_dir=str(PROFILE_DIR), prefill_token_budget=budget),
                             profile=load_profile_dir(PROFILE_DIR), clock=lambda: 0.0)
    assert service.estimate_name == name
    with pytest.raises(ValueError, match=f"this router's estimate is '{re.escape(name)}'"):
        service.publish(doc)
    assert service.models.active is None


def test_router_config_refuses_a_token_budget_below_one():
    from pydantic import ValidationError

    from routing.config import RouterConfig

    with pytest.raises(ValidationError, match="prefill_token_budget"):
        RouterConfig(profile_dir=str(PROFILE_DIR), prefill_token_budget=0)


def test_a_retained_relative_model_of_another_estimate_is_not_served(document, estimate):
    class Store:
        active = parse_model_document(dict(document[0], base="profile:some-other-gpu"))

    pinned = LatencyPredictor(estimate=estimate, models=Store()).snapshot()
    assert pinned.version is None and pinned.model is estimate


@pytest.mark.parametrize("bias, kind", [
    pytest.param(lambda x: 1.3, "flat", id="ratio 1.3 everywhere: the estimate x a factor is the p90"),
    pytest.param(lambda x: 1.0 + 0.25 * x[:, FEATURES["ttft"].index("waiting_requests")], "trees",
                 id="ratio 1 + 0.25 per waiting request: trees needed"),
])
def test_p90_trees_kept_only_when_they_beat_the_flat_p90_on_newer_rows(estimate, bias, kind):
    d = data("ttft", estimate)
    y = d.y_ms / 1.3 * bias(d.x)
    d = TargetData("ttft", d.x, y, d.recorded_at_s, d.seq, {}, estimate_ms=d.estimate_ms, estimate_name=d.estimate_name)
    split = time_split(d.n, holdout_frac=0.2, calibration_frac=0.2)
    # The point model's own choice is tested below: here the point stays trees, the p90 alone is chosen.
    m = fit_target(d, split, CFG.model_copy(update={"calibration_frac": 0.2, "point_select": False}))
    assert m.p90_kind == kind, m.p90_selection
    other = "trees" if kind == "flat" else "flat"
    assert m.p90_selection[kind] < m.p90_selection[other]
    # Served as chosen, and still covers ~90% of the held-out rows.
    doc = to_document({"ttft": m, "tpot": m_tpot(estimate)}, version="sel", metrics={})
    h = split.holdout
    _, p90 = document_predictions(doc, "ttft", d.x[h], estimate)
    np.testing.assert_allclose(p90, m.predict(d.x[h], d.estimate_ms[h])[1], rtol=1e-9)
    assert 0.84 <= np.mean(d.y_ms[h] <= p90) <= 0.96


def _with_ratio(d: TargetData, ratio: np.ndarray) -> TargetData:
    return TargetData(d.target, d.x, d.estimate_ms * ratio, d.recorded_at_s, d.seq, {}, estimate_ms=d.estimate_ms,
                      estimate_name=d.estimate_name)


def test_point_trees_are_kept_only_when_they_beat_the_flat_point_on_newer_rows(estimate):
    d = data("tpot", estimate, seed=4)
    running = d.x[:, FEATURES["tpot"].index("running_requests")]
    noise = np.random.default_rng(5).lognormal(0, 0.03, d.n)
    split = time_split(d.n, holdout_frac=0.2, calibration_frac=0.2)
    cfg = CFG.model_copy(update={"calibration_frac": 0.2})
    # The training window ran 1 + 2% per running request over the estimate; the newer rows run a flat 1.2:
    # trees carry the old pattern, the estimate x the median ratio of the older calibration half does not.
    drifted = np.where(np.arange(d.n) < split.train.stop, 1 + 0.02 * running, 1.2) * noise
    m = fit_target(_with_ratio(d, drifted), split, cfg)
    assert m.mean_kind == "flat" and m.p90_kind == "flat", m.point_selection
    assert m.point_selection["flat"] < 0.05 < m.point_selection["trees"]
    assert m.iterations["mean"] == 0 and m.base == d.estimate_name
    h = split.holdout
    doc = to_document({"tpot": m, "ttft": fit_target(data("ttft", estimate, n=600), time_split(
        600, holdout_frac=0.2, calibration_frac=0.1), CFG)}, version="flat-point", metrics={})
    mean, p90 = document_predictions(doc, "tpot", d.x[h], estimate)
    np.testing.assert_allclose(mean / d.estimate_ms[h], 1.2, rtol=0.02)  # the median ratio, published
    assert 0.84 <= np.mean(d.estimate_ms[h] * drifted[h] <= p90) <= 0.96
    # The same pattern kept by the newer rows: the trees are needed and kept.
    steady = (1 + 0.02 * running) * noise
    kept = fit_target(_with_ratio(d, steady), split, cfg)
    assert kept.mean_kind == "trees" and kept.point_selection["trees"] < kept.point_selection["flat"]
    # Off, or with relative models refused, the trees stay whatever the newer rows say.
    assert fit_target(_with_ratio(d, drifted), split, cfg.model_copy(update={"point_select": False})).mean_kind == (
        "trees")
    never = fit_target(_with_ratio(d, drifted), split, cfg.model_copy(update={"relative_to_estimate": "never"}))
    assert never.mean_kind == "trees" and never.base is None and never.point_selection == {}


def test_point_half_mape_by_hand():
    from routing.training.fit import _point_half_mape

    # log ratios: older half 0 and log 2 (median log sqrt 2); newer half log 2, log 2.
    lr = np.log([1.0, 2.0, 2.0, 2.0])
    got = _point_half_mape(np.array([0.0, 0.0, np.log(1.1), -np.log(1.1)]), lr)
    # trees: |1.1 - 1| and |1/1.1 - 1| -> mean 0.0955; flat: predicts sqrt 2 for 2 -> |sqrt2/2 - 1| = 0.2929
    assert got["trees"] == pytest.approx((0.1 + (1 - 1 / 1.1)) / 2)
    assert got["flat"] == pytest.approx(1 - np.sqrt(2) / 2)
    assert _point_half_mape(np.zeros(1), np.zeros(1))["flat"] == float("inf")


def m_tpot(estimate):
    d = data("tpot", estimate, n=600)
    return fit_target(d, time_split(d.n, holdout_frac=0.2, calibration_frac=0.1), CFG)


@pytest.mark.parametrize("estimate_noise, chosen", [
    pytest.param(0.0, "profile:", id="latency = 1.3 x estimate: relative"),
    pytest.param(1.0, None, id="estimate off by a random factor per row (sigma 1 in log): absolute"),
])
def test_select_keeps_the_point_model_with_the_lower_calibration_mape(estimate, estimate_noise, chosen):
    d = data("ttft", estimate, seed=2)
    noisy = d.estimate_ms * np.random.default_rng(7).lognormal(0, estimate_noise, d.n)
    d = TargetData("ttft", d.x, d.y_ms, d.recorded_at_s, d.seq, {}, estimate_ms=noisy, estimate_name=d.estimate_name)
    m = fit_target(d, time_split(d.n, holdout_frac=0.2, calibration_frac=0.1),
                   CFG.model_copy(update={"relative_to_estimate": "select"}))
    assert set(m.relative_selection) == {"relative", "absolute"}
    if chosen is None:
        assert m.base is None and m.relative_selection["absolute"] < m.relative_selection["relative"]
    else:
        assert m.base.startswith(chosen) and m.relative_selection["relative"] <= m.relative_selection["absolute"]


@pytest.mark.parametrize("change, error", [
    pytest.param(lambda d: d.pop("base"), r"base: required, targets \['ttft', 'tpot'\] are relative",
                 id="relative targets without the estimate they are relative to"),
    pytest.param(lambda d: [d["targets"][t].pop("relative") for t in ("ttft", "tpot")],
                 "base: 'profile:.*' given but no target is relative", id="an estimate no target uses"),
])
def test_document_names_the_estimate_of_its_relative_targets(document, change, error):
    doc = {**document[0], "targets": {t: dict(v) for t, v in document[0]["targets"].items()}}
    change(doc)
    with pytest.raises(ValueError, match=error):
        parse_model_document(doc)


def test_probe_grid_passes_a_relative_model_and_its_zero_tpot_on_prefill_rows(document, estimate):
    from routing.training.data import PreparedSamples
    from routing.training.probe import probe_document

    doc, _ = document
    prepared = PreparedSamples(fetched=0, by_target={t: data(t, estimate, n=400) for t in ("ttft", "tpot")})
    report = probe_document(doc, prepared, CFG, estimate=estimate)
    assert report.failure() is None, report.failure()
    # The TPOT grid has prefill rows, where the estimate and so the model answer 0.
    tpot = next(r for r in report.results if r.target == "tpot" and r.quantile == "mean")
    assert tpot.min_ms == 0.0
