"""Load predictors: hand-computed baselines, quantiles, fallbacks, API contract."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.config import PredictorConfig
from planner.predict import bin_requests, forecast_next, prime_history
from planner.predictors import ConstantPredictor, KalmanPredictor, SeasonalNaivePredictor, check_series
from planner.conformal import conformal_offset
from planner.predictors.registry import make_predictor, predictor_names
from planner.types import LoadHistory

NAN = math.nan
CHEAP = ("constant", "seasonal_naive", "kalman", "ets")


def minutes(n: int, start: float = 60.0) -> np.ndarray:
    return start + 60.0 * np.arange(n)


def history(counts, isl=None, osl=None, interval_s=60.0) -> LoadHistory:
    n = len(counts)
    return LoadHistory(
        t_s=tuple(minutes(n).tolist()),
        num_requests=tuple(float(c) for c in counts),
        avg_isl_tokens=tuple(isl if isl is not None else [1000.0] * n),
        avg_osl_tokens=tuple(osl if osl is not None else [100.0] * n),
        interval_s=interval_s,
    )


# ---------------------------------------------------------------- baselines


@pytest.mark.parametrize(
    "y, horizon, expected",
    [
        pytest.param([3, 5, 4], 1, [4], id="last value: 4"),
        pytest.param([3, 5, NAN], 2, [5, 5], id="NaN last interval skipped: 5, 5"),
        pytest.param([7], 3, [7, 7, 7], id="one point is enough"),
        pytest.param([0, 0], 1, [0], id="idle stays 0"),
    ],
)
def test_constant(y, horizon, expected):
    p = ConstantPredictor().fit(minutes(len(y)), y)
    assert p.predict(horizon).tolist() == expected


@pytest.mark.parametrize(
    "y, horizon, expected",
    [
        # season 4 bins: forecast k = y[n - 4 + (k-1) % 4]
        pytest.param([1, 2, 3, 4, 5, 6, 7, 8], 1, [5], id="n=8: y[8-4]=5"),
        pytest.param([1, 2, 3, 4, 5, 6, 7, 8], 2, [5, 6], id="two steps: y[4], y[5]"),
        pytest.param([1, 2, 3, 4, 5, 6, 7, 8], 5, [5, 6, 7, 8, 5], id="past one season wraps"),
        pytest.param([1, 2, 3, 4, NAN, 6, 7, 8, 9], 1, [6], id="n=9: y[5]=6"),
        pytest.param([1, 2, 3, 4], 1, [4], id="under a season + 1: last value"),
    ],
)
def test_seasonal_naive(y, horizon, expected):
    p = SeasonalNaivePredictor(season_s=240.0).fit(minutes(len(y)), y)
    assert p.predict(horizon).tolist() == expected


def test_seasonal_naive_missing_value_a_season_back_uses_last_value():
    # n=9, season 4: y[5] is NaN -> last value 9
    y = [1, 2, 3, 4, 5, NAN, 7, 8, 9]
    assert SeasonalNaivePredictor(season_s=240.0).fit(minutes(9), y).predict(1).tolist() == [9]


def test_seasonal_naive_fallback_is_reported():
    p = SeasonalNaivePredictor(season_s=86400.0).fit(minutes(10), np.arange(10.0))
    assert "one season" in p.fallback_reason_


# ---------------------------------------------------------------- quantiles


@pytest.mark.parametrize(
    "residuals, q, expected",
    [
        pytest.param(range(1, 10), 0.9, 9, id="n=9: rank ceil(10*0.9)=9 -> 9"),
        pytest.param(range(1, 20), 0.9, 18, id="n=19: rank ceil(20*0.9)=18 -> 18"),
        pytest.param(range(1, 20), 0.1, 2, id="n=19, q=0.1: rank floor(20*0.1)=2 -> 2"),
        pytest.param([5, -1, 3], 0.9, 5, id="n=3: rank 4 > n -> largest"),
        pytest.param([NAN, 2.0, NAN], 0.9, 2, id="NaN residuals ignored"),
        pytest.param([float("inf"), 2.0, 1.0], 0.9, 2, id="infinite residuals ignored"),
    ],
)
def test_conformal_offset(residuals, q, expected):
    assert conformal_offset(np.asarray(list(residuals), dtype=float), quantile=q) == expected


@pytest.mark.parametrize("residuals, q, error", [
    pytest.param([], 0.9, "no finite residuals", id="no residuals"),
    pytest.param([NAN, NAN], 0.9, "no finite residuals", id="only gaps"),
    pytest.param([1.0, 2.0], 1.0, "quantile must be in \\(0, 1\\), got 1.0", id="q=1"),
    pytest.param([1.0, 2.0], 0.0, "quantile must be in \\(0, 1\\), got 0.0", id="q=0"),
])
def test_conformal_offset_refuses_what_it_cannot_calibrate(residuals, q, error):
    with pytest.raises(ValueError, match=error):
        conformal_offset(np.asarray(residuals, dtype=float), quantile=q)


def test_a_predictor_without_residuals_forecasts_its_mean_as_the_quantile():
    from planner.predictors.simple import ConstantPredictor

    p = ConstantPredictor().fit(np.array([0.0]), np.array([7.0]))
    assert p.residuals().size == 0
    assert p.predict_quantile(0.9).tolist() == p.predict(1).tolist() == [7.0]


def test_constant_quantile_from_known_residuals():
    # last-value residuals of [10, 12, 11, 15, 13]: 2, -1, 4, -2; n=4, rank ceil(5*0.9)=5 > 4 -> 4
    p = ConstantPredictor().fit(minutes(5), [10, 12, 11, 15, 13])
    assert p.predict_quantile(0.9).tolist() == [17.0]  # 13 + 4
    # k steps ahead widen by sqrt(k): 13 + 4 * sqrt(k)
    np.testing.assert_allclose(p.predict_quantile(0.9, 4), 13 + 4 * np.sqrt([1, 2, 3, 4]))


def test_quantile_never_negative():
    # residuals all -5 (steady decline): 5 - 5 = 0 floor, not negative
    p = ConstantPredictor().fit(minutes(4), [20, 15, 10, 5])
    assert p.predict_quantile(0.9).tolist() == [0.0]


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5, "0.9"])
def test_quantile_out_of_range(q):
    p = ConstantPredictor().fit(minutes(3), [1, 2, 3])
    with pytest.raises(ValueError, match="quantile q must be in"):
        p.predict_quantile(q)


# ---------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    "t_s, y, match",
    [
        pytest.param([60, 120], [1.0], "t_s has 2 points, y has 1", id="length mismatch"),
        pytest.param([], [], "empty series", id="empty"),
        pytest.param([60, 120], [1.0, -2.0], r"y\[1\] = -2.0 is negative", id="negative"),
        pytest.param([60, 120], [NAN, NAN], "all 2 values are NaN", id="all NaN"),
        pytest.param([60, 120], [1.0, math.inf], r"y\[1\] is inf", id="inf"),
        pytest.param([120, 60], [1.0, 2.0], "strictly increasing", id="time going back"),
        pytest.param([60, 60], [1.0, 2.0], "strictly increasing", id="repeated time"),
        pytest.param([0, 60, 150, 210], [1, 2, 3, 4.0], "not on a regular grid", id="irregular step"),
    ],
)
def test_check_series_errors(t_s, y, match):
    with pytest.raises(ValueError, match=match):
        check_series(t_s, y, who="test")


def test_check_series_fills_gaps_with_nan():
    # step 60 s; 120 -> 240 skips one interval (180)
    t, y = check_series([60, 120, 240], [1.0, 2.0, 4.0], who="test")
    assert t.tolist() == [60, 120, 180, 240]
    assert y[:2].tolist() == [1, 2] and math.isnan(y[2]) and y[3] == 4


def test_fit_error_names_the_predictor():
    with pytest.raises(ValueError, match=r"KalmanPredictor: y\[0\] = -1.0 is negative"):
        KalmanPredictor().fit([60, 120], [-1.0, 2.0])


# ---------------------------------------------------------------- registry and API contract


def test_unknown_predictor_lists_valid_names():
    with pytest.raises(ValueError, match="unknown predictor 'lstm'; valid names: constant, .*auto"):
        make_predictor("lstm")


def test_unknown_parameter_lists_valid_ones():
    with pytest.raises(ValueError, match="predictor 'kalman': unknown parameter.*min_pts.*valid: min_points"):
        make_predictor("kalman", min_pts=3)


def test_registry_has_the_issue_names():
    assert {"constant", "arima", "kalman", "prophet", "seasonal_naive", "ets", "auto"} <= set(predictor_names())


@pytest.mark.parametrize("name", predictor_names())
def test_api_contract(name):
    """Constructor stores params unchecked; fit validates and returns self; predict reads fitted attrs."""
    p = make_predictor(name, warm_start=False)
    assert p.warm_start is False
    assert not [a for a in vars(p) if a.endswith("_")], "unfitted predictor has fitted attributes"
    with pytest.raises(ValueError, match="call fit"):
        p.predict(1)
    rng = np.random.default_rng(1)
    y = rng.poisson(50, 30).astype(float)
    assert p.fit(minutes(30), y) is p
    for attr in ("t_s_", "y_", "insample_", "interval_s_", "fallback_reason_"):
        assert hasattr(p, attr), attr
    f = p.predict(3)
    q = p.predict_quantile(0.9, 3)
    assert f.shape == (3,) and q.shape == (3,)
    assert np.all(np.isfinite(f)) and np.all(f >= 0) and np.all(np.isfinite(q)) and np.all(q >= 0)
    with pytest.raises(ValueError, match="horizon must be an integer >= 1"):
        p.predict(0)


@pytest.mark.parametrize("name", ["kalman", "ets", "arima", "prophet", "gbm"])
def test_short_history_falls_back_to_last_value(name):
    p = make_predictor(name).fit(minutes(3), [5.0, 9.0, 7.0])
    assert p.predict(2).tolist() == [7.0, 7.0]
    assert "min_points" in p.fallback_reason_


def test_constructor_does_not_validate():
    # sklearn convention: a bad value is stored and only fit complains
    p = make_predictor("kalman", min_points=-1)
    assert p.min_points == -1
    with pytest.raises(ValueError, match="min_points must be an integer >= 2, got -1"):
        p.fit(minutes(5), [1, 2, 3, 4, 5.0])


# ---------------------------------------------------------------- model behaviour


def test_kalman_follows_a_ramp():
    # y = 10, 20, ..., 300: next 310; a local linear trend should be within 3%
    y = 10.0 * np.arange(1, 31)
    f = KalmanPredictor().fit(minutes(30), y).predict(1)[0]
    assert f == pytest.approx(310.0, rel=0.03)


def test_kalman_fits_after_an_idle_stretch_longer_than_its_tune_window():
    # mean lengths of a model idle for 150 minutes (> tune_window 120): NaN, as the collect step reads no requests;
    # the fit starts from the last length seen (1200 tokens) instead of failing on a window without one
    y = np.concatenate([np.full(20, 1200.0), np.full(150, np.nan)])
    f = KalmanPredictor().fit(minutes(170), y).predict(1)[0]
    assert f == pytest.approx(1200.0, rel=1e-6)


@pytest.mark.parametrize("name", ["kalman", "ets"])
def test_flat_series_predicts_the_level(name):
    f = make_predictor(name).fit(minutes(40), np.full(40, 42.0)).predict(2)
    np.testing.assert_allclose(f, 42.0, rtol=1e-6)


def test_ets_smooths_noise_better_than_last_value():
    # iid noise around 100: an EWMA beats last value (MASE < 1) out of sample
    from planner.backtest import rolling_origin

    rng = np.random.default_rng(3)
    y = 100 + rng.normal(0, 10, 120)
    r = rolling_origin(minutes(120), y, lambda: make_predictor("ets", warm_start=True), start=20)
    assert r.scores.mase < 0.85


def test_auto_beats_last_value_on_noise_and_matches_it_on_a_random_walk():
    from planner.backtest import rolling_origin

    rng = np.random.default_rng(4)
    noise = 100 + rng.normal(0, 10, 90)
    walk = 500 + np.cumsum(rng.normal(0, 10, 90))
    auto = lambda: make_predictor("auto", candidates="ets,kalman", warm_start=True)  # noqa: E731
    r_noise = rolling_origin(minutes(90), noise, auto, start=30)
    r_walk = rolling_origin(minutes(90), walk, auto, start=30)
    assert r_noise.scores.mase < 0.9
    assert r_walk.scores.mase < 1.05  # never worse than last value by more than noise


def test_auto_keeps_last_value_until_it_can_score():
    p = make_predictor("auto").fit(minutes(2), [5.0, 6.0])
    assert p.chosen_ == "constant" and p.predict(1).tolist() == [6.0]


def test_auto_rejects_itself_as_candidate():
    with pytest.raises(ValueError, match="'auto' cannot be its own candidate"):
        make_predictor("auto", candidates="auto,kalman").fit(minutes(10), np.arange(10.0))


def test_warm_start_reuses_tuning_until_due():
    y = 100 + 10 * np.sin(np.arange(80) / 3.0)
    p = KalmanPredictor(warm_start=True, retune_every=24).fit(minutes(60), y[:60])
    tuned_at = p.tuned_at_s_
    p.fit(minutes(61), y[:61])
    assert p.tuned_at_s_ == tuned_at  # 1 new point < 24: reuse
    p.fit(minutes(61 + 24), np.concatenate([y, y])[: 61 + 24])
    assert p.tuned_at_s_ > tuned_at


def test_warm_start_ignored_for_a_different_series():
    p = KalmanPredictor(warm_start=True).fit(minutes(60), np.arange(60.0))
    # a series that ends earlier is not a continuation: full refit
    p.fit(minutes(30, start=0.0), np.arange(30.0))
    assert p.tuned_at_s_ == minutes(30, start=0.0)[-1]


# ---------------------------------------------------------------- never negative or NaN

series = st.lists(
    st.one_of(st.floats(min_value=0, max_value=1e6), st.just(NAN)), min_size=1, max_size=60
).filter(lambda v: any(math.isfinite(x) for x in v))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(y=series, name=st.sampled_from(CHEAP), h=st.integers(1, 4))
def test_never_negative_or_nan(y, name, h):
    p = make_predictor(name).fit(minutes(len(y)), y)
    for out in (p.predict(h), p.predict_quantile(0.9, h), p.predict_quantile(0.1, h)):
        assert np.all(np.isfinite(out)) and np.all(out >= 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(y=series)
def test_forecast_next_never_negative_or_nan(y):
    n = len(y)
    isl = [NAN if not math.isfinite(v) or v == 0 else 1000.0 + v for v in y]
    h = history(y, isl=isl, osl=[NAN] * n)
    f = forecast_next(h, PredictorConfig(name="auto", length_predictor="kalman"))
    for v in (f.num_requests, f.num_requests_p90, f.avg_isl_tokens, f.avg_osl_tokens):
        assert math.isfinite(v) and v >= 0
    assert f.num_requests_p90 >= f.num_requests


# ---------------------------------------------------------------- forecast_next


def test_forecast_next_falls_back_to_constant_until_min_history():
    f = forecast_next(history([10, 20, 30]), PredictorConfig(name="kalman", min_history_points=5))
    assert f.predictor == "constant"
    assert f.num_requests == 30.0
    assert any("3 points < min_history_points 5" in n and "instead of kalman" in n for n in f.notes)


def test_forecast_next_uses_the_model_once_history_suffices():
    y = 10.0 * np.arange(1, 31)
    f = forecast_next(history(y), PredictorConfig(name="kalman", min_history_points=5))
    assert f.predictor == "kalman" and f.num_requests == pytest.approx(310.0, rel=0.03)
    assert f.num_requests_p90 >= f.num_requests


def test_forecast_next_lengths_skip_empty_intervals():
    # ISL NaN where an interval had no requests: the last finite ISL (1200) is used
    f = forecast_next(
        history([5, 0, 4], isl=[1000.0, NAN, 1200.0], osl=[80.0, NAN, NAN]),
        PredictorConfig(name="constant"),
    )
    assert (f.num_requests, f.avg_isl_tokens, f.avg_osl_tokens) == (4.0, 1200.0, 80.0)


def test_forecast_next_no_length_data_gives_zero_with_note():
    f = forecast_next(history([0, 0], isl=[NAN, NAN], osl=[NAN, NAN]), PredictorConfig(name="constant"))
    assert f.avg_isl_tokens == 0.0 and any("avg_isl_tokens: no interval had requests" in n for n in f.notes)


def test_forecast_next_empty_history_is_an_error():
    with pytest.raises(ValueError, match="history is empty"):
        forecast_next(history([]), PredictorConfig())


def test_cache_changes_speed_not_decisions():
    rng = np.random.default_rng(7)
    y = 200 + rng.normal(0, 20, 200).clip(-150)
    cfg = PredictorConfig(name="auto", length_predictor="ets")
    cache: dict = {}
    for n in range(150, 161):  # ten intervals of a planner with a cache
        cached = forecast_next(history(y[:n]), cfg, cache=cache)
    fresh = forecast_next(history(y[:160]), cfg)  # the cache was lost
    assert cache, "the cache holds fitted predictors"
    assert cached.num_requests == pytest.approx(fresh.num_requests, rel=0.05)
    assert cached.num_requests_p90 == pytest.approx(fresh.num_requests_p90, rel=0.1)


def test_config_rejects_unknown_predictor_and_parameter():
    with pytest.raises(ValueError, match="unknown predictor 'lstm'"):
        PredictorConfig(name="lstm")
    with pytest.raises(ValueError, match="predictor.params.kalman: .*unknown parameter"):
        PredictorConfig(params={"kalman": {"noise": 1.0}})


def test_config_params_reach_the_predictor():
    # kalman min_points 50 > 30 points: the predictor itself falls back and says so
    cfg = PredictorConfig(name="kalman", params={"kalman": {"min_points": 50}})
    f = forecast_next(history(np.arange(1, 31)), cfg)
    assert f.num_requests == 30.0 and any("min_points 50" in n for n in f.notes)


# ---------------------------------------------------------------- warm start from a trace


def test_bin_requests_hand_counted():
    # bins [0,60) [60,120) [120,180): arrivals 1, 59 | - | 130
    h = bin_requests([1.0, 59.0, 130.0], [100, 300, 50], [10, 30, 5], bin_s=60.0)
    assert h.t_s == (60.0, 120.0, 180.0)
    assert h.num_requests == (2.0, 0.0, 1.0)
    assert h.avg_isl_tokens[0] == 200.0 and math.isnan(h.avg_isl_tokens[1]) and h.avg_isl_tokens[2] == 50.0
    assert h.avg_osl_tokens[0] == 20.0


def test_mooncake_trace_primes_a_predictor(shared_data):
    from workloads.traces import bin_trace, load_trace

    path = shared_data / "traces" / "mooncake_fast25_synthetic_trace.jsonl.gz"
    warm = bin_trace(load_trace(path), bin_s=60.0)
    assert sum(warm.num_requests) == 3993  # every request of the trace lands in a bin
    live = history([230.0, 240.0])
    primed = prime_history(warm, live)
    assert len(primed) == len(warm) + 2 and primed.t_s[len(warm)] == live.t_s[0]
    assert primed.t_s[len(warm) - 1] == live.t_s[0] - 60.0
    cfg = PredictorConfig(name="kalman", min_history_points=10)
    assert forecast_next(live, cfg).predictor == "constant"  # 2 live points alone: fallback
    assert forecast_next(primed, cfg).predictor == "kalman"  # primed: the model forecasts


def test_prime_history_needs_the_same_interval():
    with pytest.raises(ValueError, match="warm-start interval 30.0 s differs from live interval 60.0 s"):
        prime_history(history([1.0], interval_s=30.0), history([1.0]))


# ---------------------------------------------------------------- ARIMA, Prophet, boosted trees


def daily_wave(n: int, step_s: float, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Load with a daily cycle (1000 +/- 400) and small noise, at real Unix times."""
    t = 1.7e9 + step_s * np.arange(1, n + 1)
    rng = np.random.default_rng(seed)
    return t, 1000 + 400 * np.sin(2 * np.pi * t / 86400) + rng.normal(0, 20, n)


