"""Spare capacity of saturation-checked replicas, as llm-d's WVA computes it.

A replica is saturated when its KV-cache usage or its queue reaches a
threshold. Spare capacity (threshold - usage) is averaged over the replicas
that are not saturated; removing replicas spreads the same load over the rest
(N/(N - removed)). A replica whose metrics are missing is never spare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planner.config import SaturationThresholds
from planner.types import PodMetrics, is_number

ReplicaState = Literal["ok", "saturated", "missing"]

MIN_NON_SATURATED_FOR_SCALE_DOWN = 2
# Averages are rounded before they meet a trigger, so hand arithmetic holds at
# the boundary (0.8 - 0.7 is 0.1, not 0.10000000000000009); metrics carry
# nowhere near nine decimals of precision.
_DECIMALS = 9


@dataclass(frozen=True)
class ReplicaVerdict:
    """One replica's classification and its spare capacity (None unless "ok")."""

    pod: str
    variant: str
    state: ReplicaState
    kv_usage_frac: float | None
    queue_length: float | None
    spare_kv_frac: float | None = None
    spare_queue: float | None = None


def _finite(x: float | None) -> float | None:
    return float(x) if is_number(x) else None


def classify_replica(pod: PodMetrics, thresholds: SaturationThresholds) -> ReplicaVerdict:
    """Saturated if KV usage >= kv threshold or queue >= queue threshold.

    A replica with a metric missing (None/NaN/inf) is "missing" unless the
    other metric alone already marks it saturated. Negative values or a KV
    usage above 1 (a percentage passed as a fraction?) are errors.
    """
    kv = _finite(pod.kv_usage_frac)
    queue = _finite(pod.queue_length)
    if kv is not None and not 0.0 <= kv <= 1.0:
        raise ValueError(f"pod {pod.pod!r}: kv_usage_frac must be a fraction in 0..1, got {kv}")
    if queue is not None and queue < 0:
        raise ValueError(f"pod {pod.pod!r}: queue_length must be >= 0, got {queue}")
    kv_saturated = kv is not None and kv >= thresholds.kv_cache_threshold
    queue_saturated = queue is not None and queue >= thresholds.queue_length_threshold
    common = dict(pod=pod.pod, variant=pod.variant, kv_usage_frac=kv, queue_length=queue)
    if kv_saturated or queue_saturated:
        return ReplicaVerdict(state="saturated", **common)
    if kv is None or queue is None:
        return ReplicaVerdict(state="missing", **common)
    return ReplicaVerdict(
        state="ok",
        spare_kv_frac=thresholds.kv_cache_threshold - kv,
        spare_queue=thresholds.queue_length_threshold - queue,
        **common,
    )


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), _DECIMALS)


def average_spare(verdicts: Sequence[ReplicaVerdict]) -> tuple[float | None, float | None]:
    """Mean spare KV and queue over "ok" replicas; 0 if all reporting are saturated."""
    ok = [v for v in verdicts if v.state == "ok"]
    if ok:
        return _mean([v.spare_kv_frac for v in ok]), _mean([v.spare_queue for v in ok])
    if any(v.state == "saturated" for v in verdicts):
        return 0.0, 0.0
    return None, None


def spare_after_removal(
    *, avg_spare_kv_frac: float, avg_spare_queue: float, non_saturated: int, removed: int,
    thresholds: SaturationThresholds,
) -> tuple[float, float]:
    """Spare KV and queue left if `removed` of `non_saturated` replicas go.

    The non-saturated load (threshold - average spare) is spread over the
    remaining replicas: scaled by N/(N - removed).
    """
    if not 0 < removed < non_saturated:
        raise ValueError(f"removed must be in 1..{non_saturated - 1}, got {removed}")
    scale = non_saturated / (non_saturated - removed)
    kv_load = thresholds.kv_cache_threshold - avg_spare_kv_frac
    queue_load = thresholds.queue_length_threshold - avg_spare_queue
    return (
        round(thresholds.kv_cache_threshold - kv_load * scale, _DECIMALS),
        round(thresholds.queue_length_threshold - queue_load * scale, _DECIMALS),
    )


def safe_removals(
    *, avg_spare_kv_frac: float, avg_spare_queue: float, non_saturated: int, thresholds: SaturationThresholds
) -> int:
    """Largest r such that removing r replicas keeps spare >= both triggers (0: none)."""
    if non_saturated < MIN_NON_SATURATED_FOR_SCALE_DOWN:
        return 0
    best = 0
    for removed in range(1, non_saturated):
        kv, queue = spare_after_removal(
            avg_spare_kv_frac=avg_spare_kv_frac, avg_spare_queue=avg_spare_queue,
            non_saturated=non_saturated, removed=removed, thresholds=thresholds,
        )
        if kv < thresholds.kv_spare_trigger or queue < thresholds.queue_spare_trigger:
            break  # spare only shrinks as more replicas go
        best = removed
    return best



__all__ = [
    "MIN_NON_SATURATED_FOR_SCALE_DOWN",
    "ReplicaVerdict",
    "average_spare",
    "classify_replica",
    "safe_removals",
    "spare_after_removal",
]
