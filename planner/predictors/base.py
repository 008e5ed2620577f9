"""The load-predictor base: the estimator contract every predictor follows.

scikit-learn's estimator contract: the constructor stores keyword-only
hyperparameters unchecked; `fit(t_s, y)` validates them against the class's
parameter table (`PARAMS`), learns (`_fit`, each predictor's own part) and
sets attributes ending in `_`; `predict(horizon)` and
`predict_quantile(q, horizon)` read only those. `warm_start=True` lets a
refit on a series that extends the previous one reuse expensive state (an
ARIMA order, Prophet parameters, tuned noise); the answer may differ from a
cold fit only by estimation noise.

Fitted attributes every predictor sets:
    t_s_, y_: the regularised training series (NaN where a value was missing).
    insample_: one-step-ahead prediction for each training point, NaN where
        the model had no prediction yet. Used for residual quantiles and by
        the automatic choice to compare candidates honestly.
    interval_s_: the bin width, seconds.
    fallback_reason_: None, or why the model answered with the last value
        (too little history).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.conformal import conformal_offset

# The bin width is the smallest step; a step that is a whole multiple of it
# (within this tolerance) is a gap filled with NaN.
_GAP_TOL_FRAC = 0.1
# Hard cap on points a gap may insert, so a bad timestamp can't allocate gigabytes.
_MAX_GAP_POINTS = 100_000
# Warm start: how far (fraction of a bin) a new series' grid may sit from the
# previous one's (scheduled runs start a few seconds apart), how much their
# overlap may differ (median relative difference), and how many of the newest
# old points may have been revised since (late samples) and are not compared.
_MAX_PHASE_FRAC = 0.25
_MAX_OVERLAP_DIFF_FRAC = 0.05
_REVISABLE_POINTS = 2


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its default and what `fit` (and a configuration naming it) accepts.

    kind: "int" (an integer), "number" (an int or float), "bool" or None
    (anything; the predictor checks it); ge / gt: lower bound; choices: the
    only values allowed.
    """

    name: str
    default: Any
    kind: str | None = None
    ge: float | None = None
    gt: float | None = None
    choices: tuple | None = None

    def check(self, value: Any, *, who: str) -> None:
        """Raise ValueError naming `who`, the parameter, the bound and the value when it is not accepted."""
        if self.choices is not None:
            if value not in self.choices:
                allowed = ", ".join(repr(c) for c in self.choices)
                raise ValueError(f"{who}: {self.name} must be one of {allowed}, got {value!r}")
            return
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{who}: {self.name} must be true or false, got {value!r}")
            return
        if self.kind not in ("int", "number"):
            return
        numeric = isinstance(value, int) if self.kind == "int" else isinstance(value, (int, float))
        if not numeric or isinstance(value, bool) or not math.isfinite(value) or not self._in_bounds(value):
            what = "an integer" if self.kind == "int" else "a number"
            bound = f" >= {self.ge:g}" if self.ge is not None else f" > {self.gt:g}" if self.gt is not None else ""
            raise ValueError(f"{who}: {self.name} must be {what}{bound}, got {value!r}")

    def _in_bounds(self, value: float) -> bool:
        return (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)