def test_arima_uses_fourier_terms_once_two_days_exist_and_keeps_its_order():
    t, y = daily_wave(110, 1800.0)  # 30-min bins: 110 points = 2.3 days
    p = make_predictor("arima", warm_start=True, max_p=1, max_q=1, select_window=110, reselect_every=48)
    p.fit(t[:100], y[:100])
    assert p.harmonics_ == 3  # 100 x 30 min = 2.08 days >= 2
    order, selected_at = p.order_, p.selected_at_s_
    p.fit(t[:101], y[:101])  # one new point: no new order search
    assert (p.order_, p.selected_at_s_) == (order, selected_at)
    # the daily cycle is forecast: next half hour within 10% of the noiseless wave
    f = p.predict(1)[0]
    truth = 1000 + 400 * np.sin(2 * np.pi * (t[100] + 1800) / 86400)
    assert f == pytest.approx(truth, rel=0.1)


def test_arima_short_history_has_no_fourier_terms():
    t, y = daily_wave(40, 600.0)  # 6.7 hours
    p = make_predictor("arima", max_p=1, max_q=1).fit(t, y)
    assert p.harmonics_ == 0


def test_prophet_uses_real_timestamps_and_daily_seasonality():
    t, y = daily_wave(3 * 144, 600.0)  # 3 days of 10-min bins
    p = make_predictor("prophet").fit(t[:-6], y[:-6])
    assert p.spec_ == (True, False)  # daily on (>= 2 days), weekly off (< 14 days)
    f = p.predict(6)
    truth = 1000 + 400 * np.sin(2 * np.pi * t[-6:] / 86400)
    assert np.max(np.abs(f - truth)) < 60  # noise sd 20


