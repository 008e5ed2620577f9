"""Split-conformal offsets: the shift of a prediction that covers a share of new outcomes.

One definition for the load predictors' upper quantile (planner.predictors) and the routing
service's p90 latency calibration (routing.training.calibration, routing.models.online_calibration).
"""

from __future__ import annotations

import math

import numpy as np


def conformal_offset(residuals: np.ndarray, *, quantile: float) -> float:
    """The split-conformal `quantile` of residuals (observed - predicted): the shift of a prediction that
    covers a new exchangeable residual with probability >= quantile (or, below 0.5, stays under it).

    With n finite residuals the ceil((n + 1) * quantile)-th smallest is taken for quantile >= 0.5, the
    floor((n + 1) * quantile)-th for a lower one; a rank beyond the residuals takes the outermost one.
    Non-finite residuals (gaps) are left out. No finite residual raises: the caller decides what a
    prediction without a measured error is.
    """
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"conformal_offset: quantile must be in (0, 1), got {quantile!r}")
    r = np.asarray(residuals, dtype=float)
    r = np.sort(r[np.isfinite(r)])
    n = r.size
    if n == 0:
        raise ValueError("conformal_offset: no finite residuals")
    if quantile >= 0.5:
        k = min(n, math.ceil((n + 1) * quantile))
    else:
        k = max(1, math.floor((n + 1) * quantile))
    return float(r[k - 1])
