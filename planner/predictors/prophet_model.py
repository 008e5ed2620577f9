"""Prophet with real timestamps, seasonality gated on history length, cached refits.

Dynamo refits Prophet on the last 50 points with timestamps one second apart,
so its daily seasonality is meaningless and each call pays a full fit (MASE
up to 150 vs last value on ServeGen). Here:
- `ds` is the interval end time (seconds -> datetime), so seasonality is in
  real time whatever the bin width;
- daily seasonality switches on once the history spans `daily_min_days`,
  weekly once it spans `weekly_min_days` (Prophet's own rule of thumb: two
  periods);
- with warm_start the model is refitted only after `refit_every` new points,
  starting from the previous fit's parameters; in between the cached model is
  evaluated at the new timestamps;
- Prophet alone does not use the latest observation, which one-step-ahead
  forecasting needs; an AR(1) on its residuals (`residual_ar`) adds
  phi^k * last residual to the k-th forecast.
Uncertainty sampling is off (it is slow and random); quantiles come from
recent residuals like every other predictor.
"""

from __future__ import annotations

import numpy as np

from planner.predictors.base import PredictorBase, check_horizon, single_threaded, clean_forecast


def _stan_init(model) -> dict:
    """Prophet parameters of a fitted model in the form `fit(init=...)` takes."""
    p = model.params
    return {
        "k": float(p["k"][0][0]),
        "m": float(p["m"][0][0]),
        "sigma_obs": float(p["sigma_obs"][0][0]),
        "delta": np.asarray(p["delta"][0]),
        "beta": np.asarray(p["beta"][0]),
    }


class ProphetPredictor(PredictorBase):
    """Prophet trend + daily/weekly seasonality, with an AR(1) residual correction.

    daily_min_days / weekly_min_days: history span, days, needed to turn each
        seasonality on.
    changepoint_prior_scale: Prophet's trend flexibility.
    refit_every: with warm_start, new points after which Prophet is refitted.
    residual_ar: add the AR(1) residual correction.
    min_points: finite points needed; fewer -> last value.
    """

    name = "prophet"

    def __init__(
        self,
        *,
        daily_min_days: float = 2.0,
        weekly_min_days: float = 14.0,
        changepoint_prior_scale: float = 0.05,
        refit_every: int = 6,
        residual_ar: bool = True,
        min_points: int = 10,
        residual_window: int = 200,
        warm_start: bool = False,
    ):
        self.daily_min_days = daily_min_days
        self.weekly_min_days = weekly_min_days
        self.changepoint_prior_scale = changepoint_prior_scale
        self.refit_every = refit_every
        self.residual_ar = residual_ar
        self.min_points = min_points
        self.residual_window = residual_window
        self.warm_start = warm_start

    def _new_model(self, spec: tuple[bool, bool]):
        from prophet import Prophet

        return Prophet(
            daily_seasonality=spec[0],
            weekly_seasonality=spec[1],
            yearly_seasonality=False,
            changepoint_prior_scale=self.changepoint_prior_scale,
            uncertainty_samples=0,
        )

    def _yhat(self, t: np.ndarray) -> np.ndarray:
        import pandas as pd

        frame = pd.DataFrame({"ds": pd.to_datetime(np.asarray(t, dtype=float), unit="s")})
        return np.asarray(self.model_.predict(frame)["yhat"], dtype=float)

    def fit(self, t_s, y) -> "ProphetPredictor":
        """Validate and fit on (t_s seconds, y); returns self."""
        with single_threaded():
            return self._fit(t_s, y)

    def _fit(self, t_s, y) -> "ProphetPredictor":
        import pandas as pd

        if not (isinstance(self.min_points, int) and self.min_points >= 3):
            raise ValueError(f"ProphetPredictor: min_points must be an integer >= 3, got {self.min_points!r}")
        reuse = self._extends_previous(t_s, y)
        prev_model = getattr(self, "model_", None) if reuse else None
        prev_spec = getattr(self, "spec_", None)
        prev_at = getattr(self, "fitted_at_s_", None)
        prev_points = getattr(self, "fitted_points_", None)
        t, v = self._set_series(t_s, y, align=reuse)
        n_ok = int(np.isfinite(v).sum())
        if n_ok < self.min_points:
            self._fall_back(f"{n_ok} points < min_points {self.min_points}: last value")
            self.model_ = None
            return self
        ok = np.isfinite(v)
        span_days = (t[ok][-1] - t[ok][0] + self.interval_s_) / 86400.0
        spec = (span_days >= self.daily_min_days, span_days >= self.weekly_min_days)
        due = self._stale(prev_at, prev_points, self.refit_every)
        if prev_model is not None and prev_spec == spec and not due:
            self.model_ = prev_model
            self.fitted_at_s_, self.fitted_points_ = prev_at, prev_points
        else:
            model = self._new_model(spec)
            frame = pd.DataFrame({"ds": pd.to_datetime(t[ok], unit="s"), "y": v[ok]})
            init = _stan_init(prev_model) if prev_model is not None and prev_spec == spec else None
            try:
                model.fit(frame, init=init) if init is not None else model.fit(frame)
            except (RuntimeError, ValueError):
                if init is None:
                    raise
                # The previous optimum may not fit the new changepoint grid; start cold.
                model = self._new_model(spec).fit(frame)
            self.model_ = model
            self.fitted_at_s_, self.fitted_points_ = t[-1], n_ok
        self.spec_ = spec
        yhat = self._yhat(t)
        resid = v - yhat
        phi = 0.0
        if self.residual_ar:
            a, b = resid[1:], resid[:-1]
            m = np.isfinite(a) & np.isfinite(b)
            denom = float(np.dot(b[m], b[m]))
            if m.sum() >= 3 and denom > 0:
                phi = float(np.clip(np.dot(a[m], b[m]) / denom, -0.99, 0.99))
        self.phi_ = phi
        ins = yhat.copy()
        ins[1:] += phi * np.nan_to_num(resid[:-1])
        ins[0] = np.nan
        self.insample_ = ins
        last = np.flatnonzero(np.isfinite(resid))[-1]
        self.last_resid_ = float(resid[last])
        self.steps_since_resid_ = int(v.size - 1 - last)
        self.t_end_s_ = t[-1]
        return self

    def predict(self, horizon: int = 1) -> np.ndarray:
        self._check_fitted()
        h = check_horizon(horizon, type(self).__name__)
        if self.model_ is None:
            return clean_forecast(np.full(h, self.last_value_), fallback=self.last_value_)
        k = np.arange(1, h + 1)
        f = self._yhat(self.t_end_s_ + self.interval_s_ * k)
        f = f + self.phi_ ** (k + self.steps_since_resid_) * self.last_resid_
        return clean_forecast(f, fallback=self.last_value_)
