"""The fit: a target's point and p90 gradient-boosted models on log latency."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from routing.features import FEATURE_SET_VERSION, FEATURE_SETS, TARGETS, Target, columns_of
from routing.training.buckets import bucket_of
from routing.training.calibration import calibration_offsets, p90_half_loss
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, TargetData
from routing.features import QUANTILE
from routing.training.split import Split, splits_for


@dataclass
class TargetModels:
    """Fitted models of one target (on log latency) and how they were fitted.

    p90_log_offset: added to the p90 model's log prediction (calibration; with
    per-bucket calibration, the global shift, used by buckets with too few rows).
    p90_bucket_offsets: per load bucket (BUCKET_EDGES[target]), the shift used
    instead of p90_log_offset; None: one global shift.
    feature_set: the routing.features set the models were fitted on; columns:
    its columns in the full FEATURES[target] rows.
    base: the estimate's name when the models predict ratios to it (None: ms).
    p90_kind: "flat" when the p90 is the estimate times the calibration (no trees);
    mean_kind: "flat" when the point model is the estimate times a factor (no trees);
    p90_selection / relative_selection / point_selection: the calibration-slice losses the choices were made on.
    """

    target: Target
    mean: object
    p90: object
    p90_log_offset: float
    n_train: int
    n_calibration: int
    iterations: dict[str, int] = field(default_factory=dict)
    fit_s: float = 0.0
    feature_set: int = FEATURE_SET_VERSION
    columns: np.ndarray | None = None
    p90_bucket_offsets: tuple[float, ...] | None = None
    base: str | None = None
    p90_kind: Literal["trees", "flat"] = "trees"
    p90_selection: dict[str, float] = field(default_factory=dict)
    relative_selection: dict[str, float] = field(default_factory=dict)
    mean_kind: Literal["trees", "flat"] = "trees"
    point_selection: dict[str, float] = field(default_factory=dict)

    def predict(self, x: np.ndarray, estimate_ms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, p90) latency, ms, straight from the scikit-learn models (x: full FEATURES[target] rows;
        estimate_ms: the estimate of each row, needed when `base` is set)."""
        shift = self.p90_shift(x)
        if self.base is not None and estimate_ms is None:
            raise ValueError(f"{self.target} models are relative to {self.base}: give estimate_ms")
        log_base = 0.0 if self.base is None else log_estimate(estimate_ms)
        if self.columns is not None:
            x = x[:, self.columns]
        return np.exp(self.mean.predict(x) + log_base), np.exp(self.p90.predict(x) + shift + log_base)

    def p90_shift(self, x: np.ndarray) -> np.ndarray | float:
        """The calibration shift (log space) of each row of x (full FEATURES[target] rows)."""
        if self.p90_bucket_offsets is None:
            return self.p90_log_offset
        return np.asarray(self.p90_bucket_offsets)[bucket_of(self.target, x)]


def log_estimate(estimate_ms: np.ndarray) -> np.ndarray:
    """log of the estimate, ms, floored at 1 us (the estimate's TPOT of a prefill row is 0)."""
    return np.log(np.maximum(np.asarray(estimate_ms, dtype=float), 1e-3))


def fit_target(data: TargetData, split: Split, cfg: TrainingConfig) -> TargetModels:
    """Fit the mean and p90 models of one target on the split's training rows.

    The calibration rows, when there are any, drive early stopping, the p90 calibration offset and
    the choices; the holdout rows are not touched. With the samples' estimate (data.estimate_ms) and
    cfg.relative_to_estimate "always" (or "select" and a lower calibration MAPE of the relative point
    model: one more fit), the models fit log(latency / estimate) and are relative to it; with
    cfg.point_select the point trees give way to the estimate times a factor when that does better.
    """
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    columns = columns_of(FEATURE_SETS[cfg.feature_set][data.target], data.target)
    candidates = [False]
    if data.estimate_ms is not None and cfg.relative_to_estimate != "never":
        has_calibration = split.calibration.stop > split.calibration.start
        candidates = [True, False] if cfg.relative_to_estimate == "select" and has_calibration else [True]
    log_est = log_estimate(data.estimate_ms) if data.estimate_ms is not None else 0.0
    cal = split.calibration
    x_tr, x_cal = data.x[split.train][:, columns], data.x[cal][:, columns]
    if x_tr.shape[0] < 2:
        raise ValueError(f"fit_target {data.target}: need at least 2 training rows, got {x_tr.shape[0]}")
    common = dict(
        max_iter=cfg.max_iter,
        learning_rate=cfg.learning_rate,
        max_leaf_nodes=cfg.max_leaf_nodes,
        min_samples_leaf=cfg.min_samples_leaf,
        l2_regularization=cfg.l2_regularization,
        max_bins=cfg.max_bins,
        random_state=cfg.seed,
    )
    # Early stopping on the calibration slice: the most recent rows before the
    # holdout, never a random subset of the (older) training rows.
    early = (dict(early_stopping=True, n_iter_no_change=cfg.n_iter_no_change) if x_cal.shape[0]
             else dict(early_stopping=False))
    t0 = time.perf_counter()
    # A busy machine makes OpenMP's spinning threads far slower than one thread.
    with threadpool_limits(limits=cfg.n_threads, user_api="openmp"):
        fits, relative_mape = {}, {}
        for relative in candidates:
            log_y = np.log(data.y_ms) - (log_est if relative else 0.0)
            y_tr, y_cal = log_y[split.train], log_y[split.calibration]
            val = dict(X_val=x_cal, y_val=y_cal) if y_cal.size else {}
            fits[relative] = (y_tr, y_cal, val, HistGradientBoostingRegressor(
                loss=cfg.point_loss, **common, **early).fit(x_tr, y_tr, **val))
            if len(candidates) > 1:
                # MAPE in ms on the calibration slice (the relative prediction times the estimate).
                pred = fits[relative][3].predict(x_cal) - y_cal
                relative_mape["relative" if relative else "absolute"] = float(np.mean(np.abs(np.exp(pred) - 1)))
        relative = candidates[0] if len(candidates) == 1 else relative_mape["relative"] <= relative_mape["absolute"]
        y_tr, y_cal, val, mean = fits[relative]
        point_selection = _point_selection(mean, data, split, cfg, x_cal=x_cal, y_cal=y_cal)
        mean_kind = "flat" if point_selection and point_selection["flat"] < point_selection["trees"] else "trees"
        if mean_kind == "flat":  # the estimate times the calibration slice's median ratio; a flat p90
            relative, (y_tr, y_cal) = True, (np.log(data.y_ms[r]) - log_est[r] for r in (split.train, cal))
            mean, p90 = FlatModel(float(np.median(y_cal))), FlatModel()
        else:
            p90 = HistGradientBoostingRegressor(loss="quantile", quantile=QUANTILE, **common, **early)
            p90.fit(x_tr, y_tr, **val)
        p90, offset, by_bucket, kind, selection = _calibrated_p90(p90, data, split, cfg, x_cal=x_cal, y_cal=y_cal,
                                                                  relative=relative and mean_kind == "trees")
    return TargetModels(
        target=data.target,
        mean=mean,
        p90=p90,
        p90_log_offset=offset,
        n_train=int(y_tr.size),
        n_calibration=int(y_cal.size),
        iterations={"mean": int(mean.n_iter_), "p90": int(p90.n_iter_)},
        fit_s=time.perf_counter() - t0,
        feature_set=cfg.feature_set,
        columns=columns,
        p90_bucket_offsets=by_bucket,
        base=data.estimate_name if relative else None,
        p90_kind="flat" if mean_kind == "flat" else kind,
        p90_selection=selection,
        relative_selection=relative_mape,
        mean_kind=mean_kind,
        point_selection=point_selection,
    )


