"""Rolling-origin backtest of a load predictor on one series.

At every origin i the predictor is fitted on the points before i (all of
them, or the most recent `window`) and asked for the value `horizon` steps
ahead; the forecasts are scored against what happened. Last value
(constant) is scored on exactly the same targets, so MASE < 1 means
"better than last value" on this series. Missing targets (NaN) are not
scored; origins with no finite history are skipped.

One predictor instance is refitted at every origin, so a predictor built with
`warm_start=True` reuses its expensive state between origins exactly as the
planner does with its cache (e.g. ARIMA re-selects its order periodically,
not every step). Timing includes fit, mean and quantile forecast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from planner.predictors.base import check_series


@dataclass(frozen=True)
class ForecastScores:
    """Accuracy of a set of forecasts.

    mae: mean absolute error, in the series' unit.
    smape: symmetric MAPE as a fraction in [0, 2]: mean 2|f - y| / (|f| + |y|),
        a term with f = y = 0 counts 0.
    mase: mae / the last-value forecasts' mae on the same targets (NaN if that is 0).
    bias: mean (f - y); positive over-forecasts.
    under_rate: fraction of targets with f < y.
    p90_coverage: fraction of targets with y <= the upper-quantile forecast
        (None when no quantile forecasts were given).
    n: targets scored.
    """

    mae: float
    smape: float
    mase: float
    bias: float
    under_rate: float
    p90_coverage: float | None
    n: int


def score_forecasts(y_true, y_pred, y_baseline, y_upper=None) -> ForecastScores:
    """Score aligned forecasts; NaN targets are dropped from every metric.

    y_true: what happened. y_pred: the forecasts. y_baseline: last-value
    forecasts for the same targets (the MASE denominator). y_upper: optional
    upper-quantile forecasts (coverage).
    """
    y = np.asarray(y_true, dtype=float)
    f = np.asarray(y_pred, dtype=float)
    b = np.asarray(y_baseline, dtype=float)
    arrays = [("y_pred", f), ("y_baseline", b)]
    u = None
    if y_upper is not None:
        u = np.asarray(y_upper, dtype=float)
        arrays.append(("y_upper", u))
    for name, a in arrays:
        if a.shape != y.shape:
            raise ValueError(f"score_forecasts: {name} has {a.size} values, y_true has {y.size}")
    keep = np.isfinite(y)
    for name, a in arrays:
        if np.any(~np.isfinite(a[keep])):
            raise ValueError(f"score_forecasts: {name} has NaN/inf where y_true is known")
    y, f, b = y[keep], f[keep], b[keep]
    n = int(y.size)
    if n == 0:
        raise ValueError("score_forecasts: no finite targets to score")
    err = f - y
    mae = float(np.mean(np.abs(err)))
    denom = np.abs(f) + np.abs(y)
    smape = float(np.mean(np.where(denom > 0, 2.0 * np.abs(err) / np.where(denom > 0, denom, 1.0), 0.0)))
    base_mae = float(np.mean(np.abs(b - y)))
    mase = mae / base_mae if base_mae > 0 else (0.0 if mae == 0 else math.nan)
    cov = None if u is None else float(np.mean(y <= u[keep]))
    return ForecastScores(
        mae=mae,
        smape=smape,
        mase=float(mase),
        bias=float(np.mean(err)),
        under_rate=float(np.mean(f < y)),
        p90_coverage=cov,
        n=n,
    )


@dataclass(frozen=True)
class BacktestResult:
    """One predictor on one series: scores plus cost and the forecasts themselves."""

    predictor: str
    horizon: int
    scores: ForecastScores
    ms_per_step: float
    origins: int
    target_index: np.ndarray
    forecast: np.ndarray
    upper: np.ndarray | None
    baseline: np.ndarray

    def as_dict(self) -> dict:
        """JSON-ready summary: mae, smape, mase, bias, under_rate, p90_coverage, ms_per_step, n, horizon."""
        d = asdict(self.scores)
        d["ms_per_step"] = self.ms_per_step
        d["horizon"] = self.horizon
        d["origins"] = self.origins
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def rolling_origin(
    t_s,
    y,
    make_predictor: Callable[[], object],
    *,
    name: str = "predictor",
    horizon: int = 1,
    start: int = 5,
    window: int | None = None,
    quantile: float | None = 0.9,
    every: int = 1,
) -> BacktestResult:
    """Rolling-origin evaluation of `horizon`-step-ahead forecasts.

    t_s: interval end times, seconds (regular grid; gaps become NaN points).
    y: the series; NaN marks missing values (not scored, passed to the predictor).
    make_predictor: returns a fresh unfitted predictor (called once).
    start: first origin (points of history before the first forecast).
    window: most recent points the predictor sees (None: all so far), like the
        planner's history_intervals.
    quantile: the upper quantile scored as coverage (None: skip).
    every: forecast from every k-th origin only (a cheaper, sparser backtest).
    """
    t, v = check_series(t_s, y, who=f"backtest {name}")
    if not (isinstance(horizon, int) and horizon >= 1):
        raise ValueError(f"backtest {name}: horizon must be an integer >= 1, got {horizon!r}")
    if not (isinstance(start, int) and start >= 1):
        raise ValueError(f"backtest {name}: start must be an integer >= 1, got {start!r}")
    if window is not None and not (isinstance(window, int) and window >= 1):
        raise ValueError(f"backtest {name}: window must be None or an integer >= 1, got {window!r}")
    if not (isinstance(every, int) and every >= 1):
        raise ValueError(f"backtest {name}: every must be an integer >= 1, got {every!r}")
    n = v.size
    if n < start + horizon:
        raise ValueError(
            f"backtest {name}: series has {n} points, need at least start + horizon = {start + horizon}"
        )
    model = make_predictor()
    idx, fc, up, base = [], [], [], []
    elapsed = 0.0
    origins = 0
    finite_before = np.concatenate([[0], np.cumsum(np.isfinite(v))])
    for i in range(start, n - horizon + 1, every):
        target = i + horizon - 1
        lo = 0 if window is None else max(0, i - window)
        if finite_before[i] - finite_before[lo] == 0 or not math.isfinite(v[target]):
            continue
        t0 = time.perf_counter()
        model.fit(t[lo:i], v[lo:i])
        f = float(model.predict(horizon)[-1])
        q = float(model.predict_quantile(quantile, horizon)[-1]) if quantile is not None else math.nan
        elapsed += time.perf_counter() - t0
        origins += 1
        seen = v[lo:i][np.isfinite(v[lo:i])]
        idx.append(target)
        fc.append(f)
        up.append(q)
        base.append(float(seen[-1]))  # last value, the MASE yardstick
    if not idx:
        raise ValueError(f"backtest {name}: no origin had both history and a finite target")
    target_index = np.asarray(idx)
    forecast = np.asarray(fc)
    upper = np.asarray(up) if quantile is not None else None
    baseline = np.asarray(base)
    scores = score_forecasts(v[target_index], forecast, baseline, upper)
    return BacktestResult(
        predictor=name,
        horizon=horizon,
        scores=scores,
        ms_per_step=1000.0 * elapsed / origins,
        origins=origins,
        target_index=target_index,
        forecast=forecast,
        upper=upper,
        baseline=baseline,
    )
