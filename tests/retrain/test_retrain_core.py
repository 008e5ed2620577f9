"""Retrain core (routing.training): dropping, splitting, calibration, metrics, export, gate.

Tables with the arithmetic next to each case; the model tests fit real
scikit-learn models on small synthetic data.
"""

from __future__ import annotations

import numpy as np
import pytest

from routing.features import FEATURE_SETS, FEATURES, RAW_FIELDS
from routing.training.export import bucket_tree, model_document, to_document
from routing.models.validated import parse_model_document
from routing.training.buckets import bucket_labels, bucket_of
from planner.conformal import conformal_offset
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, TargetData, prepare_samples
from routing.training.evaluation import STRATA, evaluate
from routing.training.fit import fit_target
from routing.training.gate import gate
from routing.training.scores import latency_metrics
from routing.training.split import check_sample_counts, time_split

CFG = TrainingConfig()


def sample(target="ttft", observed_ms=50.0, *, role="prefill", seq=1, recorded_at_s=1.0, **features):
    feats = dict.fromkeys(RAW_FIELDS, 0.0)
    feats["input_tokens"] = 100.0
    feats.update(features)
    return {"seq": seq, "target": target, "request_id": f"r{seq}", "endpoint_id": "p0", "role": role,
            "features": feats, "observed_ms": observed_ms, "predicted_ms": None, "model_version": None,
            "recorded_at_s": recorded_at_s}


# -- dropping -------------------------------------------------------------------


@pytest.mark.parametrize("bad, target, reason", [
    pytest.param({"observed_ms": float("nan")}, "ttft", "non_finite_latency", id="NaN TTFT"),
    pytest.param({"observed_ms": float("inf")}, "tpot", "non_finite_latency", id="inf TPOT"),
    pytest.param({"observed_ms": None}, "ttft", "non_finite_latency", id="missing latency"),
    pytest.param({"observed_ms": "12"}, "ttft", "non_finite_latency", id="latency as text"),
    pytest.param({"observed_ms": -3.0}, "ttft", "negative_latency", id="negative"),
    pytest.param({"observed_ms": 0.0}, "ttft", "absurd_latency", id="zero is absurd"),
    pytest.param({"observed_ms": 600_001.0}, "ttft", "absurd_latency", id="TTFT 600001 > 600000"),
    pytest.param({"observed_ms": 10_001.0}, "tpot", "absurd_latency", id="TPOT 10001 > 10000"),
    pytest.param({"role": "gpu"}, "ttft", "bad_features", id="unknown role"),
    pytest.param({"features": {"input_tokens": 5.0}}, "ttft", "bad_features", id="fields missing"),
    pytest.param({"features": dict.fromkeys(RAW_FIELDS, 0.0) | {"kv_usage_frac": -0.1}}, "ttft", "bad_features",
                 id="negative feature"),
    pytest.param({"features": dict.fromkeys(RAW_FIELDS, 0.0) | {"running_requests": float("nan")}}, "tpot",
                 "bad_features", id="NaN feature"),
])
def test_bad_samples_are_dropped_and_counted_by_reason(bad, target, reason):
    good = [sample(target, 40.0 + i, seq=i) for i in range(3)]
    bad_sample = {**sample(target, 40.0, seq=99), **bad}
    prepared = prepare_samples([*good, bad_sample], CFG)
    d = prepared.by_target[target]
    assert d.n == 3
    assert d.dropped[reason] == 1
    assert sum(d.dropped.values()) == 1
    assert prepared.fetched == 4


def test_absurd_limit_is_per_target_and_configurable():
    # 700 ms TPOT is plausible for a TTFT, absurd for a TPOT under max_tpot_ms=500.
    cfg = TrainingConfig(max_tpot_ms=500.0)
    prepared = prepare_samples([sample("ttft", 700.0, seq=1), sample("tpot", 700.0, role="decode", seq=2)], cfg)
    assert prepared.by_target["ttft"].n == 1
    assert prepared.by_target["tpot"].dropped["absurd_latency"] == 1


def test_unknown_target_counted_apart():
    prepared = prepare_samples([sample("e2e", 5.0), sample("ttft", 5.0, seq=2)], CFG)
    assert prepared.dropped_unknown_target == 1
    assert prepared.dropped()["unknown"] == {"bad_target": 1}
    assert prepared.by_target["ttft"].n == 1


def test_kept_samples_are_time_ordered_and_use_the_serving_features():
    # Recorded out of order: t=3 (seq 1), t=1 (seq 2), t=1 (seq 3) -> seq 2, 3, 1.
    s = [sample("tpot", 7.0, role="decode", seq=1, recorded_at_s=3.0, running_requests=4.0, tokens_generated=9.0),
         sample("tpot", 5.0, role="decode", seq=2, recorded_at_s=1.0),
         sample("tpot", 6.0, role="aggregated", seq=3, recorded_at_s=1.0)]
    d = prepare_samples(s, CFG).by_target["tpot"]
    assert d.seq.tolist() == [2, 3, 1]
    assert d.y_ms.tolist() == [5.0, 6.0, 7.0]
    cols = FEATURES["tpot"]
    row = dict(zip(cols, d.x[2]))
    assert row["running_requests"] == 4.0 and row["tokens_generated"] == 9.0 and row["role_decode"] == 1.0
    assert dict(zip(cols, d.x[1]))["role_aggregated"] == 1.0


