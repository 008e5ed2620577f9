"""The fleet a dynamic policy starts from: what the planner sizes for the first interval's load."""

from __future__ import annotations

import warnings

from planner.config import PlannerConfig
from planner.latency.profile import EngineProfile
from planner.latency.profile_checks import ProfileRangeWarning
from planner.latency.ttft_view import TtftView
from planner.types import Observation
from planner.steps import size_for_load


def clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def warm_start_fleet(
    cfg: PlannerConfig, profile: EngineProfile, first: Observation, *, ttft_view: TtftView | None = None
) -> tuple[int, int]:
    """The fleet the planner sizes for the first interval's load, within the configured bounds, at least 1 each.

    ttft_view: prefill's single-request TTFT (planner.latency.ttft_view); None: the profile's.
    """
    b = cfg.decision
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        sized = size_for_load(first, cfg, profile, ttft_view=ttft_view)
    if sized is None:
        return b.prefill.min_replicas or 1, b.decode.min_replicas or 1
    # size_for_load keeps each pool within its bounds; a min of 0 (scale to zero) still starts one.
    return max(1, sized["prefill"]), max(1, sized["decode"])
