"""Gradient-boosted regression on recent changes and the time of day (scikit-learn).

The load series here are close to random walks with heavy-tailed jumps:
single-interval spikes that revert, level shifts that do not, and on
multi-day series a daily cycle. A linear model cannot tell a spike from a
level shift; a small tree ensemble on the last few changes can, and it can
use the daily cycle (time of day, same time yesterday) when there is one.

It predicts the next change of log1p(load), trained with absolute-error loss
(the median change, matching the MAE we score), on the history it is given.
The model is refitted after `refit_every` new points with warm_start, else
on every fit. Its `insample_` are honest out-of-sample forecasts: for the
last `holdout` points they come from a second model trained only on the
points before them, so the automatic choice never rewards overfitting.
"""

from __future__ import annotations

import numpy as np

from planner.predictors.base import Param, PredictorBase, clean_forecast, single_threaded

DAY_S = 86400.0


def _keys(t_s: np.ndarray) -> list[float]:
    """Dictionary keys for interval end times (robust to float noise)."""
    return np.round(np.asarray(t_s, dtype=float), 3).tolist()


def _ffill(z: np.ndarray) -> np.ndarray:
    out = z.copy()
    idx = np.where(np.isfinite(out), np.arange(out.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = out[idx]
    return out


def _shifted(z: np.ndarray, k: int) -> np.ndarray:
    """z moved k places later, NaN in front (pandas' shift(k))."""
    out = np.full(z.size, np.nan)
    if k < z.size:
        out[k:] = z[: z.size - k]
    return out


def _median_of_previous(z: np.ndarray, w: int) -> np.ndarray:
    """For each i, the median of z[i-w:i] over its non-NaN values, NaN with fewer than 2 (pandas'
    shift(1).rolling(w, min_periods=2).median(), the same floats: the middle value, or the two middle ones'
    sum halved)."""
    from numpy.lib.stride_tricks import sliding_window_view

    if z.size == 0:
        return np.full(0, np.nan)
    win = sliding_window_view(np.concatenate([np.full(w, np.nan), z[:-1]]), w)
    count = (~np.isnan(win)).sum(axis=1)
    srt = np.sort(win, axis=1)  # NaN sorts last: each window's values first, in order
    rows, k = np.arange(z.size), np.maximum(count, 1)
    out = (srt[rows, (k - 1) // 2] + srt[rows, k // 2]) / 2.0
    out[count < 2] = np.nan
    return out


def lag_features(z: np.ndarray, t_s: np.ndarray, *, period: int) -> np.ndarray:
    """Features for predicting z[i] from z[:i], one row per i (NaN where undefined).

    z: log1p load, forward-filled. t_s: times, seconds. period: bins per day.
    Columns: z[i-1] - z[i-k] for k = 2..4; z[i-1] minus the median of the last
    6 and 24 points; same time yesterday minus z[i-1]; yesterday's change at
    this time; sin/cos of the time of day.
    """
    z = np.asarray(z, dtype=float)
    n = z.size
    last = _shifted(z, 1)
    cols = [last - _shifted(z, k) for k in (2, 3, 4)]
    cols += [last - _median_of_previous(z, w) for w in (6, 24)]
    if period >= 2:
        cols.append(_shifted(z, period) - last)
        cols.append(_shifted(z, period) - _shifted(z, period + 1))
    else:
        cols += [np.full(n, np.nan)] * 2
    tod = 2.0 * np.pi * (np.asarray(t_s, dtype=float) % DAY_S) / DAY_S
    X = np.column_stack(cols + [np.sin(tod), np.cos(tod)])
    return X


class GradientBoostingPredictor(PredictorBase):
    """Histogram gradient boosting on lagged changes of log1p(load).

    min_points: finite points needed (it learns from examples); fewer -> last value.
    refit_every: with warm_start, new points after which the model is refitted.
    holdout: most recent points scored out of sample (see module docstring).
    max_iter, learning_rate, max_depth, min_samples_leaf: scikit-learn's
        HistGradientBoostingRegressor settings. seed: its random_state.
    """

    name = "gbm"
    PARAMS = (
        Param("min_points", 200, "int", ge=20), Param("refit_every", 144, "int", ge=1),
        Param("holdout", 144, "int", ge=0),
        # scikit-learn's HistGradientBoostingRegressor
        Param("max_iter", 100, "int", ge=1), Param("learning_rate", 0.05, "number", gt=0),
        Param("max_depth", 3, "int", ge=1), Param("min_samples_leaf", 50, "int", ge=1), Param("seed", 0, "int", ge=0),
    )

    def _new_model(self):
        from sklearn.ensemble import HistGradientBoostingRegressor

        return HistGradientBoostingRegressor(
            loss="absolute_error",
            max_iter=self.max_iter,
            learning_rate=self.learning_rate,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            l2_regularization=1.0,
            early_stopping=False,
            random_state=self.seed,
        )

    def _fit(self, t_s, y) -> "GradientBoostingPredictor":
        start = self._start_fit(t_s, y, warm=("model_", "fitted_at_s_", "holdout_pred_", "fitted_points_"), model="model_")
        if start is None:
            return self
        # The pools `fit` limited may predate loading scikit-learn (its first model in this process).
        with single_threaded(with_sklearn=True):
            return self._fit_model(*start)

    def _fit_model(self, reuse, prev, t, v, n_ok, first) -> "GradientBoostingPredictor":
        """The fit past the minimum-history check: `_start_fit`'s answer in, fitted attributes set."""
        t, v = t[first:], v[first:]
        pad = first
        self.period_ = int(round(DAY_S / self.interval_s_))
        z = np.log1p(v)
        zf = _ffill(z)
        target = z - np.concatenate([[np.nan], zf[:-1]])
        usable = np.isfinite(target)
        usable[:2] = False
        model, fitted_at, holdout_pred, fitted_points = prev
        cols = getattr(self, "cols_", None)
        if not reuse or model is None or self._stale(fitted_at, fitted_points, self.refit_every):
            X = lag_features(zf, t, period=self.period_)
            hold = min(int(self.holdout), max(0, int(usable.sum()) - self.min_points // 2))
            cut = v.size - hold
            # Features with no value yet (e.g. "same time yesterday" on a
            # shorter history) are left out until they exist.
            cols = np.any(np.isfinite(X[:cut][usable[:cut]]), axis=0)
            holdout_pred = {}
            if hold > 0:
                early = self._new_model().fit(X[:cut][usable[:cut]][:, cols], target[:cut][usable[:cut]])
                pred = np.expm1(zf[cut - 1 : -1] + early.predict(X[cut:, cols]))
                holdout_pred = dict(zip(_keys(t[cut:]), pred.tolist(), strict=True))
            model = self._new_model().fit(X[usable][:, cols], target[usable])
            fitted_at, fitted_points = t[-1], n_ok
        self.cols_ = cols
        # Between refits, points after the fit are out of sample for the
        # current model too; their features need only a short lookback.
        ins = np.full(v.size, np.nan)
        r0 = int(np.searchsorted(t, fitted_at + 0.5 * self.interval_s_))
        lo = max(0, r0 - (self.period_ + 30))
        # One features pass for the points since the fit plus the next interval.
        Xr = lag_features(
            np.concatenate([zf[lo:], [np.nan]]),
            np.concatenate([t[lo:], [t[-1] + self.interval_s_]]),
            period=self.period_,
        )[r0 - lo :, cols]
        if r0 < v.size:
            ins[r0:] = np.expm1(zf[r0 - 1 : -1] + model.predict(Xr[:-1]))
        self._x_next = Xr[-1:]
        for i, ts in enumerate(_keys(t)):
            if ts in holdout_pred:
                ins[i] = holdout_pred[ts]
        self._forecasts = {}
        self.model_ = model
        self.fitted_at_s_ = fitted_at
        self.fitted_points_ = fitted_points
        self.holdout_pred_ = holdout_pred
        self.insample_ = np.concatenate([np.full(pad, np.nan), ins])
        self._z = zf
        self._t = t
        return self

    def out_of_sample(self, indices) -> np.ndarray:
        """Genuine one-step forecasts for points of the fitted series (see PredictorBase).

        Free where the fit already made them: the held-out points (a model
        trained on earlier points only) and the points after the last refit.
        Any other index is made by refitting on its prefix.
        """
        self._check_fitted()
        idx = np.asarray(indices, dtype=np.int64)
        out = np.full(idx.size, np.nan)
        if self.model_ is None:
            return super().out_of_sample(indices)
        after_fit = self.t_s_[idx] > self.fitted_at_s_ + 0.5 * self.interval_s_
        honest = np.array([k in self.holdout_pred_ for k in _keys(self.t_s_[idx])], dtype=bool) | after_fit
        out[honest] = np.maximum(self.insample_[idx[honest]], 0.0)
        if not honest.all():
            out[~honest] = super().out_of_sample(idx[~honest])
        return out

    def _predict(self, h: int) -> np.ndarray:
        if h not in self._forecasts:  # fitted state is fixed until the next fit
            with single_threaded():
                self._forecasts[h] = self._roll(h)
        return self._forecasts[h].copy()

    def _roll(self, h: int) -> np.ndarray:
        """The next h forecasts, each feeding the next one's lag features."""
        z, t = self._z, self._t
        out = []
        for k in range(h):
            t_next = t[-1] + self.interval_s_
            if k == 0:
                x = self._x_next
            else:
                tail = min(z.size, self.period_ + 30)
                zz = np.concatenate([z[-tail:], [np.nan]])
                tt = np.concatenate([t[-tail:], [t_next]])
                x = lag_features(zz, tt, period=self.period_)[-1:, self.cols_]
            nxt = z[-1] + float(self.model_.predict(x)[0])
            out.append(np.expm1(nxt))
            z = np.concatenate([z, [nxt]])
            t = np.concatenate([t, [t_next]])
        return clean_forecast(np.asarray(out), fallback=self.last_value_)