# -- split and counts ---------------------------------------------------------------


@pytest.mark.parametrize("n, holdout, calib, expected", [
    pytest.param(10, 0.2, 0.1, (7, 1, 2), id="10: hold ceil(2.0)=2, calib ceil(1.0)=1, train 7"),
    pytest.param(11, 0.2, 0.1, (6, 2, 3), id="11: hold ceil(2.2)=3, calib ceil(1.1)=2, train 6"),
    pytest.param(100, 0.25, 0.0, (75, 0, 25), id="no calibration slice: 75/0/25"),
    pytest.param(0, 0.2, 0.1, (0, 0, 0), id="empty"),
])
def test_time_split_holds_out_the_most_recent_rows(n, holdout, calib, expected):
    split = time_split(n, holdout_frac=holdout, calibration_frac=calib)
    assert split.sizes() == expected
    # contiguous and ordered: train, then calibration, then holdout at the end
    assert split.train.start == 0 and split.train.stop == split.calibration.start
    assert split.calibration.stop == split.holdout.start and split.holdout.stop == n


def _prepared(n_ttft: int, n_tpot: int) -> PreparedSamples:
    def data(target, n):
        return TargetData(target, np.zeros((n, len(FEATURES[target]))), np.ones(n), np.arange(n, dtype=float),
                          np.arange(n), {})
    return PreparedSamples(fetched=n_ttft + n_tpot, by_target={"ttft": data("ttft", n_ttft), "tpot": data("tpot", n_tpot)})


@pytest.mark.parametrize("n_ttft, n_tpot, short", [
    pytest.param(1000, 1000, None, id="1000 each: train 700 >= 700, hold 200 >= 200"),
    pytest.param(999, 1000, "ttft", id="999 TTFT: train 999-200-100 = 699 < 700"),
    pytest.param(1000, 0, "tpot", id="no TPOT samples"),
])
def test_too_few_samples_names_the_target(n_ttft, n_tpot, short):
    cfg = TrainingConfig(min_train_samples=700, min_holdout_samples=200)
    reason = check_sample_counts(_prepared(n_ttft, n_tpot), cfg)
    if short is None:
        assert reason is None
    else:
        assert reason.startswith("too few samples: ") and f"{short}: " in reason
        assert ("ttft: " in reason) == (short == "ttft")