def _point_selection(mean, data: TargetData, split: Split, cfg: TrainingConfig, *, x_cal: np.ndarray,
                     y_cal: np.ndarray) -> dict[str, float]:
    """The calibration-slice MAPEs point_select chooses on ({} when it does not apply)."""
    if not (cfg.point_select and data.estimate_ms is not None and cfg.relative_to_estimate != "never"
            and y_cal.size):
        return {}
    log_ratio = np.log(data.y_ms[split.calibration]) - log_estimate(data.estimate_ms[split.calibration])
    return _point_half_mape(mean.predict(x_cal) - y_cal, log_ratio)


def _point_half_mape(tree_residuals: np.ndarray, log_ratio: np.ndarray) -> dict[str, float]:
    """MAPE on the newer half of the calibration rows: the point trees (their log residuals) and the
    estimate times the median ratio of the older half (flat); inf when the slice has under 2 rows."""
    half = log_ratio.size // 2
    if half < 1:
        return {"trees": 0.0, "flat": math.inf}
    flat = log_ratio[half:] - float(np.median(log_ratio[:half]))
    return {"trees": float(np.mean(np.abs(np.exp(tree_residuals[half:]) - 1))),
            "flat": float(np.mean(np.abs(np.exp(-flat) - 1)))}


def _calibrated_p90(p90, data: TargetData, split: Split, cfg: TrainingConfig, *, x_cal: np.ndarray,
                    y_cal: np.ndarray, relative: bool) -> tuple[object, float, tuple[float, ...] | None, str, dict]:
    """The p90 model to publish with its calibration: (model, global log offset, per-bucket offsets or
    None, "trees" or "flat", the calibration-slice losses p90_select chose on).

    x_cal: the calibration rows in the fitted columns; y_cal: their log latency (log ratio to the
    estimate when relative). No calibration rows, or cfg.calibrate_p90 off: the trees, unshifted.
    """
    offset, by_bucket, kind, selection = 0.0, None, "trees", {}
    if cfg.calibrate_p90 and y_cal.size:
        x_cal_full = data.x[split.calibration]
        if relative and cfg.p90_select:
            log_base = log_estimate(data.estimate_ms[split.calibration])
            selection = {k: p90_half_loss(data.target, x_cal_full, y_cal, pred, log_base, cfg)
                         for k, pred in (("trees", p90.predict(x_cal)), ("flat", np.zeros(y_cal.size)))}
            if selection["flat"] < selection["trees"]:
                p90, kind = FlatModel(), "flat"
        residuals = y_cal - p90.predict(x_cal)
        offset, by_bucket = calibration_offsets(data.target, x_cal_full, residuals, cfg)
    return p90, offset, by_bucket, kind, selection


class FlatModel:
    """A 'model' with no trees: a constant log ratio, so the prediction is the estimate times a factor.

    As the p90: 0, the calibration supplies the factor; as the point model, the median log ratio.
    """

    n_iter_ = 0

    def __init__(self, log_factor: float = 0.0):
        self.log_factor = log_factor

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), self.log_factor)


def fit_all(prepared: PreparedSamples, cfg: TrainingConfig) -> dict[Target, TargetModels]:
    """Fit both targets' models on their time-ordered training rows."""
    splits = splits_for(prepared, cfg)
    return {t: fit_target(prepared.by_target[t], splits[t], cfg) for t in TARGETS}
