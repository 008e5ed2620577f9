"""The fleet a dynamic policy starts from: what the planner sizes for the first interval's load."""

from __future__ import annotations

import warnings

from planner.config import PlannerConfig
from planner.pipeline import plan_interval
from planner.profile import EngineProfile
from planner.profile_checks import ProfileRangeWarning
from planner.ttft_view import TtftView
from planner.types import FleetState, Observation, PoolState


def clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def warm_start_fleet(
    cfg: PlannerConfig, profile: EngineProfile, first: Observation, *, ttft_view: TtftView | None = None
) -> tuple[int, int]:
    """The fleet the planner sizes for the first interval's load, within the configured bounds.

    ttft_view: prefill's single-request TTFT (planner.ttft_view); None: the profile's.
    """
    fleet = FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1))
    if first.num_requests is None or first.avg_isl_tokens is None or first.avg_osl_tokens is None:
        return cfg.decision.prefill.min_replicas or 1, cfg.decision.decode.min_replicas or 1
    warm = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"name": "constant"})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        plan = plan_interval(first, fleet, warm, profile, now_s=first.taken_at_s, ttft_view=ttft_view)
    b = cfg.decision
    return (
        clamp(max(1, plan.sizing["prefill"].replicas), max(1, b.prefill.min_replicas), b.prefill.max_replicas),
        clamp(max(1, plan.sizing["decode"].replicas), max(1, b.decode.min_replicas), b.decode.max_replicas),
    )
