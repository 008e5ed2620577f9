"""Next-interval load forecast: `forecast_next` over the collected history.

`forecast_next` turns the per-interval history the collect step rebuilds into
next-interval request count (mean and upper quantile), mean ISL and mean OSL.
It is stateless: every call fits on the history it is given. The optional
`cache` keeps fitted predictors between calls purely to save time (an ARIMA
order, Prophet parameters, tuned Kalman noise); losing it changes speed, not
decisions beyond estimation noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

from planner.signals.burst import peak_rates
from planner.config import PredictorConfig
from planner.predictors import ConstantPredictor
from planner.predictors.registry import PREDICTORS, make_predictor
from planner.types import Forecast, LoadHistory


def _params_for(cfg: PredictorConfig, name: str) -> dict[str, Any]:
    params = dict(cfg.params.get(name, {}))
    if name == "arima":
        params.setdefault("log1p", cfg.log1p)
    return params


def _fit_one(
    quantity: str,
    t_s: np.ndarray,
    y: np.ndarray,
    name: str,
    cfg: PredictorConfig,
    cache: MutableMapping | None,
    notes: list[str],
):
    """Fit the configured predictor to one series, or constant while history is short."""
    n_ok = int(np.isfinite(y).sum())
    if n_ok < cfg.min_history_points and name != "constant":
        notes.append(
            f"{quantity}: {n_ok} points < min_history_points {cfg.min_history_points}: "
            f"constant (last value) instead of {name}"
        )
        return ConstantPredictor().fit(t_s, y), "constant"
    params = _params_for(cfg, name)
    if cache is None:
        predictor = make_predictor(name, **params).fit(t_s, y)
    else:
        key = cache_key(quantity, name, params)
        predictor = _cached_fit(cache, key, quantity, name, params, t_s, y, notes)
    if predictor.fallback_reason_:
        notes.append(f"{quantity}: {name}: {predictor.fallback_reason_}")
    picked = getattr(predictor, "chosen_", None)
    if picked:
        notes.append(f"{quantity}: auto chose {picked}")
    return predictor, name


def cache_key(quantity: str, name: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    """The cache key of one series' fitted predictor: plain strings, so any store can hold it."""
    return ("forecast_next", quantity, name, repr(sorted(params.items())))


def _cached_fit(cache: MutableMapping, key, quantity: str, name: str, params: dict, t_s, y, notes: list[str]):
    """Refit the cached predictor (a fresh one on a miss) and store it back.

    The cache is only an optimisation: an entry that is not a fitted
    predictor of this kind, or whose refit fails, is dropped and the series
    fitted from scratch; a failure of the fresh fit is the caller's error.
    The entry is written back after the fit (a store that copies, such as a
    directory of files, then holds the fitted state).
    """
    try:
        cached = cache.get(key)
    except Exception as exc:  # noqa: BLE001 (a broken store is a miss, never a failed forecast)
        notes.append(f"{quantity}: predictor cache unreadable ({type(exc).__name__}): fitted from scratch")
        cached = None
    predictor = None
    if cached is not None:
        if type(cached) is not PREDICTORS[name] or not getattr(cached, "warm_start", False):
            notes.append(f"{quantity}: cached {name} entry is a {type(cached).__name__}: fitted from scratch")
        else:
            try:
                predictor = cached.fit(t_s, y)
            except Exception as exc:  # noqa: BLE001 (the fresh fit below raises real input errors)
                notes.append(f"{quantity}: cached {name} state unusable ({type(exc).__name__}: {exc}): fitted from scratch")
    if predictor is None:
        predictor = make_predictor(name, warm_start=True, **params).fit(t_s, y)
    try:
        cache[key] = predictor
    except Exception as exc:  # noqa: BLE001 (failing to save only costs the next run time)
        notes.append(f"{quantity}: predictor cache not written ({type(exc).__name__}: {exc})")
    return predictor


