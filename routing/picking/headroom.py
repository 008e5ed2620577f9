"""Headroom arithmetic of a pick: the margin an endpoint needs, headroom relative to the SLO.

Headroom is SLO minus prediction, ms; an SLO of inf means none constrains.
"""

from __future__ import annotations

import numpy as np


def per_endpoint(x, n: int) -> np.ndarray:
    return np.full(n, float(x)) if np.ndim(x) == 0 else x


def margin_ms(strict, margin_frac: float):
    """Headroom an endpoint needs, ms: margin_frac of each finite SLO, 0 where none constrains (inf)."""
    if np.ndim(strict) == 0:  # the request's own SLO (decode TTFT, prefill TPOT): no array needed
        strict = float(strict)
        return strict * margin_frac if np.isfinite(strict) else 0.0
    strict = np.asarray(strict, dtype=float)
    finite = np.isfinite(strict)
    return np.where(finite, strict, 0.0) * margin_frac


def relative_headroom(h: np.ndarray, strict) -> np.ndarray | float:
    """Headroom / SLO, clipped to [-1e9, 1]; 1 where no SLO constrains (strict = inf).

    strict: a scalar or an array aligned with h (ms). The 1e-9 ms floor keeps
    absurd SLOs (1e-300 ms) from overflowing.
    """
    if np.ndim(strict) == 0:
        if not np.isfinite(strict):
            return 1.0
        r = h / max(float(strict), 1e-9)
    else:
        finite = np.isfinite(strict)
        if finite.all():
            r = h / np.maximum(strict, 1e-9)
        elif not finite.any():
            return 1.0
        else:
            r = np.where(finite, h / np.where(finite, np.maximum(strict, 1e-9), 1.0), 1.0)
    return np.minimum(np.maximum(r, -1e9), 1.0)
