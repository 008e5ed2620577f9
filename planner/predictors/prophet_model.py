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

from planner.predictors.base import Param, PredictorBase


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
    PARAMS = (
        Param("daily_min_days", 2.0, "number", gt=0), Param("weekly_min_days", 14.0, "number", gt=0),
        Param("changepoint_prior_scale", 0.05, "number", gt=0),
        Param("refit_every", 6, "int", ge=1), Param("residual_ar", True, "bool"), Param("min_points", 10, "int", ge=3),
    )

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

    def _fit(self, t_s, y) -> "ProphetPredictor":
        import pandas as pd

        start = self._start_fit(t_s, y, warm=("model_", "spec_", "fitted_at_s_", "fitted_points_"), model="model_")
        if start is None:
            return self
        reuse, (prev_model, prev_spec, prev_at, prev_points), t, v, n_ok, _ = start
        prev_model = prev_model if reuse else None
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

    def _predict(self, h: int) -> np.ndarray:
        k = np.arange(1, h + 1)
        f = self._yhat(self.t_end_s_ + self.interval_s_ * k)
        return f + self.phi_ ** (k + self.steps_since_resid_) * self.last_resid_
