"""Replay speed-ups change speed only: each fast path gives the same floats as the code it replaces."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from planner.predictors import ets, ses
from planner.predictors.registry import make_predictor
from planner.latency.profile_checks import ProfileRangeWarning
from sim.lookup import ProfileTables
from sim.policies import default_planner_config, make_policy
from sim.replay import ReplaySettings, replay
from workloads.traces import load_trace, multiply_load, time_window

ROOT = Path(__file__).resolve().parents[2]


class StatsmodelsRun:
    """The reference LevelRun replaces: statsmodels' own fixed-parameter run of a level-only model."""

    def __init__(self, z, level0, alpha):
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        model = ExponentialSmoothing(z, trend=None, damped_trend=False, seasonal=None, initialization_method="known",
                                     initial_level=level0)
        self.res = model.fit(optimized=False, smoothing_level=alpha)
        self.params = self.res.params
        self.fittedvalues = self.res.fittedvalues

    def forecast(self, h):
        return self.res.forecast(h)


@pytest.mark.parametrize("n", [3, 9, 10, 11, 60, 288], ids=lambda n: f"{n} points")
@pytest.mark.parametrize("alpha", [0.0, 0.13, 0.5, 0.9999], ids=lambda a: f"alpha {a}")
def test_level_run_is_statsmodels_run_bit_for_bit(n, alpha):
    # Both initialisations statsmodels uses for "estimated" are covered: simple below 10 points, heuristic from 10.
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    z = np.random.default_rng(n).gamma(2.0, 40.0, size=n)
    model = ExponentialSmoothing(z, trend=None, damped_trend=False, seasonal=None, initialization_method="estimated")
    assert ses.initial_level(z) == model.initial_values()[0]
    ours = ets.LevelRun(z, ses.initial_level(z), alpha)
    ref = model.fit(optimized=False, smoothing_level=alpha)
    assert np.array_equal(ours.fittedvalues, np.asarray(ref.fittedvalues, dtype=float))
    assert np.array_equal(ours.forecast(3), np.asarray(ref.forecast(3), dtype=float))
    assert ours.params["smoothing_level"] == ref.params["smoothing_level"]


@pytest.mark.parametrize("n", [5, 9, 10, 60, 288], ids=lambda n: f"{n} points")
def test_level_run_from_fitted_parameters_is_the_fit_bit_for_bit(n):
    # After an optimisation the fitted alpha and initial level give the fit's own fitted values and forecasts.
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    z = np.random.default_rng(n).poisson(30.0, size=n).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ExponentialSmoothing(z, trend=None, damped_trend=False, seasonal=None,
                                   initialization_method="estimated").fit()
    ours = ets.LevelRun(z, res.params["initial_level"], res.params["smoothing_level"])
    assert np.array_equal(ours.fittedvalues, np.asarray(res.fittedvalues, dtype=float))
    assert np.array_equal(ours.forecast(4), np.asarray(res.forecast(4), dtype=float))


SERIES = {
    "counts": lambda rng, n: rng.poisson(30.0, size=n).astype(float),
    "lengths": lambda rng, n: rng.gamma(2.0, 900.0, size=n),
    "log1p counts": lambda rng, n: np.log1p(rng.poisson(500.0, size=n).astype(float)),
    "mostly idle": lambda rng, n: np.where(rng.random(n) < 0.4, 0.0, rng.poisson(4.0, size=n)).astype(float),
    "flat": lambda rng, n: np.full(n, 12.0),
    "drifting": lambda rng, n: np.abs(800.0 + np.cumsum(rng.normal(0.0, 25.0, size=n))),
}


def statsmodels_level_only_fit(z):
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ExponentialSmoothing(z, trend=None, damped_trend=False, seasonal=None,
                                   initialization_method="estimated").fit()
    return res.params["smoothing_level"], res.params["initial_level"]


@pytest.mark.parametrize("n", [2, 5, 9, 10, 11, 24, 60, 288], ids=lambda n: f"{n} points")
@pytest.mark.parametrize("kind", SERIES)
def test_level_only_fit_is_statsmodels_fit_bit_for_bit(n, kind):
    # The grid start, the L-BFGS-B search and both initialisations (simple below 10 points, heuristic from 10)
    # give statsmodels' smoothing level and initial level exactly, so every later level run is the same too.
    z = SERIES[kind](np.random.default_rng(n), n)
    alpha, level0 = ses.fit_level_only(z)
    ref_alpha, ref_level0 = statsmodels_level_only_fit(z)
    assert alpha == ref_alpha and level0 == ref_level0
    assert 0.0 < alpha < 1.0


