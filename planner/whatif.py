"""The what-if: what a "what would the planner do if..." run changes (load, SLA targets).

One type for every what-if: the planner flow takes it as its `what_if` parameter
(nothing is applied), `plan_interval` applies it to the interval's inputs, and
the simulator's what-if scenario extends it with the trace, profile and policy
it is asked of.
"""

from __future__ import annotations

import dataclasses

from pydantic import Field

from planner.config import PlannerConfig, SloTarget
from planner.strict import StrictModel
from planner.types import Observation


class WhatIf(StrictModel):
    """A manual "what would the planner do if..." run: nothing is applied."""

    load_multiplier: float = Field(1.0, gt=0, le=1000, description="scale observed load by this factor")
    ttft_ms: float | None = Field(None, gt=0, description="TTFT target to plan for instead of the configured one, ms")
    itl_ms: float | None = Field(None, gt=0, description="ITL target to plan for instead of the configured one, ms")

    def slo(self, base: SloTarget) -> SloTarget | None:
        """The SLA targets to plan for: base with the targets given here; None when none is given."""
        if self.ttft_ms is None and self.itl_ms is None:
            return None
        return SloTarget(
            ttft_ms=self.ttft_ms if self.ttft_ms is not None else base.ttft_ms,
            itl_ms=self.itl_ms if self.itl_ms is not None else base.itl_ms,
        )


def apply_what_if(obs: Observation, what_if: WhatIf | None) -> Observation:
    """Scale the observed load by the what-if multiplier (latencies stay as observed)."""
    if what_if is None or what_if.load_multiplier == 1.0:
        return obs
    k = what_if.load_multiplier
    history = obs.history
    if history is not None:
        history = dataclasses.replace(
            history,
            num_requests=tuple(n * k for n in history.num_requests),
            # peaks scale with the load, so the burst ratio stays as observed
            peak_rps=None if history.peak_rps is None else tuple(p * k for p in history.peak_rps),
        )
    return dataclasses.replace(
        obs,
        num_requests=None if obs.num_requests is None else obs.num_requests * k,
        peak_rps=None if obs.peak_rps is None else obs.peak_rps * k,
        history=history,
    )


def effective_config(cfg: PlannerConfig, what_if: WhatIf | None) -> PlannerConfig:
    """The configuration a run uses after what-if overrides."""
    slo = None if what_if is None else what_if.slo(cfg.slo)
    if slo is None:
        return cfg
    return cfg.model_copy(update={"slo": slo})
