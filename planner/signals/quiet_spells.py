"""Quiet spells: did the load fall far below its peak within a window, as bursty tenants' does between bursts?

The scale-down floor (decision.scale_down_floor_s) keeps a share of a long window's highest recommendation so a
tenant that comes back after a quiet spell longer than the stabilization window finds capacity waiting: Azure
code's copies send thousands of requests a minute, then tens, then thousands again. Traffic without quiet
spells has nothing to come back from: a steady stream whose work per request drifts (Mooncake's prompts grow
from 13k to 25k tokens over its 17 minutes at a steady ~450 requests a minute) only has the floor hold what an
earlier, heavier stretch needed. The signal: a low quantile of the window's per-interval arrivals against its
busiest interval. A quantile, not the minimum, so one partial interval (a trace's last, a restart) is not a
quiet spell. Measured over each whole trace (one hour; Mooncake's 17 minutes): the 10th percentile is 0-1% of
the busiest minute on Azure code x8 (tenants or synchronised), 49-51% on conv x8, 76-78% on Mooncake x2.

Pure functions, no I/O.
"""

from __future__ import annotations

import math

import numpy as np

from planner.types import LoadHistory


def quiet_share(history: LoadHistory | None, *, since_s: float, quantile: float = 0.1) -> float | None:
    """The window's `quantile` interval arrivals as a share of its busiest interval's (0..1).

    history: the collected per-interval load; intervals ending after since_s count (NaN counts are left out).
    None when fewer than two intervals with a count are in the window or the busiest holds no requests: too
    little to tell, and the caller keeps its rule.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quiet_share: quantile must be within 0..1, got {quantile!r}")
    if history is None:
        return None
    counts = [n for t, n in zip(history.t_s, history.num_requests) if t > since_s and not math.isnan(n)]
    if len(counts) < 2 or max(counts) <= 0:
        return None
    return float(np.quantile(np.asarray(counts, dtype=float), quantile) / max(counts))


def had_quiet_spell(history: LoadHistory | None, *, since_s: float, max_share: float,
                    quantile: float = 0.1) -> tuple[bool, float | None]:
    """(whether the window had quiet spells, the share read): its `quantile` interval at or below max_share of
    its busiest. Too little history (quiet_share None) counts as quiet: the caller's rule keeps holding."""
    share = quiet_share(history, since_s=since_s, quantile=quantile)
    return share is None or share <= max_share, share


__all__ = ["had_quiet_spell", "quiet_share"]
