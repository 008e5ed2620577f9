"""Exponential smoothing (statsmodels Holt-Winters): level, optional damped trend, daily season.

By default this is simple exponential smoothing (an EWMA whose weight is
fitted), which beats last value on noisy series. With `season_s` set (e.g.
86400) an additive season is added once the history spans `min_seasons`
seasons, so the forecast follows the daily cycle; `log1p` makes it
multiplicative. The level-only model is fitted and run in statsmodels' own
arithmetic without importing it (planner.predictors.ses: the same floats, and
no 0.25 s statsmodels/pandas import on a process's first fit); a trend or a
season is fitted by statsmodels.
"""

from __future__ import annotations

import warnings

import numpy as np

from planner.predictors.base import Param, PredictorBase, fill_gaps, single_threaded
from planner.predictors.ses import LevelRun, fit_level_only, initial_level


# (trend, damped, seasonal period) of a model with a level only: simple exponential smoothing.
_LEVEL_ONLY = (None, False, None)


class ExponentialSmoothingPredictor(PredictorBase):
    """Holt-Winters exponential smoothing with parameters fitted by least squares.

    trend: None (level only) or "add" (additive, damped when damped_trend).
    season_s: season length, seconds (86400: daily); the season is used once
        the history spans min_seasons seasons and at least the points
        statsmodels needs to initialise it (two seasons, 10 + a whole season
        for short ones). Default 0: no season (the
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
        Param("trend", None, choices=(None, "add")), Param("damped_trend", True, "bool"),
        Param("season_s", 0.0, "number", ge=0), Param("min_seasons", 2.0, "number", gt=0),
        Param("log1p", False, "bool"),
        Param("fit_window", 288, "int", ge=2), Param("min_points", 5, "int", ge=3),
        Param("refit_every", 24, "int", ge=1),
    )

    def _fit(self, t_s, y, fixed: dict | None = None) -> "ExponentialSmoothingPredictor":
        """fixed: smoothing parameters to use as they are (no optimisation)."""
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
        seasonal = period >= 2 and z.size >= max(self.min_seasons * period, _heuristic_min_points(period))
        trend = self.trend if z.size >= 10 else None
        spec = (trend, bool(self.damped_trend) and trend is not None, period if seasonal else None)
        old_params, old_spec, optimized_at, optimized_points = prev
        due = self._stale(optimized_at, optimized_points, self.refit_every)
        if fixed is not None:
            old_params, old_spec, reuse, due = fixed, spec, True, False
        keep = reuse and old_spec == spec and old_params is not None and not due
        with warnings.catch_warnings():
            # Convergence chatter on flat or short series; the fit is still usable.
            warnings.simplefilter("ignore")
            res = _level_only(z, old_params if keep else None) if spec == _LEVEL_ONLY \
                else _holt_winters(z, spec, old_params if keep else None)
        if keep:
            self.optimized_at_s_, self.optimized_points_ = optimized_at, optimized_points
        else:
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


def _heuristic_min_points(period: int) -> int:
    """Fewest points statsmodels' heuristic initialisation of a season of `period` bins accepts: two seasons,
    and 10 once the moving average has lost half a season at either end."""
    return max(2 * period, 10 + 2 * (period // 2))


def _level_only(z: np.ndarray, params: dict | None) -> LevelRun:
    """A level-only model on z: fitted (params None) or run at params' smoothing level.

    The same floats as statsmodels' fit and its fixed-parameter run, without
    importing statsmodels or pandas (planner.predictors.ses).
    """
    if params is None:
        alpha, level0 = fit_level_only(z)
    else:
        alpha, level0 = params["smoothing_level"], initial_level(z)
    return LevelRun(z, level0, alpha)


def _holt_winters(z: np.ndarray, spec: tuple, params: dict | None):
    """statsmodels' Holt-Winters results on z for spec (trend, damped, season period): fitted, or at params."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    trend, damped, period = spec
    model = ExponentialSmoothing(
        z,
        trend=trend,
        damped_trend=damped,
        seasonal="add" if period else None,
        seasonal_periods=period,
        initialization_method="estimated" if not period else "heuristic",
    )
    return model.fit() if params is None else model.fit(optimized=False, **params)