@pytest.mark.parametrize("kw, field", [
    pytest.param({"holdout_frac": 0.45, "calibration_frac": 0.4}, "holdout_frac + calibration_frac", id="no training rows"),
    pytest.param({"max_iter": 0}, "max_iter", id="max_iter 0"),
    pytest.param({"learnign_rate": 0.1}, "learnign_rate", id="misspelt key"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field.replace("+", r"\+")):
        TrainingConfig(**kw)


# -- calibration and metrics ------------------------------------------------------------


@pytest.mark.parametrize("residuals, expected", [
    pytest.param(np.arange(1, 11) / 10, 1.0, id="n=10: rank ceil(11*0.9)=10 -> 1.0"),
    pytest.param(np.arange(1, 20), 18, id="n=19: rank ceil(20*0.9)=18 -> 18"),
    pytest.param(np.array([-0.5]), -0.5, id="n=1: rank min(ceil(1.8), 1)=1"),
])
def test_conformal_offset_rank(residuals, expected):
    assert conformal_offset(np.random.default_rng(0).permutation(residuals), quantile=0.9) == expected


def test_latency_metrics_by_hand():
    # APE |110-100|/100 = 0.1, |180-200|/200 = 0.1 -> MAPE 0.1; 100 <= 120 yes, 200 <= 190 no -> 0.5
    # pinball: y-q = -20 -> max(-18, 2) = 2, /100 = 0.02; y-q = 10 -> max(9, -1) = 9, /200 = 0.045 -> 0.0325
    m = latency_metrics(np.array([100.0, 200.0]), np.array([110.0, 180.0]), np.array([120.0, 190.0]))
    assert m == {"n": 2, "mape": pytest.approx(0.1), "p90_coverage": 0.5, "p90_loss": pytest.approx(0.0325)}
    empty = latency_metrics(np.array([]), np.array([]), np.array([]))
    assert empty == {"n": 0, "mape": None, "p90_coverage": None, "p90_loss": None}


@pytest.mark.parametrize("target, values, expected", [
    pytest.param("ttft", [0, 1, 2, 3, 4, 7, 8, 100], [0, 1, 2, 2, 3, 3, 4, 4], id="waiting 0|1|2-3|4-7|8+"),
    pytest.param("tpot", [0, 7, 8, 15, 16, 63, 64], [0, 0, 1, 1, 2, 3, 4], id="running 0-7|8-15|16-31|32-63|64+"),
])
def test_load_buckets(target, values, expected):
    x = np.zeros((len(values), len(FEATURES[target])))
    col = FEATURES[target].index("waiting_requests" if target == "ttft" else "running_requests")
    x[:, col] = values
    assert bucket_of(target, x).tolist() == expected


def test_evaluate_reports_each_bucket():
    # waiting 0: y 100 vs 90 (APE 0.1); waiting 5: y 200 vs 260 (0.3), 400 vs 400 (0) -> 0.15; overall 0.4/3
    x = np.zeros((3, len(FEATURES["ttft"])))
    x[1:, FEATURES["ttft"].index("waiting_requests")] = 5
    mean = np.array([90.0, 260.0, 400.0])
    out = evaluate("ttft", x, np.array([100.0, 200.0, 400.0]), mean, mean)
    assert out["mape"] == pytest.approx(0.4 / 3)
    by = {b["bucket"]: b for b in out["buckets"]}
    assert list(by) == bucket_labels("ttft") == [
        "waiting_requests = 0", "waiting_requests = 1", "waiting_requests 2-3", "waiting_requests 4-7",
        "waiting_requests >= 8"]
    assert by["waiting_requests = 0"]["mape"] == pytest.approx(0.1)
    assert by["waiting_requests 4-7"]["mape"] == pytest.approx(0.15) and by["waiting_requests 4-7"]["n"] == 2
    assert by["waiting_requests >= 8"] == {"bucket": "waiting_requests >= 8", "n": 0, "mape": None,
                                           "p90_coverage": None, "p90_loss": None}


# Four held-out TTFT rows: (waiting, kv, prompt tokens) -> observed, point, p90 (ms). Per row:
#   r0 (0, 0.50,  500): y 100, mean  90 (APE .1), p90 120 covered, pinball y-q=-20 -> max(-18, 2) = 2/100 = .02
#   r1 (2, 0.85, 2000): y 200, mean 260 (APE .3), p90 190 missed,  y-q=10 -> 9/200 = .045
#   r2 (5, 0.90, 5000): y 400, mean 400 (APE 0),  p90 500 covered, y-q=-100 -> 10/400 = .025
#   r3 (3, 0.79, 1024): y 100, mean 110 (APE .1), p90  80 missed,  y-q=20 -> 18/100 = .18
STRATA_ROWS = np.array([[0, 0.50, 500], [2, 0.85, 2000], [5, 0.90, 5000], [3, 0.79, 1024]])
STRATA_Y, STRATA_MEAN, STRATA_P90 = [100.0, 200.0, 400.0, 100.0], [90.0, 260.0, 400.0, 110.0], [120.0, 190.0, 500.0, 80.0]


@pytest.mark.parametrize("name, n, mape, coverage, loss", [
    pytest.param("queue 0", 1, 0.1, 1.0, 0.02, id="queue 0: r0"),
    pytest.param("queue 1-3", 2, 0.2, 0.0, 0.1125, id="queue 1-3: r1 r3, (.3+.1)/2, (.045+.18)/2"),
    pytest.param("queue 4+", 1, 0.0, 1.0, 0.025, id="queue 4+: r2"),
    pytest.param("kv < 80%", 2, 0.1, 0.5, 0.1, id="kv < 80%: r0 r3 (0.79), (.02+.18)/2"),
    pytest.param("kv >= 80%", 2, 0.15, 0.5, 0.035, id="kv >= 80%: r1 r2, (.3+0)/2, (.045+.025)/2"),
    pytest.param("prompt < 1k", 1, 0.1, 1.0, 0.02, id="prompt < 1k: r0"),
    pytest.param("prompt 1k-4k", 2, 0.2, 0.0, 0.1125, id="prompt 1k-4k: r1 r3 (1024 is in)"),
    pytest.param("prompt >= 4k", 1, 0.0, 1.0, 0.025, id="prompt >= 4k: r2"),
])
def test_strata_metrics_by_hand(name, n, mape, coverage, loss):
    x = np.zeros((4, len(FEATURES["ttft"])))
    for j, f in enumerate(("waiting_requests", "kv_usage_frac", "input_tokens")):
        x[:, FEATURES["ttft"].index(f)] = STRATA_ROWS[:, j]
    out = evaluate("ttft", x, np.array(STRATA_Y), np.array(STRATA_MEAN), np.array(STRATA_P90))
    assert [s["name"] for s in out["strata"]] == [s.name for s in STRATA]
    got = next(s for s in out["strata"] if s["name"] == name)
    assert got == {"name": name, "n": n, "mape": pytest.approx(mape), "p90_coverage": pytest.approx(coverage),
                   "p90_loss": pytest.approx(loss)}


def test_a_stratum_without_rows_has_no_figures():
    x = np.zeros((2, len(FEATURES["tpot"])))  # waiting 0, kv 0, prompt 0: nothing queued, long or full
    out = evaluate("tpot", x, np.array([5.0, 6.0]), np.array([5.0, 6.0]), np.array([6.0, 7.0]))
    by = {s["name"]: s for s in out["strata"]}
    assert by["queue 0"]["n"] == 2 and by["queue 0"]["mape"] == 0.0
    assert by["queue 4+"] == {"name": "queue 4+", "n": 0, "mape": None, "p90_coverage": None, "p90_loss": None}


# -- models and export ----------------------------------------------------------------------


def synthetic(target: str, n: int, *, seed: int = 0) -> TargetData:
    """Latency = 20 + 0.02*input_tokens + 0.004*prefill tokens in flight (+5% noise), ms."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(FEATURES[target])))
    cols = FEATURES[target]
    x[:, cols.index("input_tokens")] = rng.uniform(10, 8000, n)
    x[:, cols.index("prefill_tokens_in_flight")] = rng.uniform(0, 50_000, n)
    x[:, cols.index("waiting_requests")] = rng.integers(0, 10, n)
    x[:, cols.index("role_prefill")] = 1.0
    y = (20 + 0.02 * x[:, 0] + 0.004 * x[:, 5]) * rng.lognormal(0, 0.05, n)
    return TargetData(target, x, y, np.arange(n, dtype=float), np.arange(n), {})


SMALL = TrainingConfig(max_iter=20, min_train_samples=20, min_holdout_samples=10)


def test_exported_document_predicts_exactly_what_sklearn_predicts():
    models = {}
    for target in ("ttft", "tpot"):
        data = synthetic(target, 800, seed=1)
        models[target] = fit_target(data, time_split(800, holdout_frac=0.2, calibration_frac=0.1), SMALL)
    doc = to_document(models, version="exact-1", metrics={"ttft_mape": 0.05, "bad": float("nan")})
    served = parse_model_document(doc)  # the router's own validation and compiler
    assert doc["metrics"] == {"ttft_mape": 0.05}  # non-finite metrics are left out, the format forbids them
    for target in ("ttft", "tpot"):
        x = synthetic(target, 300, seed=2).x
        mean, p90 = models[target].predict(x)
        np.testing.assert_allclose(served.predict(target, x, quantile="mean"), mean, rtol=1e-9)
        np.testing.assert_allclose(served.predict(target, x, quantile="p90"), p90, rtol=1e-9)
        assert doc["targets"][target]["mean"]["link"] == "log"


def test_p90_calibration_shifts_the_quantile_by_the_conformal_offset():
    data = synthetic("ttft", 1000, seed=3)
    split = time_split(1000, holdout_frac=0.2, calibration_frac=0.2)
    plain = fit_target(data, split, SMALL.model_copy(update={"calibrate_p90": False}))
    calibrated = fit_target(data, split, SMALL)
    assert plain.p90_log_offset == 0.0
    x_cal, y_cal = data.x[split.calibration], data.y_ms[split.calibration]
    expected = conformal_offset(np.log(y_cal) - calibrated.p90.predict(x_cal), quantile=0.9)
    assert calibrated.p90_log_offset == pytest.approx(expected)
    # 200 calibration rows: rank ceil(201*0.9)=181 -> at least 181/200 = 90.5% covered
    # (the 181st lies exactly on the shifted quantile, up to exp/log rounding)
    assert np.mean(y_cal <= calibrated.predict(x_cal)[1] * (1 + 1e-12)) >= 181 / 200


def test_holdout_rows_never_influence_the_fit():
    data = synthetic("tpot", 1000, seed=4)
    split = time_split(1000, holdout_frac=0.2, calibration_frac=0.1)
    poisoned_y = data.y_ms.copy()
    poisoned_y[split.holdout] = 1e6
    poisoned = TargetData("tpot", data.x, poisoned_y, data.recorded_at_s, data.seq, {})
    a, b = fit_target(data, split, SMALL), fit_target(poisoned, split, SMALL)
    x = data.x[:50]
    np.testing.assert_array_equal(a.predict(x)[0], b.predict(x)[0])
    np.testing.assert_array_equal(a.predict(x)[1], b.predict(x)[1])


def test_models_learn_the_synthetic_latency():
    data = synthetic("ttft", 2000, seed=5)
    split = time_split(2000, holdout_frac=0.2, calibration_frac=0.1)
    m = fit_target(data, split, TrainingConfig(max_iter=100, learning_rate=0.2))
    mean, p90 = m.predict(data.x[split.holdout])
    y = data.y_ms[split.holdout]
    # 5% lognormal noise: MAPE near 4% (E|N(0, 0.05)| = 0.04); p90 near 90%
    assert np.mean(np.abs(mean - y) / y) < 0.06
    assert 0.84 <= np.mean(y <= p90) <= 0.96


# -- gate ------------------------------------------------------------------------------------


def m(ttft_mape, tpot_mape, ttft_loss=0.03, tpot_loss=0.03):
    return {"ttft": {"mape": ttft_mape, "p90_loss": ttft_loss}, "tpot": {"mape": tpot_mape, "p90_loss": tpot_loss}}


EST = m(0.30, 0.06, 0.20, 0.05)


@pytest.mark.parametrize("cand, current, force, cfg_kw, code", [
    pytest.param(m(.05, .05), None, False, {}, "publish", id="first model: .05/.05 beat the estimate .30/.06"),
    pytest.param(m(.05, .07), None, False, {}, "refused_estimate", id="TPOT MAPE .07 > estimate .06"),
    pytest.param(m(.05, .07), m(.1, .1), True, {}, "refused_estimate", id="forced, still never below the estimate"),
    pytest.param(m(.05, .05, tpot_loss=.06), None, False, {}, "refused_estimate", id="TPOT p90 loss .06 > .05"),
    pytest.param(m(.05, .06), None, False, {}, "publish", id="equal to the estimate .06 is not worse"),
    pytest.param(m(.05, .05), m(.06, .06, .04, .04), False, {}, "publish", id="score .04 < current .05"),
    pytest.param(m(.05, .05), m(.04, .06), False, {}, "refused_current", id="score .04 = current (.04+.06+.03+.03)/4"),
    pytest.param(m(.05, .05), m(.045, .07, .03, .04), False, {}, "refused_current",
                 id="score .04 < .04625 but TTFT MAPE .05 > .045*1.05 = .04725"),
    pytest.param(m(.047, .05), m(.045, .07, .03, .04), False, {}, "publish", id="TTFT .047 <= .04725: within tolerance"),
    pytest.param(m(.04, .04, .03, .02), m(.06, .06, .02, .04), False, {}, "refused_current",
                 id="score .0325 < .045 but TTFT p90 loss .03 > .02*1.05"),
    pytest.param(m(.05, .05), m(.045, .07, .03, .04), True, {}, "publish_forced", id="forced past the current model"),
    pytest.param(m(.056, .056, .04, .04), m(.06, .06, .044, .044), False, {"min_improvement_frac": 0.1},
                 "refused_current", id="score: needs .052*0.9 = .0468, has .048"),
])
def test_gate(cand, current, force, cfg_kw, code):
    decision = gate(cand, estimate=EST, current=current, current_version=None if current is None else "v0",
                    force=force, cfg=TrainingConfig(**cfg_kw))
    assert decision.code == code, decision.reason
    assert decision.publish == code.startswith("publish")
    if code in ("publish", "refused_current") and current is not None:
        assert "v0" in decision.reason  # the reason names the model it was compared with


def with_strata(metrics, target="ttft", **strata):
    """metrics with strata added to one target: name=(n, mape, p90_loss)."""
    out = {t: dict(v) for t, v in metrics.items()}
    out[target]["strata"] = [{"name": name.replace("_", " ").replace("plus", "+"), "n": n, "mape": mape,
                              "p90_coverage": 0.9, "p90_loss": loss} for name, (n, mape, loss) in strata.items()]
    return out


# Candidate better on average (score .035 < current .045) in each case; current's queue 4+ stratum:
# n 600, MAPE .08, p90 loss .05. Allowed: .08 * 1.10 = .088 and .05 * 1.10 = .055.
CURRENT = with_strata(m(.05, .05, .04, .04), queue_0=(5000, .01, .01), queue_4plus=(600, .08, .05))


@pytest.mark.parametrize("cand, code, named", [
    pytest.param(with_strata(m(.04, .04, .03, .03), queue_0=(5000, .005, .008), queue_4plus=(600, .10, .05)),
                 "refused_current", "ttft stratum queue 4+ (n=600): MAPE 10.00% regresses past the current "
                 "model's 8.00% (+10% allowed)", id="better on average, queue 4+ MAPE .10 > .088: refused"),
    pytest.param(with_strata(m(.04, .04, .03, .03), queue_0=(5000, .005, .008), queue_4plus=(600, .08, .06)),
                 "refused_current", "ttft stratum queue 4+ (n=600): p90 loss 6.00% regresses",
                 id="queue 4+ p90 loss .06 > .055: refused"),
    pytest.param(with_strata(m(.04, .04, .03, .03), queue_0=(5000, .005, .008), queue_4plus=(600, .087, .054)),
                 "publish", "", id="queue 4+ MAPE .087 <= .088, loss .054 <= .055: within the margin"),
    pytest.param(with_strata(m(.04, .04, .03, .03), queue_0=(5000, .005, .008), queue_4plus=(150, .20, .20)),
                 "publish", "", id="queue 4+ with 150 < 200 rows: too few to refuse on"),
    pytest.param(with_strata(m(.04, .04, .03, .03), queue_4plus=(600, .10, .05)), "publish_forced", "",
                 id="forced past a stratum regression"),
])
def test_gate_refuses_a_stratum_regression(cand, code, named):
    decision = gate(cand, estimate=EST, current=CURRENT, current_version="v0", force=code == "publish_forced",
                    cfg=CFG)
    assert decision.code == code, decision.reason
    assert named in decision.reason and "\n" not in decision.reason
    if code == "refused_current":
        assert "v0" in decision.reason


# -- per-bucket calibration and feature sets ------------------------------------------------


@pytest.mark.parametrize("x, bucket", [
    pytest.param(0.0, 0, id="0 -> bucket 0"), pytest.param(0.5, 0, id="0.5 < 1 -> 0"),
    pytest.param(1.0, 1, id="edge 1 -> 1"), pytest.param(1.999, 1, id="1.999 < 2 -> 1"),
    pytest.param(2.0, 2, id="edge 2 -> 2"), pytest.param(3.0, 2, id="3 in [2,4) -> 2"),
    pytest.param(4.0, 3, id="edge 4 -> 3"), pytest.param(7.5, 3, id="7.5 in [4,8) -> 3"),
    pytest.param(8.0, 4, id="edge 8 -> 4"), pytest.param(1e6, 4, id="1e6 -> open last bucket"),
])
def test_bucket_tree_decides_like_bucket_of(x, bucket):
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    reg = {"kind": "hist_gradient_boosting", "link": "identity", "baseline": 0.0,
           "trees": [bucket_tree(FEATURES["ttft"].index("waiting_requests"), (0, 1, 2, 4, 8), values)]}
    doc = model_document(version="b", ttft_mean=reg, tpot_mean=reg | {"trees": [bucket_tree(0, (0,), [1.0])]})
    row = np.zeros((1, len(FEATURES["ttft"])))
    row[0, FEATURES["ttft"].index("waiting_requests")] = x
    assert bucket_of("ttft", row)[0] == bucket
    assert parse_model_document(doc).predict("ttft", row)[0] == values[bucket]


def heteroscedastic(n: int, seed: int) -> TargetData:
    """TTFT whose noise grows with the waiting queue: sd 0.02 idle, 0.3 behind 4+ requests (log space)."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(FEATURES["ttft"])))
    cols = FEATURES["ttft"]
    x[:, cols.index("input_tokens")] = rng.uniform(100, 4000, n)
    waiting = rng.choice([0, 1, 2, 5], n, p=[0.55, 0.2, 0.15, 0.1])
    x[:, cols.index("waiting_requests")] = waiting
    x[:, cols.index("role_prefill")] = 1.0
    sd = np.select([waiting == 0, waiting == 1, waiting == 2], [0.02, 0.1, 0.2], 0.3)
    y = (20 + 0.02 * x[:, 0]) * np.exp(rng.normal(0, sd))
    return TargetData("ttft", x, y, np.arange(n, dtype=float), np.arange(n), {})


def test_per_bucket_calibration_shifts_each_load_bucket_by_its_own_conformal_offset():
    data = heteroscedastic(4000, seed=5)
    split = time_split(4000, holdout_frac=0.2, calibration_frac=0.25)  # 1000 calibration rows
    cfg = SMALL.model_copy(update={"p90_calibration": {"ttft": "load_bucket", "tpot": "global"},
                                   "calibration_min_bucket_samples": 120})
    m = fit_target(data, split, cfg)
    x_cal, y_cal = data.x[split.calibration], data.y_ms[split.calibration]
    residuals = np.log(y_cal) - m.p90.predict(x_cal)
    b = bucket_of("ttft", x_cal)
    assert m.p90_log_offset == pytest.approx(conformal_offset(residuals, quantile=0.9))
    for k, offset in enumerate(m.p90_bucket_offsets):
        own = residuals[b == k]
        # waiting 0 / 1 / 2 / 5 land in buckets 0, 1, 2, 3 (~550, 200, 150, 100 rows); bucket 4 (8+) is empty
        expected = conformal_offset(own, quantile=0.9) if own.size >= 120 else m.p90_log_offset
        assert offset == pytest.approx(expected), k
        if own.size >= 120:  # each bucket big enough is covered at its own 90%
            assert np.mean(y_cal[b == k] <= m.predict(x_cal[b == k])[1] * (1 + 1e-12)) >= 0.9
    assert m.p90_bucket_offsets[4] == m.p90_log_offset and m.p90_bucket_offsets[0] < m.p90_log_offset
    # What the router serves equals the fitted models, bucket shifts included.
    doc = to_document({"ttft": m, "tpot": fit_target(synthetic("tpot", 400, seed=6),
                                                     time_split(400, holdout_frac=0.2, calibration_frac=0.1), SMALL)},
                      version="bucketed", metrics={})
    x_test = heteroscedastic(300, seed=7).x
    np.testing.assert_allclose(parse_model_document(doc).predict("ttft", x_test, quantile="p90"), m.predict(x_test)[1],
                               rtol=1e-9)


def test_training_on_an_older_feature_set_publishes_that_set():
    cfg = SMALL.model_copy(update={"feature_set": 1})
    split = time_split(800, holdout_frac=0.2, calibration_frac=0.1)
    models = {t: fit_target(synthetic(t, 800, seed=8), split, cfg) for t in ("ttft", "tpot")}
    doc = to_document(models, version="set-1", metrics={})
    assert doc["feature_set"] == 1 and doc["targets"]["ttft"]["feature_names"] == list(FEATURE_SETS[1]["ttft"])
    served = parse_model_document(doc)
    x = synthetic("tpot", 200, seed=9).x
    x_changed = x.copy()
    x_changed[:, FEATURES["tpot"].index("prefill_batch_elapsed_ms")] = 1e5  # not in set 1: no effect
    for t in ("ttft", "tpot"):
        xt = x[:, : len(FEATURES[t])]
        np.testing.assert_allclose(served.predict(t, xt, quantile="p90"), models[t].predict(xt)[1], rtol=1e-9)
        np.testing.assert_array_equal(served.predict(t, xt), served.predict(t, x_changed[:, : len(FEATURES[t])]))


def test_unknown_feature_set_or_calibration_target_is_a_config_error():
    with pytest.raises(ValueError, match=r"feature_set must be one of \[1, 2\], got 7"):
        TrainingConfig(feature_set=7)
    with pytest.raises(ValueError, match=r"p90_calibration: missing targets \['tpot'\]"):
        TrainingConfig(p90_calibration={"ttft": "global"})


# -- probe grid: the gate refuses models that blow up where held-out rows never go ------------------------------


def queueing_ttft(n: int, *, seed: int = 0) -> TargetData:
    """TTFT = 30 ms x 2.2^waiting x e^(-1.2 x prefix hit) (+5% noise): steep in the queue, 0-8 waiting seen."""
    rng = np.random.default_rng(seed)
    cols = FEATURES["ttft"]
    x = np.zeros((n, len(cols)))
    x[:, cols.index("input_tokens")] = rng.uniform(10, 8000, n)
    x[:, cols.index("waiting_requests")] = rng.integers(0, 9, n)
    x[:, cols.index("prefix_cache_hit_frac")] = rng.uniform(0, 1, n)
    x[:, cols.index("role_prefill")] = 1.0
    waiting, hit = x[:, cols.index("waiting_requests")], x[:, cols.index("prefix_cache_hit_frac")]
    y = 30 * 2.2 ** waiting * np.exp(-1.2 * hit) * rng.lognormal(0, 0.05, n)
    return TargetData("ttft", x, y, np.arange(n, dtype=float), np.arange(n), {})


class ConstantEstimate:
    """A profile estimate that answers one latency per target (2 s TTFT, 50 ms TPOT)."""

    def predict(self, target, x):
        return np.full(len(x), 2000.0 if target == "ttft" else 50.0)


def _log_linear_ttft_document() -> tuple[dict, PreparedSamples]:
    """A log-link linear TTFT model fitted on queueing_ttft (TPOT: the usual trees), and its samples."""
    from sklearn.linear_model import LinearRegression

    from routing.training.export import export_linear, export_target
    from routing.training.split import splits_for

    prepared = PreparedSamples(fetched=2000, by_target={"ttft": queueing_ttft(1000), "tpot": synthetic("tpot", 1000)})
    split = splits_for(prepared, SMALL)
    ttft = prepared.by_target["ttft"]
    linear = LinearRegression().fit(ttft.x[split["ttft"].train], np.log(ttft.y_ms[split["ttft"].train]))
    tpot_mean, tpot_p90 = export_target(fit_target(prepared.by_target["tpot"], split["tpot"], SMALL))
    doc = model_document(version="log-linear", ttft_mean=export_linear(linear, link="log"),
                         tpot_mean=tpot_mean, tpot_p90=tpot_p90)
    return doc, prepared


def test_a_log_link_model_that_overflows_is_refused_by_the_probe_grid():
    from routing.training.evaluation import evaluate_all
    from routing.training.gate import decide_publish

    doc, prepared = _log_linear_ttft_document()
    # How it passed before: the router's own check (all-zero and all-1e6 rows) accepts it, since the
    # prefix-hit coefficient (-1.2) outweighs the queue's (+log 2.2 = 0.79) at 1e6 everywhere, and on
    # held-out rows (0-8 waiting) it fits well, so the metric gate publishes it.
    parse_model_document(doc)
    ev = evaluate_all(prepared, SMALL, candidate_document=doc, current_document=None, estimate=ConstantEstimate())
    before = gate(ev.candidate, estimate=ev.estimate, current=None, current_version=None, force=False, cfg=SMALL)
    assert before.code == "publish", before.reason
    # With 1024 requests waiting: 0.79 x 1024 = 808 > 709.8, exp() overflows to inf.
    for force in (False, True):
        decision, probed = decide_publish(doc, ev, prepared, SMALL, current_version=None, force=force)
        assert (decision.publish, decision.code) == (False, "refused_probe")
        assert "\n" not in decision.reason
        assert decision.reason.startswith("probe grid: ttft mean predicts inf ms, not finite (overflow), at ")
        assert "waiting_requests=1024" in decision.reason and "prefix_cache_hit_frac=0 " in decision.reason
    ttft_mean = probed.probe.results[0]
    assert (ttft_mean.target, ttft_mean.quantile, ttft_mean.max_ms) == ("ttft", "mean", float("inf"))
    assert f"{ttft_mean.bad_rows} of {ttft_mean.rows} probe rows out of range" in decision.reason
    assert all(r.ok for r in probed.probe.results if r.target == "tpot")


def test_a_normal_model_passes_the_probe_grid():
    from routing.training.evaluation import evaluate_all
    from routing.training.gate import decide_publish
    from routing.training.split import splits_for

    prepared = PreparedSamples(fetched=2000, by_target={t: synthetic(t, 1000, seed=1) for t in ("ttft", "tpot")})
    split = splits_for(prepared, SMALL)
    models = {t: fit_target(prepared.by_target[t], split[t], SMALL) for t in ("ttft", "tpot")}
    doc = to_document(models, version="normal", metrics={})
    ev = evaluate_all(prepared, SMALL, candidate_document=doc, current_document=None, estimate=ConstantEstimate())
    decision, probed = decide_publish(doc, ev, prepared, SMALL, current_version=None, force=False)
    assert decision.code == "publish", decision.reason
    assert probed.probe.failure() is None and len(probed.probe.results) == 4
    for r in probed.probe.results:
        # Trees do not extrapolate: the grid's extremes stay near the training range, far below 10 x its max.
        assert 0 < r.min_ms <= r.max_ms < r.ceiling_ms, r


def _linear(intercept: float, link: str, **coef: float) -> dict:
    names = FEATURES["ttft"]
    return {"kind": "linear", "link": link, "intercept": intercept, "coef": [coef.get(n, 0.0) for n in names]}


@pytest.mark.parametrize("ttft_mean, problem", [
    pytest.param(_linear(-5.0, "identity", input_tokens=0.01), "predicts 0 ms, <= 0, at input_tokens=1 ",
                 id="identity: -5 + 0.01 x 1 token < 0, the router would clip to 0 ms"),
    pytest.param(_linear(4.0, "log", input_tokens=1e-4), "above the ceiling, at input_tokens=131072 ",
                 id="log: e^(4 + 13.1) = 2.7e7 ms at the context length > 6e5 ms"),
    pytest.param(_linear(4.0, "log", input_tokens=1e-5), None,
                 id="log: e^(4 + 1.31) = 202 ms at the context length: within range"),
])
def test_probe_grid_finds_zero_and_absurd_predictions(ttft_mean, problem):
    from routing.training.probe import probe_document

    prepared = PreparedSamples(fetched=2000, by_target={t: synthetic(t, 1000, seed=1) for t in ("ttft", "tpot")})
    tpot = _linear(3.0, "log")  # e^3 = 20 ms everywhere
    doc = model_document(version="lin", ttft_mean=ttft_mean, tpot_mean=tpot | {"coef": [0.0] * len(FEATURES["tpot"])})
    # A 600 s ceiling: 10 x the largest synthetic TTFT (~220 ms) is 2.2 s; factor 1e4 leaves the absurd limit.
    failure = probe_document(doc, prepared, SMALL.model_copy(update={"probe_ceiling_factor": 1e4})).failure()
    if problem is None:
        assert failure is None
    else:
        assert failure is not None and problem in failure, failure
        assert "ceiling 600000 ms: max_ttft_ms 600000" in failure


def test_model_card_names_the_failed_probe():
    from flows.retrain import model_card
    from routing.training.evaluation import evaluate_all
    from routing.training.gate import decide_publish

    doc, prepared = _log_linear_ttft_document()
    ev = evaluate_all(prepared, SMALL, candidate_document=doc, current_document=None, estimate=ConstantEstimate())
    decision, probed = decide_publish(doc, ev, prepared, SMALL, current_version=None, force=False)
    card = model_card({"router_url": "http://r", "version": "log-linear", "current_version": None,
                       "estimate": "profile:x"}, prepared, SMALL, decision, evaluation=probed)
    assert "# Latency model log-linear: REFUSED" in card
    assert f"**Decision** `refused_probe`: {decision.reason}" in card
    assert "## Probe grid" in card
    assert "| ttft | mean | " in card and "| inf |" in card
    # The per-stratum table: every stratum, both targets, with its held-out count.
    assert "## Per stratum (held out)" in card
    for st in STRATA:
        for t in ("ttft", "tpot"):
            n = next(x["n"] for x in probed.candidate[t]["strata"] if x["name"] == st.name)
            assert f"| {st.name} | {t} | {n} | " in card
