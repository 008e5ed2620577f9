"""Kalman filter on a local linear trend (level + slope), noise tuned on the history.

Dynamo's Kalman predictor uses fixed process/measurement noise, which makes it
either sluggish or jittery depending on the series (MASE 1.1-1.6 vs last value
on the shared traces). Here the two noise ratios are chosen from a small grid
by one-step-ahead MAE on recent history, so a noisy series gets a smooth level
(like an EWMA) and a drifting one a responsive level and slope.
"""

from __future__ import annotations

import itertools

import numpy as np
from filterpy.kalman import KalmanFilter

from planner.predictors.base import PredictorBase, check_horizon, clean_forecast

# Process noise / measurement noise ratios tried for level and slope.
LEVEL_RATIOS = (0.01, 0.1, 0.3, 1.0, 10.0)
SLOPE_RATIOS = (0.0, 1e-2)


def _filter(v: np.ndarray, r: float, q_level: float, q_slope: float, x0=None, P0=None):
    """Run the filter over v (NaN: predict only).

    Starts from state x0 / covariance P0, or from the first finite value with
    a wide covariance. Returns (one-step prior predictions, final posterior
    state, its covariance); a cold start's first prior is NaN (just the guess).
    """
    kf = KalmanFilter(dim_x=2, dim_z=1)
    kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
    kf.H = np.array([[1.0, 0.0]])
    kf.R = np.array([[r]])
    kf.Q = np.diag([q_level * r, q_slope * r])
    if x0 is None:
        first = v[np.flatnonzero(np.isfinite(v))[0]]
        kf.x = np.array([[first], [0.0]])
        kf.P = np.diag([r * 10.0, r])
    else:
        kf.x = np.asarray(x0, dtype=float).reshape(2, 1).copy()
        kf.P = np.asarray(P0, dtype=float).copy()
    zs = [None if not np.isfinite(z) else z for z in v]
    _, _, means_p, _ = kf.batch_filter(zs, update_first=False)
    prior = means_p[:, 0, 0].copy()
    if x0 is None:
        prior[0] = np.nan
    # batch_filter leaves the filter at the last posterior
    return prior, kf.x.ravel().copy(), kf.P.copy()


class KalmanPredictor(PredictorBase):
    """Local linear trend Kalman filter with tuned noise.

    min_points: finite points needed before it forecasts; fewer -> last value.
    tune_window: most recent points the noise grid is scored on (and the
        filter runs over: older points barely move a tuned filter).
    retune_every: with warm_start, re-tune the noise after this many new
        points; in between the filter continues from its last state over the
        new points only.
    """

    name = "kalman"

    def __init__(
        self,
        *,
        min_points: int = 5,
        tune_window: int = 120,
        retune_every: int = 24,
        residual_window: int = 200,
        warm_start: bool = False,
    ):
        self.min_points = min_points
        self.tune_window = tune_window
        self.retune_every = retune_every
        self.residual_window = residual_window
        self.warm_start = warm_start

    def fit(self, t_s, y) -> "KalmanPredictor":
        if not (isinstance(self.min_points, int) and self.min_points >= 2):
            raise ValueError(f"KalmanPredictor: min_points must be an integer >= 2, got {self.min_points!r}")
        reuse = self._extends_previous(np.asarray(t_s, dtype=float))
        prev_tuned = getattr(self, "ratios_", None) if reuse else None
        tuned_at = getattr(self, "tuned_at_s_", None) if reuse else None
        tuned_points = getattr(self, "tuned_points_", None) if reuse else None
        prev = None
        if reuse and prev_tuned is not None and hasattr(self, "cov_"):
            prev = (self.t_s_, self.insample_, self.state_, self.cov_, self.r_)
        t, v = self._set_series(t_s, y)
        n_ok = int(np.isfinite(v).sum())
        if n_ok < self.min_points:
            self._fall_back(f"{n_ok} points < min_points {self.min_points}: last value")
            self.state_ = np.array([self.last_value_, 0.0])
            self.ratios_ = None
            return self
        if prev is not None and not self._stale(tuned_at, tuned_points, self.retune_every):
            # Same noise: continue the filter from its last state over the new
            # points only (what a cold run over the window converges to).
            old_t, old_ins, x0, P0, r = prev
            k_new = int(np.sum(t > old_t[-1]))
            prior, self.state_, self.cov_ = _filter(v[v.size - k_new :], r, *prev_tuned, x0=x0, P0=P0)
            ins = np.full(v.size, np.nan)
            offset = int(round((t[0] - old_t[0]) / self.interval_s_))
            for i in range(v.size - k_new):
                if 0 <= i + offset < old_ins.size:
                    ins[i] = old_ins[i + offset]
            ins[v.size - k_new :] = prior
            self.insample_ = ins
            self.ratios_, self.r_ = prev_tuned, r
            return self
        w = v[-int(self.tune_window):]
        d = np.diff(w[np.isfinite(w)])
        r = float(np.var(d) / 2.0) if d.size else 0.0
        r = max(r, 1e-6 * max(1.0, float(np.nanmean(w)) ** 2), 1e-9)
        self.r_ = r
        self.ratios_ = self._tune(w, r)
        self.tuned_at_s_, self.tuned_points_ = t[-1], n_ok
        prior, self.state_, self.cov_ = _filter(w, r, *self.ratios_)
        ins = np.full(v.size, np.nan)
        ins[-w.size:] = prior
        self.insample_ = ins
        return self

    def _tune(self, w: np.ndarray, r: float) -> tuple[float, float]:
        best, best_err = (LEVEL_RATIOS[2], 0.0), np.inf
        burn = min(5, max(1, w.size // 3))
        for ql, qs in itertools.product(LEVEL_RATIOS, SLOPE_RATIOS):
            prior, _, _ = _filter(w, r, ql, qs)
            err = np.abs(w[burn:] - prior[burn:])
            err = err[np.isfinite(err)]
            if err.size and err.mean() < best_err:
                best, best_err = (ql, qs), float(err.mean())
        return best

    def predict(self, horizon: int = 1) -> np.ndarray:
        self._check_fitted()
        h = check_horizon(horizon, type(self).__name__)
        level, slope = self.state_
        return clean_forecast(level + slope * np.arange(1, h + 1), fallback=self.last_value_)
