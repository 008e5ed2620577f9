"""WVA's saturation analyzer: one model's replicas classified into a scale-up / safe-scale-down signal.

Too little spare capacity on average calls for one more replica; one fewer is
safe only if the same load spread over the remaining replicas still leaves the
spare triggers free (planner.saturation.spare_capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planner.config import SaturationThresholds
from planner.saturation.spare_capacity import (
    MIN_NON_SATURATED_FOR_SCALE_DOWN,
    ReplicaVerdict,
    average_spare,
    classify_replica,
    safe_removals,
    spare_after_removal,
)
from planner.types import PodMetrics

Signal = Literal["scale_up", "scale_down_safe", "steady", "no_data"]


@dataclass(frozen=True)
class VariantAnalysis:
    """Saturation figures for the replicas of one variant."""

    name: str
    reporting_replicas: int  # classified (ok or saturated)
    saturated_count: int
    non_saturated_count: int
    missing_count: int
    avg_spare_kv_frac: float | None
    avg_spare_queue: float | None


@dataclass(frozen=True)
class SaturationAnalysis:
    """Model-level saturation figures across all replicas of all variants.

    avg_spare_kv_frac / avg_spare_queue: over non-saturated replicas; 0 when
        every reporting replica is saturated; None when no replica reports.
    max_safe_removals: how many replicas could go with the remaining
        non-saturated replicas still keeping both spare triggers (0 = unsafe).
    spare_kv_after_removal_frac / spare_queue_after_removal: WVA's numbers for
        removing one replica (load scaled by N/(N-1)); None below 2 replicas.
    """

    thresholds: SaturationThresholds
    replicas: tuple[ReplicaVerdict, ...]
    variants: tuple[VariantAnalysis, ...]
    total_replicas: int
    reporting_replicas: int
    saturated_count: int
    non_saturated_count: int
    missing_count: int
    avg_spare_kv_frac: float | None
    avg_spare_queue: float | None
    should_scale_up: bool
    scale_down_safe: bool
    max_safe_removals: int
    spare_kv_after_removal_frac: float | None
    spare_queue_after_removal: float | None
    signal: Signal
    message: str

    @property
    def numbers(self) -> dict[str, float]:
        """The figures behind the signal, for reasons and artifacts (None dropped)."""
        t = self.thresholds
        raw = {
            "total_replicas": self.total_replicas,
            "reporting_replicas": self.reporting_replicas,
            "saturated_count": self.saturated_count,
            "non_saturated_count": self.non_saturated_count,
            "missing_metrics_count": self.missing_count,
            "avg_spare_kv_frac": self.avg_spare_kv_frac,
            "avg_spare_queue": self.avg_spare_queue,
            "kv_cache_threshold": t.kv_cache_threshold,
            "queue_length_threshold": t.queue_length_threshold,
            "kv_spare_trigger": t.kv_spare_trigger,
            "queue_spare_trigger": t.queue_spare_trigger,
            "spare_kv_after_removal_frac": self.spare_kv_after_removal_frac,
            "spare_queue_after_removal": self.spare_queue_after_removal,
            "max_safe_removals": self.max_safe_removals,
        }
        return {k: float(v) for k, v in raw.items() if v is not None}

    def variant(self, name: str) -> VariantAnalysis | None:
        return next((v for v in self.variants if v.name == name), None)


def _variant_analyses(verdicts: Sequence[ReplicaVerdict]) -> tuple[VariantAnalysis, ...]:
    out = []
    for name in sorted({v.variant for v in verdicts}):
        mine = [v for v in verdicts if v.variant == name]
        kv, queue = average_spare(mine)
        out.append(
            VariantAnalysis(
                name=name,
                reporting_replicas=sum(v.state != "missing" for v in mine),
                saturated_count=sum(v.state == "saturated" for v in mine),
                non_saturated_count=sum(v.state == "ok" for v in mine),
                missing_count=sum(v.state == "missing" for v in mine),
                avg_spare_kv_frac=kv,
                avg_spare_queue=queue,
            )
        )
    return tuple(out)


def analyze_saturation(*, pods: Sequence[PodMetrics], thresholds: SaturationThresholds) -> SaturationAnalysis:
    """Classify every replica of a model and derive the scale-up / safe-scale-down signals.

    pods: every replica of the model, across its variants, with its metrics
        (kv_usage_frac 0..1, queue_length in requests); duplicate pod names are
        an error.
    """
    names = [p.pod for p in pods]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"saturation: pod names must be unique, repeated: {dup}")
    t = thresholds
    verdicts = tuple(classify_replica(p, t) for p in pods)
    saturated = sum(v.state == "saturated" for v in verdicts)
    ok = sum(v.state == "ok" for v in verdicts)
    missing = sum(v.state == "missing" for v in verdicts)
    avg_kv, avg_queue = average_spare(verdicts)

    after_kv = after_queue = None
    removals = 0
    if avg_kv is None:
        should_up, safe_down, signal = False, False, "no_data"
        message = f"no replica reports metrics ({missing} of {len(verdicts)} missing)"
    else:
        should_up = avg_kv < t.kv_spare_trigger or avg_queue < t.queue_spare_trigger
        if ok >= MIN_NON_SATURATED_FOR_SCALE_DOWN:
            after_kv, after_queue = spare_after_removal(
                avg_spare_kv_frac=avg_kv, avg_spare_queue=avg_queue, non_saturated=ok, removed=1, thresholds=t
            )
        # Unknown load on a missing replica could be anything: no removal is safe then.
        if not should_up and missing == 0:
            removals = safe_removals(
                avg_spare_kv_frac=avg_kv, avg_spare_queue=avg_queue, non_saturated=ok, thresholds=t
            )
        safe_down = removals > 0
        spare = (
            f"avg spare KV {avg_kv:.3f} (trigger {t.kv_spare_trigger}), "
            f"avg spare queue {avg_queue:.2f} (trigger {t.queue_spare_trigger}) "
            f"over {ok} non-saturated of {len(verdicts)} ({saturated} saturated, {missing} missing)"
        )
        if should_up:
            signal, message = "scale_up", f"scale up: {spare}"
        elif safe_down:
            signal = "scale_down_safe"
            message = (
                f"scale-down safe: {spare}; one fewer leaves spare KV {after_kv:.3f}, queue {after_queue:.2f}; "
                f"up to {removals} could go"
            )
        else:
            signal = "steady"
            if missing:
                why = f"{missing} replica(s) without metrics"
            elif ok < MIN_NON_SATURATED_FOR_SCALE_DOWN:
                why = f"only {ok} non-saturated replica(s), need {MIN_NON_SATURATED_FOR_SCALE_DOWN}"
            else:
                why = f"one fewer would leave spare KV {after_kv:.3f}, queue {after_queue:.2f}"
            message = f"no action, scale-down unsafe ({why}): {spare}"
    return SaturationAnalysis(
        thresholds=t,
        replicas=verdicts,
        variants=_variant_analyses(verdicts),
        total_replicas=len(verdicts),
        reporting_replicas=ok + saturated,
        saturated_count=saturated,
        non_saturated_count=ok,
        missing_count=missing,
        avg_spare_kv_frac=avg_kv,
        avg_spare_queue=avg_queue,
        should_scale_up=should_up,
        scale_down_safe=safe_down,
        max_safe_removals=removals,
        spare_kv_after_removal_frac=after_kv,
        spare_queue_after_removal=after_queue,
        signal=signal,
        message=message,
    )



__all__ = ["SaturationAnalysis", "VariantAnalysis", "analyze_saturation"]
