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
from planner.predictors import ets
from planner.predictors.registry import make_predictor
from planner.profile_checks import ProfileRangeWarning
from sim.lookup import ProfileTables
from sim.policies import default_planner_config, make_policy
from sim.replay import ReplaySettings, replay
from sim.traces import load_trace, multiply_load, time_window

ROOT = Path(__file__).resolve().parents[1]


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
    ours = ets.LevelRun(z, model.initial_values()[0], alpha)
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


def test_replay_outcome_unchanged_by_the_level_run(monkeypatch, shared_data, h200_profile_dir):
    # 40 minutes of conv x2 (independent tenants): the planner's ETS runs at fixed parameters between refits;
    # every request's timestamps, the GPU-seconds, scale events and each run's decision must be the same.
    trace = time_window(multiply_load(load_trace(shared_data / "traces" / "azure2023_conv.csv.gz"), 2, seed=0,
                                      jitter_s=30.0), 0.0, 2400.0)
    profile = load_profile_dir(h200_profile_dir)
    tables = ProfileTables(profile)
    cfg = default_planner_config(profile_dir=str(h200_profile_dir), ttft_ms=200, itl_ms=10, interval_s=60)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            r = replay(trace, tables, make_policy("planner", cfg=cfg, profile=profile), scenario=ReplaySettings())
        q = r.requests
        return (q.first_token_s, q.finish_s, r.gpu_seconds, r.scale_log, r.timeline.reasons)

    runs = []

    class Counted(ets.LevelRun):
        def __init__(self, *args):
            runs.append(args)
            super().__init__(*args)

    monkeypatch.setattr(ets, "LevelRun", Counted)
    fast = run()
    monkeypatch.setattr(ets, "LevelRun", StatsmodelsRun)
    slow = run()
    assert len(fast[4]) >= 40 and len(runs) > 40  # a planner run every interval, most with level runs
    assert np.array_equal(fast[0], slow[0], equal_nan=True) and np.array_equal(fast[1], slow[1], equal_nan=True)
    assert fast[2:] == slow[2:]


def test_fitting_ets_does_not_load_scikit_learn():
    # Only gradient boosting needs scikit-learn; the thread limit around the others must not import it (~0.2 s).
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import numpy as np\n"
        "from planner.predictors.registry import make_predictor\n"
        "y = np.random.default_rng(0).poisson(30.0, size=40).astype(float)\n"
        "p = make_predictor('ets').fit(60.0 * np.arange(1, 41), y)\n"
        "assert p.fallback_reason_ is None and p.predict(1)[0] > 0\n"
        "print('sklearn' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