def forecast_next(
    history: LoadHistory, cfg: PredictorConfig, *, cache: MutableMapping | None = None
) -> Forecast:
    """Next-interval load: request count (mean and upper quantile), mean ISL and OSL.

    history: per-interval series, oldest first (NaN lengths where an interval
        had no requests; NaN counts where data is missing).
    cfg: which predictor, its parameters, the quantile and the minimum history.
    cache: optional store of fitted predictors between calls (speed only).
    Returns values that are never negative or NaN; `predictor` names what
    forecast the request count ("constant" while history is short) and
    `notes` says why any fallback happened. Raises ValueError on an empty
    history or one with no request-count data.
    """
    if len(history) == 0:
        raise ValueError("forecast_next: history is empty (need at least one interval)")
    t = np.asarray(history.t_s, dtype=np.float64)
    notes: list[str] = []
    req = np.asarray(history.num_requests, dtype=np.float64)
    if not np.any(np.isfinite(req)):
        raise ValueError(f"forecast_next: num_requests has no finite value in {len(history)} intervals")
    predictor, used = _fit_one("num_requests", t, req, cfg.name, cfg, cache, notes)
    mean = float(predictor.predict(1)[0])
    upper = float(predictor.predict_quantile(cfg.upper_quantile, 1)[0])
    # Sizing on the upper value must never ask for less than the mean.
    upper = max(upper, mean)
    lengths = {}
    length_name = cfg.length_predictor or cfg.name
    for quantity in ("avg_isl_tokens", "avg_osl_tokens"):
        y = np.asarray(getattr(history, quantity), dtype=np.float64)
        if not np.any(np.isfinite(y)):
            notes.append(f"{quantity}: no interval had requests: 0")
            lengths[quantity] = 0.0
            continue
        p, _ = _fit_one(quantity, t, y, length_name, cfg, cache, notes)
        lengths[quantity] = float(p.predict(1)[0])
    tokens = tokens_p90 = None
    if cfg.forecast_prompt_tokens:
        tokens, tokens_p90 = _prompt_tokens(history, t, req, cfg, cache, notes)
    return Forecast(
        num_requests=mean,
        avg_isl_tokens=lengths["avg_isl_tokens"],
        avg_osl_tokens=lengths["avg_osl_tokens"],
        num_requests_p90=upper,
        predictor=used,
        notes=tuple(notes),
        prompt_tokens=tokens,
        prompt_tokens_p90=tokens_p90,
    )