def test_level_only_fit_refuses_a_series_with_gaps():
    with pytest.raises(ValueError, match="finite values"):
        ses.fit_level_only(np.array([3.0, np.nan, 4.0]))


@pytest.mark.parametrize("log1p", [False, True])
def test_warm_started_ets_fits_and_forecasts_as_before(monkeypatch, log1p):
    # A rolling warm start: re-optimised every refit_every points, level runs in between; the reference is
    # statsmodels' own run from the same parameters.
    y = np.random.default_rng(7).poisson(50.0, size=80).astype(float)
    y[30] = np.nan
    t = 60.0 * np.arange(1, y.size + 1)

    def roll():
        p = make_predictor("ets", warm_start=True, log1p=log1p, refit_every=6)
        out = []
        for i in range(8, y.size):
            p.fit(t[:i], y[:i])
            out.append((p.insample_.copy(), p.predict(2), p.predict_quantile(0.9, 2)))
        return out

    fast = roll()
    monkeypatch.setattr(ets, "LevelRun", StatsmodelsRun)
    slow = roll()
    for (a, b, c), (x, y_, z) in zip(fast, slow, strict=True):
        assert np.array_equal(a, x, equal_nan=True) and np.array_equal(b, y_) and np.array_equal(c, z)


def statsmodels_level_only(z, params):
    """The reference `ets._level_only` replaces: statsmodels fits the model, or runs it at params."""
    if params is None:
        alpha, level0 = statsmodels_level_only_fit(z)
    else:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        alpha = params["smoothing_level"]
        level0 = ExponentialSmoothing(z, trend=None, damped_trend=False, seasonal=None,
                                      initialization_method="estimated").initial_values()[0]
    return StatsmodelsRun(z, level0, alpha)


@pytest.mark.parametrize("trace_name, copies, minutes", [("azure2023_conv.csv.gz", 2, 40),
                                                         ("mooncake_fast25_synthetic_trace.jsonl.gz", 2, 18)])
def test_replay_outcome_unchanged_by_the_level_only_fast_path(monkeypatch, shared_data, h200_profile_dir, trace_name,
                                                              copies, minutes):
    # Independent tenants (+-30 s): the planner's ETS fits and runs its level-only model without statsmodels;
    # with statsmodels doing both instead, every request's timestamps, the GPU-seconds, scale events and each
    # run's decision must be the same.
    trace = time_window(multiply_load(load_trace(shared_data / "traces" / trace_name), copies, seed=0,
                                      jitter_s=30.0), 0.0, 60.0 * minutes)
    profile = load_profile_dir(h200_profile_dir)
    tables = ProfileTables(profile)
    cfg = default_planner_config(profile_dir=str(h200_profile_dir), ttft_ms=200, itl_ms=10, interval_s=60)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            r = replay(trace, tables, make_policy("planner", cfg=cfg, profile=profile), scenario=ReplaySettings())
        q = r.requests
        return (q.first_token_s, q.finish_s, r.gpu_seconds, r.scale_log, r.timeline.reasons)

    fits, runs = [], []
    fit_level_only = ets.fit_level_only

    def counted_fit(z):
        fits.append(z.size)
        return fit_level_only(z)

    class Counted(ets.LevelRun):
        def __init__(self, *args):
            runs.append(args)
            super().__init__(*args)

    monkeypatch.setattr(ets, "fit_level_only", counted_fit)
    monkeypatch.setattr(ets, "LevelRun", Counted)
    fast = run()
    monkeypatch.setattr(ets, "_level_only", statsmodels_level_only)
    slow = run()
    # A planner run every interval, each fitting or running ETS on three series; some fits optimised.
    assert len(fast[4]) >= minutes - 2 and len(runs) > minutes and fits
    assert np.array_equal(fast[0], slow[0], equal_nan=True) and np.array_equal(fast[1], slow[1], equal_nan=True)
    assert fast[2:] == slow[2:]


