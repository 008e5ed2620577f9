"""What a retrain run offers to publish (routing.training.publish): a target worse than the estimate kept on it.

Real scikit-learn fits on synthetic rows around a real profile's estimate, scored through the exported
document as the router serves it.
"""

from __future__ import annotations

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from routing.features import FEATURES
from routing.models.predictor import ProfileEstimator
from routing.models.validated import document_predictions
from routing.training.data import PreparedSamples, TargetData
from routing.training.fit import fit_all
from routing.training.publish import decide_candidate
from tests.retrain.test_retrain_relative import CFG, PROFILE_DIR, data

pytestmark = pytest.mark.skipif(not PROFILE_DIR.exists(), reason="profile data not found")
N = 3000


@pytest.fixture(scope="module")
def estimate():
    return ProfileEstimator(load_profile_dir(PROFILE_DIR))


def tpot_drifting_in_holdout(estimate, *, holdout_ratio: float) -> TargetData:
    """TPOT at 1 + 2% per running request over the estimate until the holdout (the newest 20%), then a
    flat holdout_ratio: trees trained and calibrated on the old pattern are wrong on the newest rows."""
    d = data("tpot", estimate, n=N, seed=11)
    running = d.x[:, FEATURES["tpot"].index("running_requests")]
    ratio = np.where(np.arange(N) < int(0.8 * N), 1 + 0.02 * running, holdout_ratio)
    ratio *= np.random.default_rng(12).lognormal(0, 0.02, N)
    return TargetData("tpot", d.x, d.estimate_ms * ratio, d.recorded_at_s, d.seq, {}, estimate_ms=d.estimate_ms,
                      estimate_name=d.estimate_name)


def decide(prepared, estimate):
    cfg = CFG.model_copy(update={"relative_to_estimate": "select"})
    return decide_candidate(fit_all(prepared, cfg), prepared, cfg, version="v-test", created_at_s=0.0,
                            current_document=None, current_version=None, estimate=estimate, force=False)


def test_a_target_worse_than_the_estimate_is_published_as_the_estimate(estimate):
    prepared = PreparedSamples(fetched=2 * N, by_target={
        "ttft": data("ttft", estimate, n=N), "tpot": tpot_drifting_in_holdout(estimate, holdout_ratio=1.0)})
    cand = decide(prepared, estimate)
    assert cand.kept_estimate == ("tpot",)
    assert cand.decision.publish and cand.decision.code == "publish"
    assert cand.decision.reason.startswith("tpot keeps the profile estimate (trained: MAPE ")
    assert "vs the estimate's" in cand.decision.reason and cand.document["notes"] == cand.decision.reason
    # The calibration slice still ran the old pattern, so a calibrated p90 factor (~1.7) overshoots the
    # newest rows: the estimate serves as its own p90, exactly as the router serves it without a model.
    assert "with the estimate as its p90 (a calibrated factor was worse)" in cand.decision.reason
    x = prepared.by_target["tpot"].x[-600:]
    est = estimate.predict("tpot", x)
    mean, p90 = document_predictions(cand.document, "tpot", x, estimate)
    np.testing.assert_allclose(mean, est, rtol=1e-9)
    np.testing.assert_allclose(p90, est, rtol=1e-9)
    ev = cand.evaluation
    for k in ("mape", "p90_loss"):
        assert ev.candidate["tpot"][k] == pytest.approx(ev.estimate["tpot"][k], rel=1e-9)
    # TTFT keeps what it learned (the 1.3 bias the estimate lacks).
    assert cand.models["tpot"].mean_kind == "flat" and cand.models["tpot"].p90_log_offset == 0.0
    xt = prepared.by_target["ttft"].x[-600:]
    ttft_mean, _ = document_predictions(cand.document, "ttft", xt, estimate)
    assert np.median(ttft_mean / estimate.predict("ttft", xt)) == pytest.approx(1.3, rel=0.02)
    assert ev.candidate["ttft"]["mape"] < ev.estimate["ttft"]["mape"] / 5
    # The model card says what is published and why.
    from flows.retrain import model_card

    card = model_card({"router_url": "http://r", "version": "v-test", "current_version": None,
                       "estimate": "profile:x"}, prepared, CFG, cand.decision, evaluation=ev, models=cand.models)
    assert "# Latency model v-test: PUBLISHED" in card
    assert f"**Decision** `publish`: {cand.decision.reason}" in card
    assert "| tpot | point, relative to profile:" in card and ": flat, the estimate x1.000 (no trees)" in card


def test_nothing_is_replaced_when_both_targets_or_neither_are_worse(estimate):
    both = PreparedSamples(fetched=2 * N, by_target={
        "ttft": data("ttft", estimate, n=N), "tpot": tpot_drifting_in_holdout(estimate, holdout_ratio=1.0)})
    # TTFT whose holdout the estimate predicts exactly, after training on a 1.3 bias: worse too.
    t = both.by_target["ttft"]
    ratio = np.where(np.arange(N) < int(0.8 * N), 1.3, 1.0)
    both.by_target["ttft"] = TargetData("ttft", t.x, t.estimate_ms * ratio, t.recorded_at_s, t.seq, {},
                                        estimate_ms=t.estimate_ms, estimate_name=t.estimate_name)
    refused = decide(both, estimate)
    assert refused.kept_estimate == () and refused.decision.code == "refused_estimate"
    assert not refused.decision.publish
    neither = PreparedSamples(fetched=2 * N, by_target={t: data(t, estimate, n=N) for t in ("ttft", "tpot")})
    published = decide(neither, estimate)
    assert published.kept_estimate == () and published.decision.code == "publish"
    assert "keeps the profile estimate" not in published.decision.reason


def test_estimate_models_p90_is_the_calibration_slices_conformal_factor(estimate):
    from routing.training.fit import fit_target
    from routing.training.publish import estimate_models
    from routing.training.split import time_split

    d = data("tpot", estimate, n=1000, seed=3)
    split = time_split(d.n, holdout_frac=0.2, calibration_frac=0.2)
    ratio = np.where((np.arange(d.n) >= split.calibration.start) & (np.arange(d.n) < split.calibration.stop),
                     1.25, 1.0)  # every calibration row at 1.25 x the estimate: its 90th percentile too
    d = TargetData("tpot", d.x, d.estimate_ms * ratio, d.recorded_at_s, d.seq, {}, estimate_ms=d.estimate_ms,
                   estimate_name=d.estimate_name)
    trained = fit_target(d, split, CFG)
    m = estimate_models(trained, d, split, CFG)
    x, est = d.x[:50], d.estimate_ms[:50]
    mean, p90 = m.predict(x, est)
    np.testing.assert_allclose(mean, est, rtol=1e-9)
    np.testing.assert_allclose(p90, 1.25 * est, rtol=1e-6)
    assert (m.mean_kind, m.p90_kind, m.base, m.iterations) == ("flat", "flat", d.estimate_name, {"mean": 0, "p90": 0})
    np.testing.assert_allclose(estimate_models(trained, d, split, CFG, calibrated=False).predict(x, est)[1], est)