def prompt_token_series(num_requests: np.ndarray, avg_isl_tokens: np.ndarray) -> np.ndarray:
    """Prompt tokens per interval: requests x mean ISL; 0 where no request came (its mean ISL is NaN), NaN where
    the count itself is missing."""
    req = np.asarray(num_requests, dtype=np.float64)
    isl = np.asarray(avg_isl_tokens, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(req == 0, 0.0, req * isl)


def _prompt_tokens(history: LoadHistory, t: np.ndarray, req: np.ndarray, cfg: PredictorConfig,
                   cache: MutableMapping | None, notes: list[str]) -> tuple[float, float]:
    """(mean, upper) prompt tokens next interval, from the prompt-token series with the configured predictor."""
    y = prompt_token_series(req, np.asarray(history.avg_isl_tokens, dtype=np.float64))
    if not np.any(np.isfinite(y)):
        notes.append("prompt_tokens: no interval had both a count and a mean ISL: 0")
        return 0.0, 0.0
    p, _ = _fit_one("prompt_tokens", t, y, cfg.name, cfg, cache, notes)
    mean = max(0.0, float(p.predict(1)[0]))
    return mean, max(mean, float(p.predict_quantile(cfg.upper_quantile, 1)[0]))


def bin_requests(
    arrival_s,
    isl_tokens,
    osl_tokens,
    *,
    bin_s: float,
    start_s: float = 0.0,
    end_s: float | None = None,
    peak_window_s: float | None = None,
    peak_step_s: float = 5.0,
) -> LoadHistory:
    """Per-bin request counts and mean lengths from request-level arrays.

    arrival_s: arrival times, seconds; isl_tokens / osl_tokens: lengths, tokens.
    bin_s: bin width, seconds. Bins cover [start_s, end_s) (end_s defaults to
    just past the last arrival); t_s holds bin end times; empty bins have NaN
    mean lengths. peak_window_s: also each bin's peak rate over that window,
    every peak_step_s (burst.peak_rates, the collect step's signal); None: not read.
    """
    if not (isinstance(bin_s, (int, float)) and bin_s > 0 and math.isfinite(bin_s)):
        raise ValueError(f"bin_requests: bin_s must be a positive number of seconds, got {bin_s!r}")
    a = np.asarray(arrival_s, dtype=np.float64)
    isl = np.asarray(isl_tokens, dtype=np.float64)
    osl = np.asarray(osl_tokens, dtype=np.float64)
    if not (a.shape == isl.shape == osl.shape):
        raise ValueError(
            f"bin_requests: arrival_s ({a.size}), isl_tokens ({isl.size}) and osl_tokens ({osl.size}) differ in length"
        )
    if a.size == 0 and end_s is None:
        raise ValueError("bin_requests: no requests and no end_s: cannot tell how many bins")
    end = (float(a.max()) + 1e-9) if end_s is None else float(end_s)
    n_bins = max(1, int(math.ceil((end - start_s) / bin_s - 1e-9)))
    keep = (a >= start_s) & (a < start_s + n_bins * bin_s)
    idx = ((a[keep] - start_s) // bin_s).astype(np.int64)
    counts = np.bincount(idx, minlength=n_bins).astype(np.float64)
    isl_sum = np.bincount(idx, weights=isl[keep], minlength=n_bins)
    osl_sum = np.bincount(idx, weights=osl[keep], minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        isl_mean = np.where(counts > 0, isl_sum / counts, np.nan)
        osl_mean = np.where(counts > 0, osl_sum / counts, np.nan)
    t_end = start_s + bin_s * np.arange(1, n_bins + 1)
    peaks = None
    if peak_window_s is not None:
        peaks = tuple(peak_rates(np.sort(a), ends_s=t_end, interval_s=bin_s, window_s=peak_window_s,
                                 step_s=peak_step_s).tolist())
    return LoadHistory(
        t_s=tuple(t_end.tolist()),
        num_requests=tuple(counts.tolist()),
        avg_isl_tokens=tuple(isl_mean.tolist()),
        avg_osl_tokens=tuple(osl_mean.tolist()),
        interval_s=float(bin_s),
        peak_rps=peaks,
        peak_window_s=None if peaks is None else float(peak_window_s),
    )


def prime_history(warm: LoadHistory, live: LoadHistory, *, max_intervals: int | None = None) -> LoadHistory:
    """Prepend a warm-start history to the live one, re-timed to end where live begins.

    Both must have the same interval_s. With an empty live history the warm
    history is returned as is. Lets a predictor forecast (and pick seasonal
    structure) from the first planner run instead of falling back to constant.
    The live peak rates are kept; the warm intervals carry the warm history's
    when it read them over the live window (else NaN, unknown).
    max_intervals: keep only the newest this many intervals (live ones first).
    """
    if abs(warm.interval_s - live.interval_s) > 1e-9 * live.interval_s:
        raise ValueError(
            f"prime_history: warm-start interval {warm.interval_s} s differs from live interval {live.interval_s} s; "
            "re-bin the trace with the live interval"
        )
    if len(live) == 0:
        return warm
    n = len(warm)
    keep = n if max_intervals is None else max(0, min(n, max_intervals - len(live)))
    t_first = live.t_s[0]
    t_warm = tuple(t_first - live.interval_s * (keep - i) for i in range(keep))
    same_window = warm.peak_rps is not None and warm.peak_window_s == live.peak_window_s
    warm_peak = tuple(warm.peak_rps[n - keep:]) if same_window else (math.nan,) * keep
    peak = None if live.peak_rps is None else warm_peak + tuple(live.peak_rps)
    return LoadHistory(
        t_s=t_warm + tuple(live.t_s),
        num_requests=tuple(warm.num_requests[n - keep:]) + tuple(live.num_requests),
        avg_isl_tokens=tuple(warm.avg_isl_tokens[n - keep:]) + tuple(live.avg_isl_tokens),
        avg_osl_tokens=tuple(warm.avg_osl_tokens[n - keep:]) + tuple(live.avg_osl_tokens),
        interval_s=live.interval_s,
        peak_rps=peak,
        peak_window_s=live.peak_window_s,
    )
