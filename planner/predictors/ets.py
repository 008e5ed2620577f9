"""Exponential smoothing (statsmodels Holt-Winters): level, optional damped trend, daily season.

By default this is simple exponential smoothing (an EWMA whose weight is
fitted), which beats last value on noisy series. With `season_s` set (e.g.
86400) an additive season is added once the history spans `min_seasons`
seasons, so the forecast follows the daily cycle; `log1p` makes it
multiplicative.
"""

from __future__ import annotations

import warnings

import numpy as np

from planner.predictors.base import Param, PredictorBase, fill_gaps, single_threaded


# (trend, damped, seasonal period) of a model with a level only: simple exponential smoothing.
_LEVEL_ONLY = (None, False, None)


class ExponentialSmoothingPredictor(PredictorBase):
    """Holt-Winters exponential smoothing with parameters fitted by least squares.

    trend: None (level only) or "add" (additive, damped when damped_trend).
    season_s: season length, seconds (86400: daily); the season is used once
        the history spans min_seasons seasons. Default 0: no season (the
        seasonal variant lost to the plain one on every benchmark series).
    log1p: fit on log1p(y), so the season and errors scale with the level.
    fit_window: without a season, only the most recent this many points are fitted.
    min_points: finite points needed; fewer -> last value.
    refit_every: with warm_start, re-optimise the smoothing parameters after
        this many new points; in between the last parameters are reused and
        only the states are re-run (milliseconds).
    """

    name = "ets"
    PARAMS = (
        Param("trend", None, choices=(None, "add")), Param("damped_trend", True),
        Param("season_s", 0.0), Param("min_seasons", 2.0),
        Param("log1p", False),
        Param("fit_window", 288), Param("min_points", 5, "int", ge=3), Param("refit_every", 24),
    )

    def _fit(self, t_s, y, fixed: dict | None = None) -> "ExponentialSmoothingPredictor":
        """fixed: smoothing parameters to use as they are (no optimisation)."""
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        warm = ("params_", "spec_", "optimized_at_s_", "optimized_points_")
        start = self._start_fit(t_s, y, warm=warm, model="spec_")
        if start is None:
            return self
        reuse, prev, t, v, n_ok, first = start
        if not self.season_s:
            # A level-only model forgets old points geometrically; the recent
            # fit_window points determine it (and cost far less to filter).
            first = max(first, v.size - int(self.fit_window))
        w = fill_gaps(v[first:])
        z = np.log1p(w) if self.log1p else w
        period = int(round(self.season_s / self.interval_s_)) if self.season_s else 0
        seasonal = period >= 2 and z.size >= self.min_seasons * period
        trend = self.trend if z.size >= 10 else None
        spec = (trend, bool(self.damped_trend) and trend is not None, period if seasonal else None)
        model = ExponentialSmoothing(
            z,
            trend=spec[0],
            damped_trend=spec[1],
            seasonal="add" if seasonal else None,
            seasonal_periods=spec[2],
            initialization_method="estimated" if not seasonal else "heuristic",
        )
        old_params, old_spec, optimized_at, optimized_points = prev
        due = self._stale(optimized_at, optimized_points, self.refit_every)
        if fixed is not None:
            old_params, old_spec, reuse, due = fixed, spec, True, False
        with warnings.catch_warnings():
            # Convergence chatter on flat or short series; the fit is still usable.
            warnings.simplefilter("ignore")
            # A level-only run is a few multiply-adds a point: done here, it skips the result
            # object statsmodels builds (pandas tables, ~1 ms) on every refit and forecast.
            if reuse and old_spec == spec and old_params is not None and not due:
                res = LevelRun(z, model.initial_values()[0], old_params["smoothing_level"]) if spec == _LEVEL_ONLY \
                    else model.fit(optimized=False, **old_params)
                self.optimized_at_s_, self.optimized_points_ = optimized_at, optimized_points
            else:
                res = model.fit()
                if spec == _LEVEL_ONLY:
                    res = LevelRun(z, res.params["initial_level"], res.params["smoothing_level"])
                self.optimized_at_s_, self.optimized_points_ = t[-1], n_ok
        self.spec_ = spec
        keys = ["smoothing_level"]
        if spec[0]:
            keys.append("smoothing_trend")
        if spec[1]:
            keys.append("damping_trend")
        if spec[2]:
            keys.append("smoothing_seasonal")
        self.params_ = {k: float(res.params[k]) for k in keys}
        fitted = np.asarray(res.fittedvalues, dtype=float)
        if self.log1p:
            fitted = np.expm1(fitted)
        ins = np.full(v.size, np.nan)
        ins[first + 1:] = fitted[1:]
        self.insample_ = ins
        self.result_ = res
        return self

    def out_of_sample(self, indices) -> np.ndarray:
        """Genuine one-step forecasts for points of the fitted series (see PredictorBase).

        One pass: the smoothing parameters are fitted on the points before
        the first index only, then the model is run with them fixed over the
        whole series; its fitted values from there on are one-step forecasts
        from earlier points. (A warm-started run would also re-fit them every
        `refit_every` points inside the window; the difference is noise.)
        NaN where the run has no fitted value (before its window).
        """
        self._check_fitted()
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return np.empty(0)
        t, v = self.t_s_, self.y_
        start = int(idx.min())
        with single_threaded():
            early = self.clone(warm_start=False).fit(t[:start], v[:start])
            if early.spec_ is None or early.spec_ != self.spec_:
                return super().out_of_sample(indices)
            run = self.clone(warm_start=False)._fit(t, v, fixed=early.params_)
        out = np.maximum(run.insample_[idx], 0.0)
        # The run interpolates over gaps, so a forecast right after one would
        # have seen the point it forecasts: those few are made the slow way.
        after_gap = ~np.isfinite(v[idx - 1])
        if after_gap.any():
            out[after_gap] = super().out_of_sample(idx[after_gap])
        return out

    def _predict(self, h: int) -> np.ndarray:
        f = np.asarray(self.result_.forecast(h), dtype=float)
        return np.expm1(f) if self.log1p else f


class LevelRun:
    """Simple exponential smoothing run with a fixed smoothing level: statsmodels' arithmetic, without its tables.

    z: the series (no gaps). level0: the initial level (statsmodels' model's
    `initial_values()[0]`, or the fitted `initial_level`). alpha: the smoothing
    level in [0, 1]. The levels are l[0] = level0,
    l[i] = alpha * z[i-1] + (1 - alpha) * l[i-1], computed with the same
    operations in the same order as statsmodels' Holt-Winters recursion for a
    model without trend or season, so `fittedvalues` (l[0..n-1], one-step
    forecasts) and `forecast(h)` (l[n], h times) are the floats its results give.
    """

    def __init__(self, z: np.ndarray, level0: float, alpha: float):
        y_alpha = (alpha * np.asarray(z, dtype=float)).tolist()
        alphac = 1 - alpha
        levels = [float(level0)]
        for ya in y_alpha:
            levels.append(ya + alphac * levels[-1])
        self.params = {"smoothing_level": alpha}
        self.fittedvalues = np.array(levels[:-1])
        self.level = levels[-1]

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.level)
