"""A pick's outcome: the chosen endpoints with what was predicted for them, or why the request was shed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from routing.features import Role

Tier = Literal["headroom", "thin_headroom", "idle", "critical_negative", "explore", "lowest_latency", "shed"]


@dataclass(frozen=True)
class Choice:
    """One chosen endpoint with what was predicted for it (ms)."""

    endpoint_id: str
    role: Role
    predicted_ttft_ms: float | None
    predicted_tpot_ms: float | None
    headroom_ttft_ms: float | None
    headroom_tpot_ms: float | None
    transfer_cost_ms: float
    shared_level: str | None  # decode stage: narrowest level shared with the prefill endpoint
    features: dict  # raw feature values at pick time (routing.features.RAW_FIELDS + role)


@dataclass(frozen=True)
class PickResult:
    """Where a request goes, or why it was shed.

    Disaggregated: `prefill` and `decode`. Aggregated: `decode` holds the
    aggregated endpoint, `prefill` is None. Shed: both may be None.
    model_version: the published model used (None: profile estimate).
    """

    request_id: str
    outcome: Literal["routed", "shed"]
    mode: Literal["disaggregated", "aggregated"]
    prefill: Choice | None
    decode: Choice | None
    tier: Tier
    reason: str
    topology_fallback: bool
    model_version: str | None
    candidates: int

    @property
    def routed(self) -> bool:
        return self.outcome == "routed"
