"""Accuracy of point and p90 latency predictions against observed latency."""

from __future__ import annotations

import numpy as np

from routing.features import QUANTILE


def latency_metrics(y_ms: np.ndarray, mean_ms: np.ndarray, p90_ms: np.ndarray) -> dict:
    """{"n", "mape", "p90_coverage", "p90_loss"} of point and p90 predictions (None when n = 0).

    mape: mean |mean - y| / y. p90_coverage: share of y <= p90. p90_loss: the
    pinball loss at 0.9 relative to y, mean of max(0.9 (y - p90), -0.1 (y - p90)) / y,
    which is lowest for the true 90th percentile.
    """
    y = np.asarray(y_ms, dtype=float)
    out = {"n": int(y.size), "mape": None, "p90_coverage": None, "p90_loss": None}
    if y.size:
        q = np.asarray(p90_ms, dtype=float)
        diff = y - q
        out["mape"] = float(np.mean(np.abs(np.asarray(mean_ms) - y) / y))
        out["p90_coverage"] = float(np.mean(y <= q))
        out["p90_loss"] = float(np.mean(np.maximum(QUANTILE * diff, (QUANTILE - 1) * diff) / y))
    return out
