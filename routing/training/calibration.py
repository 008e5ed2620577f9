"""Conformal calibration of the p90 model: the log shift that makes 90% of calibration latencies fall below it."""

from __future__ import annotations

import math

import numpy as np

from planner.conformal import conformal_offset
from routing.features import Target
from routing.training.buckets import BUCKET_EDGES, bucket_of
from routing.training.config import TrainingConfig
from routing.features import QUANTILE
from routing.training.scores import latency_metrics


def calibration_offsets(target: Target, x: np.ndarray, residuals: np.ndarray,
                        cfg: TrainingConfig) -> tuple[float, tuple[float, ...] | None]:
    """(global conformal offset, per-bucket offsets or None) of calibration rows x (full FEATURES[target]
    rows) with log residuals observed - p90 prediction, as cfg.p90_calibration says for the target."""
    offset = conformal_offset(residuals, quantile=QUANTILE)
    if cfg.p90_calibration[target] != "load_bucket":
        return offset, None
    return offset, bucket_offsets(target, x, residuals, global_offset=offset,
                                  min_samples=cfg.calibration_min_bucket_samples)


def p90_half_loss(target: Target, x: np.ndarray, log_y: np.ndarray, pred: np.ndarray, log_base: np.ndarray,
                  cfg: TrainingConfig) -> float:
    """Relative p90 (pinball) loss on the newer half of calibration rows of a p90 prediction (log space,
    before calibration) calibrated on the older half; log_base: log estimate, added to both."""
    half = log_y.size // 2
    if half < 1:
        return math.inf
    old, new = slice(0, half), slice(half, None)
    offset, by_bucket = calibration_offsets(target, x[old], log_y[old] - pred[old], cfg)
    shift = offset if by_bucket is None else np.asarray(by_bucket)[bucket_of(target, x[new])]
    y_ms = np.exp(log_y[new] + log_base[new])
    p90_ms = np.exp(pred[new] + shift + log_base[new])
    return float(latency_metrics(y_ms, p90_ms, p90_ms)["p90_loss"])


def bucket_offsets(
    target: Target, x: np.ndarray, residuals: np.ndarray, *, global_offset: float, min_samples: int
) -> tuple[float, ...]:
    """Conformal p90 shift per load bucket (BUCKET_EDGES[target]) of calibration rows x.

    A bucket with at least min_samples rows gets the conformal offset of its own
    residuals (log space), so the p90 covers 90% in each load level the
    calibration slice saw; the others keep global_offset. The p90 model's
    errors grow with load, and one global shift covers light-load rows too
    well and heavy-load rows too little.
    """
    b = bucket_of(target, x)
    out = []
    for k in range(len(BUCKET_EDGES[target][1])):
        r = residuals[b == k]
        out.append(conformal_offset(r, quantile=QUANTILE) if r.size >= min_samples else global_offset)
    return tuple(out)