def test_prophet_warm_start_reuses_the_fit_between_refits():
    t, y = daily_wave(300, 600.0)
    p = make_predictor("prophet", warm_start=True, refit_every=6).fit(t[:200], y[:200])
    model = p.model_
    p.fit(t[:203], y[:203])
    assert p.model_ is model  # 3 new points < 6: cached Prophet fit, new residual correction
    p.fit(t[:206], y[:206])
    assert p.model_ is not model


def test_gbm_scores_itself_out_of_sample():
    t, y = daily_wave(400, 600.0)
    p = make_predictor("gbm", holdout=50).fit(t, y)
    # only the held-out tail has one-step forecasts; earlier points were training data
    assert np.isnan(p.insample_[:349]).all() and np.isfinite(p.insample_[350:]).all()
    assert abs(p.predict(1)[0] - (1000 + 400 * np.sin(2 * np.pi * (t[-1] + 600) / 86400))) < 150


# ---------------------------------------------------------------- cold path and warm-start safety


def _noisy_walk(n: int, *, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 500.0 + np.cumsum(rng.normal(0.0, 10.0, n)) + rng.normal(0.0, 25.0, n)


@pytest.mark.parametrize(
    "gaps",
    [pytest.param((), id="no gaps"), pytest.param((10, 11, 50), id="missing points 10, 11, 50: predict only")],
)
def test_kalman_grid_pass_equals_filterpy_for_every_candidate(gaps):
    import itertools

    from planner.predictors.kalman import LEVEL_RATIOS, SLOPE_RATIOS, _filter, grid_priors

    v = _noisy_walk(120)
    v[list(gaps)] = NAN
    grid = list(itertools.product(LEVEL_RATIOS, SLOPE_RATIOS))
    priors = grid_priors(v, 40.0, np.array([g[0] for g in grid]), np.array([g[1] for g in grid]))
    for k, (ql, qs) in enumerate(grid):
        expected, _, _ = _filter(v, 40.0, ql, qs)
        np.testing.assert_allclose(priors[k], expected, rtol=1e-9, equal_nan=True, err_msg=f"ratios {ql}, {qs}")


@pytest.mark.parametrize("name, params", [
    pytest.param("kalman", {}, id="kalman: one filter pass"),
    pytest.param("ets", {}, id="ets: one fixed-parameter run"),
    pytest.param("gbm", {"min_points": 60, "holdout": 40}, id="gbm: its held-out forecasts"),
])
def test_out_of_sample_forecasts_never_see_their_target(name, params):
    """Changing the point forecast (and everything after it) leaves the forecast unchanged."""
    y = _noisy_walk(160)
    t = minutes(160)
    idx = list(range(130, 160))
    base = make_predictor(name, **params).fit(t, y).out_of_sample(idx)
    assert np.all(np.isfinite(base)) and np.all(base >= 0)
    for i in (135, 150):
        bumped = y.copy()
        bumped[i:] += 400.0
        again = make_predictor(name, **params).fit(t, bumped).out_of_sample(idx)
        np.testing.assert_allclose(again[: i - 130 + 1], base[: i - 130 + 1], rtol=1e-9)
        assert not np.allclose(again[i - 130 + 1 :], base[i - 130 + 1 :]), "later forecasts do see the bump"


@pytest.mark.parametrize("name", ["kalman", "ets"])
def test_one_pass_out_of_sample_matches_refitting_point_by_point_within_noise(name):
    """The fast path scores like the slow one: mean |difference| < 10% of last value's MAE."""
    from planner.predictors.base import PredictorBase

    y = _noisy_walk(200)
    t = minutes(200)
    idx = list(range(152, 200))
    p = make_predictor(name).fit(t, y)
    fast = p.out_of_sample(idx)
    slow = PredictorBase.out_of_sample(p, idx)
    noise = np.mean(np.abs(np.diff(y[151:])))
    assert np.mean(np.abs(fast - slow)) < 0.1 * noise


@pytest.mark.parametrize("shift_s, scale, revise_last, reuse", [
    pytest.param(0.0, 1.0, False, True, id="same grid, one more point: reuse"),
    pytest.param(7.0, 1.0, False, True, id="7 s late on 60-s bins (< 15 s): reuse, snapped to the old grid"),
    pytest.param(20.0, 1.0, False, False, id="20 s off (> a quarter bin): cold"),
    pytest.param(0.0, 1.5, False, False, id="values x1.5 (what-if): cold"),
    pytest.param(0.0, 1.0, True, True, id="newest old point revised by late samples: reuse"),
])
def test_warm_start_reuses_only_a_continuation_of_the_same_series(shift_s, scale, revise_last, reuse):
    y = _noisy_walk(101)
    p = KalmanPredictor(warm_start=True).fit(minutes(100), y[:100])
    tuned_at = p.tuned_at_s_
    new = scale * y.copy()
    if revise_last:
        new[99] *= 1.3
    assert p._extends_previous(minutes(101) + shift_s, new) is reuse
    p.fit(minutes(101) + shift_s, new)
    assert bool(p.tuned_at_s_ == tuned_at) is reuse
    if reuse:
        np.testing.assert_allclose(p.t_s_, minutes(101), atol=1e-6)


def test_auto_cold_start_scores_candidates_without_refitting_them_per_point(monkeypatch):
    from planner.predictors.base import PredictorBase

    def refit_per_point(self, indices):
        raise AssertionError(f"{self.name} refitted point by point on a cold start")

    monkeypatch.setattr(PredictorBase, "out_of_sample", refit_per_point)
    y = _noisy_walk(288)
    p = make_predictor("auto", candidates="ets,kalman,gbm").fit(minutes(288), y)
    assert set(p.scores_) == {"ets", "kalman", "gbm"}
    assert all(n == 48 for _, _, n in p.scores_.values()), "every candidate scored on the 48-point window"


class _BrokenCache(dict):
    def get(self, key, default=None):
        raise OSError("disk on fire")


def test_forecast_next_survives_a_bad_cache_entry():
    y = _noisy_walk(40)
    cfg = PredictorConfig(name="kalman")
    cold = forecast_next(history(y), cfg)
    wrong_type = {("forecast_next", "num_requests", "kalman", "[]"): "not a predictor"}
    f = forecast_next(history(y), cfg, cache=wrong_type)
    assert f.num_requests == cold.num_requests
    assert any("cached kalman entry is a str: fitted from scratch" in n for n in f.notes)
    assert isinstance(wrong_type[("forecast_next", "num_requests", "kalman", "[]")], KalmanPredictor)

    broken_state = KalmanPredictor(warm_start=True).fit(minutes(40), y)
    broken_state.cov_ = "garbage"  # a state the warm path cannot use
    f = forecast_next(history(np.append(y, 510.0)), cfg,
                      cache={("forecast_next", "num_requests", "kalman", "[]"): broken_state})
    assert f.num_requests == forecast_next(history(np.append(y, 510.0)), cfg).num_requests
    assert any("cached kalman state unusable" in n for n in f.notes)

    f = forecast_next(history(y), cfg, cache=_BrokenCache())
    assert f.num_requests == cold.num_requests
    assert any("predictor cache unreadable (OSError)" in n for n in f.notes)


def test_arima_search_survives_windows_the_concentrated_likelihood_cannot_fit():
    # A noiseless sine is an exact AR(2): every concentrated candidate ends at a
    # unit root and pmdarima rejects it; the full-likelihood search still finds one.
    t = minutes(40)
    y = 100.0 + 10.0 * np.sin(np.arange(40))
    p = make_predictor("arima").fit(t, y)
    assert p.fallback_reason_ is None and p.order_ is not None
    assert p.predict(1)[0] == pytest.approx(100.0 + 10.0 * np.sin(40), abs=3.0)


def test_arima_with_no_fitting_order_answers_last_value(monkeypatch):
    from planner.predictors.arima import ArimaPredictor

    def nothing_fits(self, z, X, *, concentrate):
        raise ValueError("Could not successfully fit a viable ARIMA model to input data.")

    monkeypatch.setattr(ArimaPredictor, "_search", nothing_fits)
    y = _noisy_walk(30)
    p = make_predictor("arima").fit(minutes(30), y)
    assert p.fallback_reason_ == "no ARIMA order fits this window: last value"
    assert p.predict(1)[0] == y[-1]


@pytest.mark.parametrize("y, expected", [
    pytest.param([1.0, NAN, 3.0, NAN], [NAN, 1.0, 1.0, 3.0], id="a gap carries the last value"),
    pytest.param([NAN, NAN, 2.0, 5.0], [NAN, NAN, NAN, 2.0], id="nothing before the first value"),
    pytest.param([4.0], [NAN], id="one point"),
])
def test_previous_value_by_hand(y, expected):
    from planner.predictors.base import previous_value

    np.testing.assert_array_equal(previous_value(np.array(y)), np.array(expected))


def test_auto_candidates_fit_as_a_direct_fit_does():
    # auto fits its candidates on its own validated series without validating again: the same models.
    from planner.predictors.auto import CANDIDATES

    rng = np.random.default_rng(5)
    t, y = minutes(60), np.abs(rng.normal(100.0, 20.0, 60))
    y[[7, 30]] = NAN
    auto = make_predictor("auto").fit(t, y)
    for name, model in auto.models_.items():
        direct = CANDIDATES[name].from_params().fit(t, y)
        np.testing.assert_array_equal(model.predict(3), direct.predict(3))
        np.testing.assert_array_equal(model.predict_quantile(0.9, 2), direct.predict_quantile(0.9, 2))


def test_nested_single_threaded_limits_hold_and_restore():
    # auto's candidates enter the limit inside auto's own: the inner one must neither lift it on leaving
    # nor leave the pools limited once the outer one is left.
    from threadpoolctl import threadpool_info

    from planner.predictors.base import single_threaded

    def threads() -> dict[str, int]:
        return {p["filepath"]: p["num_threads"] for p in threadpool_info()}

    before = threads()
    with single_threaded():
        limited = {f for f, n in threads().items() if n == 1}
        with single_threaded(with_sklearn=True):
            assert all(threads()[f] == 1 for f in limited)
        assert all(threads()[f] == 1 for f in limited)
    assert {f: n for f, n in threads().items() if f in before} == before


@pytest.mark.parametrize("period", [2, 3, 5, 8])
def test_ets_season_waits_until_statsmodels_can_initialise_it(period):
    # A short season (a 5-minute cycle at 60 s bins) is added once two seasons are there *and* statsmodels'
    # heuristic initialisation has its 10 + 2 * (period // 2) points; with 10-13 points of a 5-bin season
    # the fit used to raise inside statsmodels and fail the planner run.
    from planner.predictors.ets import ExponentialSmoothingPredictor

    rng = np.random.default_rng(period)
    y = 50 + 20 * np.sin(2 * np.pi * np.arange(40) / period) + rng.normal(0, 3, 40)
    need = max(2 * period, 10 + 2 * (period // 2))
    for n in range(5, 3 * period + 14):
        p = ExponentialSmoothingPredictor(season_s=60.0 * period).fit(60.0 * np.arange(1, n + 1), y[:n])
        assert (p.spec_[2] == period) == (n >= need), n
        assert np.isfinite(p.predict(2)).all()


ROBUST_CONFIGS = {
    "kalman": ("kalman", {}), "seasonal naive 300 s": ("seasonal_naive", {"season_s": 300.0}), "ets": ("ets", {}),
    "ets trend": ("ets", {"trend": "add"}), "ets season 300 s": ("ets", {"season_s": 300.0}),
    "ets trend season 120 s": ("ets", {"season_s": 120.0, "trend": "add"}),
    "ets log1p season 600 s": ("ets", {"log1p": True, "season_s": 600.0}), "gbm": ("gbm", {}), "auto": ("auto", {}),
    "auto with seasons": ("auto", {"candidates": "constant,ets,kalman,seasonal_naive", "candidate_params": {
        "seasonal_naive": {"season_s": 300.0}, "ets": {"season_s": 300.0}}}),
}
ROBUST_SERIES = {
    "counts": lambda rng, n: rng.poisson(30, n).astype(float),
    "all zero": lambda rng, n: np.zeros(n),
    "flat": lambda rng, n: np.full(n, 7.0),
    "gaps": lambda rng, n: np.where(rng.random(n) < 0.3, NAN, rng.poisson(30, n)).astype(float),
    "bursts": lambda rng, n: np.where(np.arange(n) % 7 == 0, 400.0, 0.0),
    "huge": lambda rng, n: 1e9 + rng.normal(0, 1e6, n),
}


@pytest.mark.parametrize("series", list(ROBUST_SERIES))
@pytest.mark.parametrize("config", list(ROBUST_CONFIGS))
def test_every_predictor_forecasts_from_one_point_on(config, series):
    # A planner run must never fail on a short or odd history: from the first point on, cold or warm-started,
    # every configuration answers finite, non-negative forecasts and quantiles (one point with auto used to
    # raise IndexError; a short season inside statsmodels' ValueError).
    name, params = ROBUST_CONFIGS[config]
    rng = np.random.default_rng(5)
    y = ROBUST_SERIES[series](rng, 22)  # past every season's start (600 s: 20 points)
    y[0] = 3.0 if not np.isfinite(y[0]) else y[0]
    warm = make_predictor(name, warm_start=True, **params)
    for n in range(1, y.size + 1):
        for p in (make_predictor(name, **params), warm):
            p.fit(minutes(n), y[:n])
            f, q = p.predict(2), p.predict_quantile(0.9, 2)
            assert np.isfinite(f).all() and np.isfinite(q).all() and (f >= 0).all() and (q >= 0).all(), (n, f, q)


@pytest.mark.parametrize("name, params, message", [
    ("ets", {"season_s": "x"}, "ExponentialSmoothingPredictor: season_s must be a number >= 0, got 'x'"),
    ("ets", {"season_s": -60}, "season_s must be a number >= 0, got -60"),
    ("ets", {"fit_window": 0}, "fit_window must be an integer >= 2, got 0"),
    ("ets", {"warm_start": "no"}, "warm_start must be true or false, got 'no'"),
    ("kalman", {"tune_window": 0}, "KalmanPredictor: tune_window must be an integer >= 2, got 0"),
    ("kalman", {"min_points": True}, "min_points must be an integer >= 2, got True"),
    ("arima", {"log1p": "yes"}, "ArimaPredictor: log1p must be true or false, got 'yes'"),
    ("gbm", {"learning_rate": math.nan}, "learning_rate must be a number > 0, got nan"),
    ("constant", {"residual_window": 0}, "residual_window must be an integer >= 1, got 0"),
    ("auto", {"margin_frac": "x"}, "AutoPredictor: margin_frac must be a number >= 0, got 'x'"),
    ("auto", {"candidates": "ets,nope"}, "unknown predictor 'nope'"),
    ("auto", {"candidate_params": {"prophet": {}}}, "candidate_params names 'prophet', not a candidate"),
    ("auto", {"candidate_params": {"ets": {"season_s": -1}}}, "ExponentialSmoothingPredictor: season_s must be"),
])
def test_a_bad_hyperparameter_fails_the_configuration_naming_it(name, params, message):
    # Checked when the configuration loads, not in the first planner run that fits: one message naming the
    # predictor's params entry, the parameter and the value.
    with pytest.raises(ValueError, match=re.escape(f"predictor.params.{name}: ") + ".*" + re.escape(message)):
        PredictorConfig(name=name, params={name: params})


def test_auto_takes_its_candidates_parameters_from_the_configuration():
    cfg = PredictorConfig(name="auto", params={"auto": {"candidate_params": {"ets": {"season_s": 300.0}}}})
    t = minutes(40)
    y = 50 + 30 * np.sin(2 * np.pi * np.arange(40) / 5)
    forecast = forecast_next(history(y.tolist()), cfg)
    assert forecast.predictor == "auto" and math.isfinite(forecast.num_requests)
    p = make_predictor("auto", **cfg.params["auto"]).fit(t, y)
    assert p.models_["ets"].spec_[2] == 5  # the 5-bin season the configuration asked for
