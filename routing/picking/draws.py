"""Seeded choice among tied candidates: one uniform `u` in [0, 1) picks among the best."""

from __future__ import annotations

import numpy as np


def argmin_random(values: np.ndarray, u: float) -> int:
    best = np.flatnonzero(values == values.min())
    return int(best[min(int(u * best.size), best.size - 1)])


def argmax_random(values: np.ndarray, u: float) -> int:
    best = np.flatnonzero(values == values.max())
    return int(best[min(int(u * best.size), best.size - 1)])


def argmax_tiebreak(primary: np.ndarray, secondary: np.ndarray, u: float) -> int:
    """Largest primary; exact ties by the largest secondary, then at random.

    The binding headroom ties whenever one SLO is binding for every candidate
    with the same value (a decode stage's TTFT budget is the same on every
    decode endpoint): the other SLO's headroom should then decide, not chance.
    """
    best = np.flatnonzero(primary == primary.max())
    if best.size > 1:
        sec = secondary[best]
        best = best[sec == sec.max()]
    return int(best[min(int(u * best.size), best.size - 1)])