def check_series(t_s, y, *, who: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate a series and put it on a regular grid.

    t_s: interval end times, seconds, strictly increasing.
    y: values (counts or mean lengths), >= 0 where finite; NaN marks a
        missing interval (no data, or masked).
    Returns float arrays on a regular grid (the smallest step): a step that
    is a whole multiple of it is a gap, filled with NaN points.
    Raises ValueError naming the problem.
    """
    t = np.asarray(t_s, dtype=np.float64).ravel()
    v = np.asarray(y, dtype=np.float64).ravel()
    if t.shape != v.shape:
        raise ValueError(f"{who}: t_s has {t.size} points, y has {v.size}")
    if t.size == 0:
        raise ValueError(f"{who}: empty series (need at least one point)")
    if not np.all(np.isfinite(t)):
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"{who}: t_s[{i}] is {t[i]}, expected a finite time in seconds")
    if np.any(np.isinf(v)):
        i = int(np.flatnonzero(np.isinf(v))[0])
        raise ValueError(f"{who}: y[{i}] is {v[i]}, expected a finite value or NaN (missing)")
    neg = np.flatnonzero(v < 0)
    if neg.size:
        raise ValueError(f"{who}: y[{int(neg[0])}] = {v[neg[0]]} is negative; load values must be >= 0")
    if not np.any(np.isfinite(v)):
        raise ValueError(f"{who}: all {v.size} values are NaN (no data to fit)")
    if t.size == 1:
        return t, v
    dt = np.diff(t)
    if np.any(dt <= 0):
        i = int(np.flatnonzero(dt <= 0)[0])
        raise ValueError(f"{who}: t_s must be strictly increasing, t_s[{i}]={t[i]} >= t_s[{i + 1}]={t[i + 1]}")
    # The smallest step is the bin width; larger steps must be whole multiples (gaps).
    step = float(np.min(dt))
    ratio = dt / step
    steps = np.rint(ratio)
    if np.all(steps == 1):
        return t, v
    if np.any(np.abs(ratio - steps) > _GAP_TOL_FRAC) or np.any(steps < 1):
        i = int(np.flatnonzero((np.abs(ratio - steps) > _GAP_TOL_FRAC) | (steps < 1))[0])
        raise ValueError(
            f"{who}: t_s is not on a regular grid: step {dt[i]} s at index {i} "
            f"is not a whole multiple of the bin width {step} s"
        )
    if steps.sum() + 1 > t.size + _MAX_GAP_POINTS:
        raise ValueError(f"{who}: gaps in t_s would insert more than {_MAX_GAP_POINTS} missing points")
    pos = np.concatenate([[0], np.cumsum(steps).astype(np.int64)])
    grid_t = t[0] + step * np.arange(pos[-1] + 1)
    grid_v = np.full(grid_t.size, np.nan)
    grid_v[pos] = v
    return grid_t, grid_v


def interval_of(t: np.ndarray) -> float:
    """Bin width of a regularised series, seconds (1.0 for a single point)."""
    return float((t[1:] - t[:-1]).min()) if t.size > 1 else 1.0  # np.diff's subtraction and np.min's reduction


def fill_gaps(y: np.ndarray) -> np.ndarray:
    """Linear interpolation over NaN, constant extension at the ends."""
    ok = np.isfinite(y)
    if ok.all():
        return y.copy()
    idx = np.arange(y.size)
    return np.interp(idx, idx[ok], y[ok])


def last_finite(y: np.ndarray) -> float:
    ok = np.flatnonzero(np.isfinite(y))
    return float(y[ok[-1]])


def previous_value(y: np.ndarray) -> np.ndarray:
    """Last-value one-step predictions: out[i] = last finite y before i (NaN if none)."""
    out = np.full(y.size, np.nan)
    # Index of the last finite value up to each point (-1: none yet).
    last = np.maximum.accumulate(np.where(np.isfinite(y), np.arange(y.size), -1))[:-1]
    seen = last >= 0
    out[1:][seen] = y[last[seen]]
    return out


def clean_forecast(pred, *, fallback: float) -> np.ndarray:
    """Never negative, never NaN: NaN/inf -> fallback, negative -> 0."""
    p = np.asarray(pred, dtype=np.float64).copy()
    p[~np.isfinite(p)] = fallback
    return np.maximum(p, 0.0)


# Hyperparameters every predictor has, after its own.
COMMON_PARAMS = (
    Param("residual_window", 200, "int", ge=1),  # one-step residuals used for quantiles: the most recent this many
    Param("warm_start", False, "bool"),
)


class PredictorBase:
    """Constructor, `fit`, residual-based quantiles and the shared fitted attributes.

    A predictor declares `name`, its hyperparameters in `PARAMS` and its
    learning in `_fit(t_s, y)`; the rest is here.
    """

    #: registry name, set by each subclass
    name = "base"
    #: the predictor's own hyperparameters (COMMON_PARAMS follow)
    PARAMS: tuple[Param, ...] = ()
    #: fit with BLAS/OpenMP pools limited to one thread (models that call into them)
    limit_threads = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default) for p in cls.param_table()]
        )

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - {p.name for p in self.param_table()})
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s): {', '.join(unknown)}")
        for p in self.param_table():
            setattr(self, p.name, params.get(p.name, p.default))

    @classmethod
    def param_table(cls) -> tuple[Param, ...]:
        """Every hyperparameter, in constructor order."""
        return cls.PARAMS + COMMON_PARAMS

    @classmethod
    def from_params(cls, **params: Any) -> "PredictorBase":
        """A new, unfitted predictor; an unknown parameter is a ValueError listing the valid ones."""
        valid = [p.name for p in cls.param_table()]
        bad = sorted(set(params) - set(valid))
        if bad:
            raise ValueError(f"predictor {cls.name!r}: unknown parameter(s) {', '.join(bad)}; valid: {', '.join(valid)}")
        return cls(**params)

    def fit(self, t_s, y):
        """Validate the hyperparameters, then learn from (t_s seconds, y); returns self."""
        return self._fit_validated(t_s, y, None)

    def _fit_regular(self, t: np.ndarray, v: np.ndarray, *, extends: bool = False):
        """`fit` on a series `check_series` already returned (`auto`'s candidates fit its stored series).

        Such a series is a regular float grid, on which `check_series` answers
        the same arrays, so it is not validated again. extends: the caller
        found that this series extends the one this predictor was last fitted
        on (`auto`: its candidates were fitted on auto's previous series), so
        `_extends_previous` answers yes without comparing the two again.
        """
        return self._fit_validated(t, v, (t, v, t, v), extends=extends)

    def check_params(self) -> "PredictorBase":
        """Validate the hyperparameters (ValueError naming the predictor, the parameter and the value); self.

        A configuration runs it when loaded, so a bad value fails there, not in a planner run; `fit`
        checks the predictor's own parameters again.
        """
        self._check_own_params()
        return self

    def _check_own_params(self) -> None:
        who = type(self).__name__
        for p in self.param_table():
            p.check(getattr(self, p.name), who=who)

    def _fit_validated(self, t_s, y, checked: tuple | None, *, extends: bool = False):
        """`fit`'s work: checked seeds `_checked_series` (t_s, y, and their validated arrays) for this fit only;
        extends: see `_fit_regular`."""
        self._check_own_params()
        self._series_memo = checked
        self._extends_known = extends
        try:
            if not self.limit_threads:
                return self._fit(t_s, y)
            with single_threaded():
                return self._fit(t_s, y)
        finally:
            self.__dict__.pop("_series_memo", None)
            self.__dict__.pop("_extends_known", None)

    def _checked_series(self, t_s, y) -> tuple[np.ndarray, np.ndarray]:
        """`check_series(t_s, y)`, validated once per fit: `_extends_previous` and `_set_series` both ask."""
        memo = self.__dict__.get("_series_memo")
        if memo is not None and memo[0] is t_s and memo[1] is y:
            return memo[2], memo[3]
        t, v = check_series(t_s, y, who=type(self).__name__)
        if "_series_memo" in self.__dict__:  # inside a fit
            self._series_memo = (t_s, y, t, v)
        return t, v

    def _fit(self, t_s, y):
        """Learn from the series and set the fitted attributes; returns self."""
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if not hasattr(self, "y_"):
            raise ValueError(f"{type(self).__name__}: call fit(t_s, y) before predict")

    def _set_series(self, t_s, y, *, align: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Validate and store the series; align: snap it onto the previous fit's grid.

        Aligning (only after `_extends_previous` said yes) moves the times by
        less than `_MAX_PHASE_FRAC` of a bin, so warm state keyed by time (past
        forecasts, fit times) keeps matching when runs start a few seconds
        apart; the values are untouched.
        """
        t, v = self._checked_series(t_s, y)
        if align:
            shift = (t[0] - self.t_s_[0]) / self.interval_s_
            t = t - (shift - round(shift)) * self.interval_s_
        self.t_s_, self.y_ = t, v
        self.interval_s_ = interval_of(t)
        self.last_value_ = last_finite(v)
        self.fallback_reason_ = None
        return t, v

    def _extends_previous(self, t_s, y) -> bool:
        """True when a warm start may reuse state: the new series continues the old one.

        That is: warm_start is on, the bin width is the same, the grid is the
        same up to `_MAX_PHASE_FRAC` of a bin (a run that starts a few seconds
        later reads the same intervals), it does not go back in time, and where
        the two series overlap they agree: the median relative difference of
        the values both have is at most `_MAX_OVERLAP_DIFF_FRAC`, ignoring the
        newest `_REVISABLE_POINTS` old points (late samples may still change
        those). Anything else (another deployment's series, a what-if's scaled
        load, rewritten history) is a cold fit, so reused state never answers
        for a different series.
        """
        if not getattr(self, "warm_start", False) or not hasattr(self, "t_s_"):
            return False
        if self.__dict__.get("_extends_known"):
            return True
        try:
            t, v = self._checked_series(t_s, y)
        except ValueError:
            return False  # the fit itself reports it
        old_t, old_v, step = self.t_s_, self.y_, self.interval_s_
        if t.size < 2 or abs(interval_of(t) - step) > 1e-6 * step or t[-1] < old_t[-1] - _MAX_PHASE_FRAC * step:
            return False
        shift = (t[0] - old_t[0]) / step
        k0 = round(shift)
        if abs(shift - k0) > _MAX_PHASE_FRAC:
            return False
        # The overlap: new points i whose old index i + k0 is in 0 .. old_v.size - _REVISABLE_POINTS - 1.
        lo, hi = max(0, -k0), max(0, min(t.size, old_v.size - _REVISABLE_POINTS - k0))
        a = v[lo:hi]
        b = old_v[lo + k0:hi + k0] if hi > lo else old_v[:0]
        ok = np.isfinite(a) & np.isfinite(b)
        if not ok.any():
            return True  # no overlap to disagree with (e.g. the planner was down for a while)
        a, b = a[ok], b[ok]
        rel = np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-12)
        return bool(np.median(rel) <= _MAX_OVERLAP_DIFF_FRAC)

    def _stale(self, fitted_at_s: float | None, fitted_points: int | None, every: int) -> bool:
        """Whether warm-started state is due for a refresh.

        fitted_at_s / fitted_points: time of the last point and points seen when
        the state was estimated (None: never). Due after `every` new points, or
        sooner while the history is young: after a quarter as many new points
        as it was estimated on, so a short series is not stuck with parameters
        from its first few points.
        """
        if fitted_at_s is None or fitted_points is None:
            return True
        new_points = (self.t_s_[-1] - fitted_at_s) / self.interval_s_
        return new_points >= min(every, max(1, fitted_points // 4))

    def _fall_back(self, reason: str) -> None:
        """Answer with the last value; its residuals are last value's, so quantiles stay honest."""
        self.fallback_reason_ = reason
        self.insample_ = previous_value(self.y_)

    def clone(self, **overrides):
        """A new, unfitted predictor with the same hyperparameters (scikit-learn's `clone`), some overridden."""
        params = {p.name: getattr(self, p.name) for p in self.param_table()}
        params.update(overrides)
        return type(self)(**params)

    def out_of_sample(self, indices) -> np.ndarray:
        """Genuine one-step forecasts for points of the fitted series, each from the points before it only.

        indices: positions in the fitted (regularised) series, each >= 1.
        Returns one forecast per index, never negative; NaN where there was
        no finite point before it. This generic version refits a warm-started
        copy on every prefix (periodic refreshes included, as the planner's
        cache would have run it); predictors whose fitted state allows it
        override it with one filter pass from a fit on the data before the
        first index, which is what makes a cold `auto` affordable.
        """
        self._check_fitted()
        t, v = self.t_s_, self.y_
        scorer = self.clone(warm_start=True)
        out = np.full(len(indices), np.nan)
        for k, i in enumerate(int(i) for i in indices):
            if np.any(np.isfinite(v[:i])):
                out[k] = float(scorer.fit(t[:i], v[:i]).predict(1)[0])
        return out

    def predict(self, horizon: int = 1) -> np.ndarray:
        """Mean forecast for the next `horizon` intervals, never negative or NaN (last value while falling back)."""
        self._check_fitted()
        h = check_horizon(horizon, type(self).__name__)
        mean = np.full(h, self.last_value_) if self.fallback_reason_ is not None else self._predict(h)
        return clean_forecast(mean, fallback=self.last_value_)

    def _predict(self, h: int) -> np.ndarray:
        """The model's own next-h forecast (cleaned by `predict`)."""
        raise NotImplementedError

    def _start_fit(self, t_s, y, *, warm: tuple[str, ...], model: str) -> tuple | None:
        """Begin a refit: (reuse, previous, t, v, finite points, index of the first finite point).

        reuse: the new series extends the previous one (`_extends_previous`);
        previous: the fitted attributes named in `warm` before this fit (None
        where unset); t, v: the stored series (`_set_series`). The attribute
        `model` is reset to None. None, answering with last value, when the
        series has fewer than min_points finite points.
        """
        reuse = self._extends_previous(t_s, y)
        previous = tuple(getattr(self, name, None) for name in warm)
        setattr(self, model, None)
        t, v = self._set_series(t_s, y, align=reuse)
        n_ok = int(np.isfinite(v).sum())
        if n_ok < self.min_points:
            self._fall_back(f"{n_ok} points < min_points {self.min_points}: last value")
            return None
        return reuse, previous, t, v, n_ok, int(np.flatnonzero(np.isfinite(v))[0])

    def residuals(self) -> np.ndarray:
        """Recent one-step residuals y - insample (finite ones, newest last)."""
        self._check_fitted()
        r = self.y_ - self.insample_
        r = r[np.isfinite(r)]
        return r[-int(self.residual_window):]

    def predict_quantile(self, q: float, horizon: int = 1) -> np.ndarray:
        """q-quantile forecast for the next `horizon` intervals, never negative or NaN.

        mean + conformal quantile of recent one-step residuals, widened by
        sqrt(k) for the k-th step ahead (a random-walk error growth; an
        approximation beyond one step). No residuals yet: the mean.
        """
        if not (isinstance(q, (int, float)) and 0.0 < q < 1.0):
            raise ValueError(f"{type(self).__name__}: quantile q must be in (0, 1), got {q!r}")
        mean = self.predict(horizon)
        residuals = self.residuals()
        off = conformal_offset(residuals, quantile=float(q)) if residuals.size else 0.0
        k = np.sqrt(np.arange(1, mean.size + 1))
        return clean_forecast(mean + off * k, fallback=self.last_value_)


@functools.lru_cache(maxsize=2)
def _thread_pools(with_sklearn: bool):
    """The BLAS/OpenMP pools in this process, found once per set of runtimes (scanning takes ~10 ms).

    with_sklearn: scikit-learn is in use, so its models (and OpenMP runtime) are
    loaded before the scan. Of the predictors only gradient boosting needs them:
    a process that never fits one is spared the import (~0.2 s) and has no
    OpenMP pool of scikit-learn's to limit.
    """
    import scipy.linalg  # noqa: F401  (load their runtimes before the scan)

    if with_sklearn:
        import sklearn.ensemble  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def single_threaded(*, with_sklearn: bool = False):
    """Context: BLAS/OpenMP pools limited to one thread while a small model runs.

    with_sklearn: load scikit-learn's models first, so its OpenMP pool is limited
    too (it is whenever scikit-learn is already imported).

    These models work on a few hundred rows, where extra threads only
    contend: on the shared 2-core machine one auto_arima on 30 points took
    130 s with OpenBLAS's default threads and 2.9 s with one, and a boosted
    model's one-row predict 0.4 s instead of milliseconds.
    """
    return _limit_once(with_sklearn or "sklearn" in sys.modules)


# Per thread: with_sklearn of each single_threaded context entered and not yet left, innermost last.
_LIMITS = threading.local()


@contextlib.contextmanager
def _limit_once(with_sklearn: bool):
    """Limit the pools to one thread, unless an enclosing context already did for the same (or more) pools.

    Nested limits (auto's candidates inside auto's fit) would set and restore
    the same single thread; they cost a pass over every pool each.
    """
    active = _LIMITS.__dict__.setdefault("active", [])
    if active and (active[-1] or not with_sklearn):
        yield
        return
    with _thread_pools(with_sklearn).limit(limits=1):
        active.append(with_sklearn)
        try:
            yield
        finally:
            active.pop()


def check_horizon(horizon: int, who: str) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ValueError(f"{who}: horizon must be an integer >= 1, got {horizon!r}")
    return int(horizon)