@pytest.mark.parametrize("name", ["ets", "auto"])
def test_fitting_level_only_ets_loads_neither_scikit_learn_nor_statsmodels(name):
    # Only gradient boosting needs scikit-learn (~0.2 s to import) and only a trend or a season needs statsmodels
    # and pandas (~0.25 s): a process fitting the default exponential smoothing, alone or among auto's
    # candidates below gradient boosting's 200 points, must load none of them.
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import numpy as np\n"
        "from planner.predictors.registry import make_predictor\n"
        "y = np.random.default_rng(0).poisson(30.0, size=40).astype(float)\n"
        f"p = make_predictor({name!r}).fit(60.0 * np.arange(1, 41), y)\n"
        "assert p.fallback_reason_ is None and p.predict(1)[0] > 0\n"
        "print(sorted(m for m in ('sklearn', 'statsmodels', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ets_with_a_trend_is_still_fitted_by_statsmodels():
    # The fast path is the level-only model alone: a damped trend gets statsmodels' own fit and forecasts.
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = 40.0 + 0.5 * np.arange(60) + np.random.default_rng(3).normal(0.0, 2.0, size=60)
    p = make_predictor("ets", trend="add").fit(60.0 * np.arange(1, 61), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ExponentialSmoothing(y, trend="add", damped_trend=True, initialization_method="estimated").fit()
    assert p.spec_ == ("add", True, None)
    assert p.params_["smoothing_trend"] == ref.params["smoothing_trend"]
    assert np.array_equal(p.predict(3), np.asarray(ref.forecast(3), dtype=float))


def test_first_gradient_boosting_fit_limits_scikit_learn_threads():
    # scikit-learn is loaded by the first boosted model, after `fit` set its thread limit: the model's
    # OpenMP pool must still run one thread while it fits.
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import json\n"
        "import numpy as np\n"
        "from threadpoolctl import threadpool_info\n"
        "from planner.predictors.gbm import GradientBoostingPredictor\n"
        "def openmp(): return [p['num_threads'] for p in threadpool_info() if p['user_api'] == 'openmp']\n"
        "seen, new_model = [], GradientBoostingPredictor._new_model\n"
        "def spy(self):\n"
        "    model = new_model(self)  # scikit-learn is loaded from here on\n"
        "    seen.append(openmp())\n"
        "    return model\n"
        "GradientBoostingPredictor._new_model = spy\n"
        "assert 'sklearn' not in sys.modules\n"
        "y = 50 + 10 * np.sin(np.arange(300) / 20) + np.random.default_rng(0).normal(0, 2, 300)\n"
        "p = GradientBoostingPredictor().fit(60.0 * np.arange(1, 301), y)\n"
        "assert p.fallback_reason_ is None\n"
        "print(json.dumps(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    during = json.loads(out.stdout)
    assert during and all(threads == [1] for threads in during)


def _auto_run(series: np.ndarray, *, hint: bool, monkeypatch) -> list[tuple]:
    """Warm auto fits over a growing series: each fit's forecast, quantile and every candidate's state."""
    from planner.predictors import base

    checks = []
    extends = base.PredictorBase._extends_previous

    def counted(self, t_s, y):
        known = bool(self.__dict__.get("_extends_known"))
        if not hint:
            self.__dict__.pop("_extends_known", None)
        answer = extends(self, t_s, y)
        checks.append((type(self).__name__, known, answer))
        return answer

    monkeypatch.setattr(base.PredictorBase, "_extends_previous", counted)
    p = make_predictor("auto", warm_start=True)
    out = []
    for n in range(6, series.size + 1):
        p.fit(60.0 * np.arange(1, n + 1) + 0.4 * (n % 3), series[:n])  # runs a few seconds apart
        out.append((p.chosen_, float(p.predict(1)[0]), float(p.predict_quantile(0.9, 2)[-1]),
                    {name: (m.insample_.tobytes(), float(m.predict(1)[0])) for name, m in p.models_.items()}))
    monkeypatch.undo()
    return out, checks


def test_auto_candidates_take_autos_verdict_that_the_series_extends_the_last(monkeypatch):
    # auto compares a new series with the one it was last fitted on; its kept candidates were fitted on that same
    # series, so they take its verdict instead of comparing again. Every fit must come out as when each
    # candidate compares for itself, and a fresh candidate (no previous series) gets no verdict.
    rng = np.random.default_rng(3)
    series = np.r_[rng.poisson(40, 30), rng.poisson(90, 30)].astype(float)
    with_hint, checks = _auto_run(series, hint=True, monkeypatch=monkeypatch)
    without, own_checks = _auto_run(series, hint=False, monkeypatch=monkeypatch)
    assert with_hint == without
    taken = [c for c in checks if c[1]]
    assert taken and all(answer for _, _, answer in taken)  # a verdict given is a yes
    assert {name for name, _, _ in taken} >= {"KalmanPredictor", "ExponentialSmoothingPredictor"}
    # Each candidate was asked as often both ways; only auto's own check and cold candidates compare.
    assert len(checks) == len(own_checks)
    assert not any(known for name, known, _ in checks if name == "AutoPredictor")


@pytest.mark.parametrize("x", [
    (0.3, 12.0), (0.0, 12.0), (1.0, 12.0), (1.0 - 5e-9, 12.0),  # at and near either bound of the level
    (0.7, -40.0), (0.5, 3e9), (0.5, -3e9), (0.2, 0.0),  # a step of 1e-8 lost in a large initial level's rounding
])
def test_level_only_gradient_is_lbfgsbs_own_forward_difference(x):
    # fit_level_only hands L-BFGS-B the forward difference it would otherwise take itself with SciPy's
    # approx_derivative (absolute step 1e-8, L-BFGS-B's bounds); each entry must be the same float.
    from scipy.optimize._numdiff import approx_derivative

    z = np.random.default_rng(7).poisson(30.0, size=25).astype(float)
    z_list = z.tolist()

    def f(p):
        return ses._sse(z, z_list, float(p[0]), float(p[1]))

    x = np.array(x)
    ref = approx_derivative(f, x, method="2-point", abs_step=1e-8, bounds=([0.0, -np.inf], [1.0, np.inf]))
    assert ses.forward_gradient(f, x).tolist() == np.ravel(ref).tolist()


def test_level_only_fit_with_the_gradient_given_is_the_fit_without(monkeypatch):
    # The search L-BFGS-B runs with the gradient handed over is the one it runs estimating it: the same result.
    from scipy import optimize

    rng = np.random.default_rng(11)
    series = [rng.poisson(rng.uniform(1, 5000), size=rng.integers(2, 80)).astype(float) for _ in range(150)]
    series += [np.r_[np.full(20, 7.0), np.full(20, 900.0)], np.full(12, 3.0), 1e9 + rng.normal(0, 5e3, 30)]
    fast = [ses.fit_level_only(z) for z in series]

    def no_gradient(fun, x0, jac=None, **kwargs):
        return optimize.minimize(fun, x0, **kwargs)

    monkeypatch.setattr(ses, "minimize", no_gradient)
    assert [ses.fit_level_only(z) for z in series] == fast


def _pandas_lag_features(z, t_s, *, period):
    """The gradient-boosting features as pandas computed them before (the reference the fast path replaces)."""
    import pandas as pd

    from planner.predictors.gbm import DAY_S

    n = z.size
    s = pd.Series(z)
    last = s.shift(1)
    cols = [last - s.shift(k) for k in (2, 3, 4)]
    cols += [last - s.shift(1).rolling(w, min_periods=2).median() for w in (6, 24)]
    if period >= 2:
        cols.append(s.shift(period) - last)
        cols.append(s.shift(period) - s.shift(period + 1))
    else:
        cols += [pd.Series(np.full(n, np.nan))] * 2
    tod = 2.0 * np.pi * (np.asarray(t_s, dtype=float) % DAY_S) / DAY_S
    return np.column_stack([c.to_numpy(dtype=float) for c in cols] + [np.sin(tod), np.cos(tod)])


@pytest.mark.parametrize("seed", range(4))
def test_gradient_boosting_features_are_pandas_rolling_medians_bit_for_bit(seed):
    # Series of 1-400 points, spikes, leading NaNs (before the first finite value, as forward-filling leaves
    # them), with and without a daily period: every feature the same float, NaN where pandas has NaN.
    from planner.predictors.gbm import lag_features

    rng = np.random.default_rng(seed)
    for _ in range(100):
        n = int(rng.integers(1, 400))
        z = np.log1p(rng.exponential(100.0, n) * rng.choice([1.0, 5.0], n))
        z[: int(rng.integers(0, min(n, 30) + 1)) if rng.random() < 0.5 else 0] = np.nan
        t_s = 60.0 * np.arange(n) + float(rng.integers(0, 86_400))
        period = int(rng.choice([1, 24, 50, 1440]))
        fast, ref = lag_features(z, t_s, period=period), _pandas_lag_features(z, t_s, period=period)
        assert fast.shape == ref.shape and np.array_equal(fast, ref, equal_nan=True), (n, period)
