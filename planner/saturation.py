"""Saturation guardrail: per-replica KV-cache and queue headroom, as llm-d's WVA analyzer.

A replica is saturated when its KV-cache usage or its queue reaches a
threshold. Spare capacity (threshold - usage) is averaged over the replicas
that are not saturated; too little spare on average calls for one more
replica, and one fewer is safe only if the same load spread over the
remaining replicas still leaves the spare triggers free.

A model has variants (the same model on different accelerators or configs),
each with a cost. With the model stable, a scale-up goes to the cheapest
variant without pending pods and a scale-down to the most expensive one that
keeps a replica; while any variant is mid-transition (a previous target not
reached, or pods not all reporting metrics) no new decision is made.

Departures from WVA, all toward keeping capacity:
- a replica whose metrics are missing (None, NaN, inf) is never counted as
  spare capacity; it is "missing", which also puts the model in transition;
- a replica with one metric past its threshold is saturated even if the
  other metric is missing;
- a scale-up skips variants already at their max (WVA picks them, then clamps
  the +1 away);
- `max_safe_removals` extends WVA's one-replica N/(N-1) check to "how many
  replicas could go": the decision step may shrink by that many at most.

In the prefill/decode planner each pool is analysed as its own model
(`analyze_pool`, `analyze_fleet`), usually with a single variant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from planner.config import DecisionConfig, SaturationConfig, SaturationThresholds
from planner.types import POOLS, FleetState, Observation, PodMetrics, Pool, PoolState, is_number

ReplicaState = Literal["ok", "saturated", "missing"]
Signal = Literal["scale_up", "scale_down_safe", "steady", "no_data"]
VariantAction = Literal["scale_up", "scale_down", "no_change", "preserved"]
PoolSignal = Literal["scale_up", "scale_down_safe", "steady", "no_data", "transition"]

MIN_NON_SATURATED_FOR_SCALE_DOWN = 2
# Averages are rounded before they meet a trigger, so hand arithmetic holds at
# the boundary (0.8 - 0.7 is 0.1, not 0.10000000000000009); metrics carry
# nowhere near nine decimals of precision.
_DECIMALS = 9
DEFAULT_VARIANT_COST = 10.0


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


@dataclass(frozen=True)
class VariantState:
    """One variant's replica counts, as the connector reports them.

    cost: cost per replica (any unit, compared between variants).
    desired_replicas: the target a previous run set and the environment has
        not reached yet; None or 0 means no target in flight (WVA convention).
    pending_replicas: pods that exist but are not ready yet.
    """

    name: str
    current_replicas: int
    cost: float = DEFAULT_VARIANT_COST
    desired_replicas: int | None = None
    pending_replicas: int = 0
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        for name in ("current_replicas", "pending_replicas", "min_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"variant {self.name!r}: {name} must be an integer >= 0, got {value!r}")
        if self.desired_replicas is not None and self.desired_replicas < 0:
            raise ValueError(
                f"variant {self.name!r}: desired_replicas must be >= 0 or None, got {self.desired_replicas}"
            )
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"variant {self.name!r}: max_replicas {self.max_replicas} < min_replicas {self.min_replicas}"
            )
        if not is_number(self.cost) or self.cost < 0:
            raise ValueError(f"variant {self.name!r}: cost must be a finite number >= 0, got {self.cost!r}")

    @property
    def has_target_in_flight(self) -> bool:
        return self.desired_replicas not in (None, 0) and self.desired_replicas != self.current_replicas

    def clamp(self, replicas: int) -> int:
        upper = replicas if self.max_replicas is None else min(replicas, self.max_replicas)
        return max(self.min_replicas, upper)


@dataclass(frozen=True)
class VariantTarget:
    """The guardrail's target for one variant and why."""

    name: str
    current_replicas: int
    target_replicas: int
    action: VariantAction
    reason: str


@dataclass(frozen=True)
class ModelSaturation:
    """Analysis plus per-variant targets for one model."""

    analysis: SaturationAnalysis
    in_transition: bool
    transition_reasons: tuple[str, ...]
    targets: tuple[VariantTarget, ...]

    @property
    def total_current(self) -> int:
        return sum(t.current_replicas for t in self.targets)

    @property
    def total_target(self) -> int:
        return sum(t.target_replicas for t in self.targets)

    def target(self, name: str) -> VariantTarget:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(f"no variant {name!r}; have {[t.name for t in self.targets]}")


@dataclass(frozen=True)
class PoolSaturation:
    """The guardrail's verdict on one pool, as the decision step uses it.

    target_replicas: WVA's own one-step target for the pool (sum over variants).
    floor_replicas: the fewest replicas the guardrail accepts this interval: above
        current when it wants a scale-up, current when it vetoes any scale-down,
        current - max_safe_removals when shrinking is safe, the preserved
        targets while in transition.
    """

    pool: Pool
    signal: PoolSignal
    current_replicas: int
    target_replicas: int
    floor_replicas: int
    model: ModelSaturation
    message: str
    numbers: dict[str, float] = field(default_factory=dict)


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


def _average_spare(verdicts: Sequence[ReplicaVerdict]) -> tuple[float | None, float | None]:
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


def _safe_removals(
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


def _variant_analyses(verdicts: Sequence[ReplicaVerdict]) -> tuple[VariantAnalysis, ...]:
    out = []
    for name in sorted({v.variant for v in verdicts}):
        mine = [v for v in verdicts if v.variant == name]
        kv, queue = _average_spare(mine)
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
    avg_kv, avg_queue = _average_spare(verdicts)

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
            removals = _safe_removals(
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


def transition_reasons(analysis: SaturationAnalysis, variants: Sequence[VariantState]) -> tuple[str, ...]:
    """Why the model is mid-transition (empty: stable).

    A variant is transitioning if a previous target is still in flight
    (desired not 0/None and != current) or its reporting replicas != current.
    """
    reasons = []
    for v in variants:
        if v.has_target_in_flight:
            reasons.append(f"variant {v.name}: desired {v.desired_replicas} != current {v.current_replicas}")
        va = analysis.variant(v.name)
        reporting = va.reporting_replicas if va else 0
        if reporting != v.current_replicas:
            reasons.append(f"variant {v.name}: {reporting} of {v.current_replicas} replicas report metrics")
    return tuple(reasons)


def _cost_order(v: VariantState) -> tuple[float, str]:
    return (v.cost, v.name)


def saturation_targets(*, analysis: SaturationAnalysis, variants: Sequence[VariantState]) -> ModelSaturation:
    """Per-variant targets: preserve while in transition, else cost-aware +1 / -1, clamped.

    Scale-up: +1 on the cheapest variant without pending pods and below its max
    (ties: alphabetically first). Scale-down (when safe): -1 on the most
    expensive variant whose target stays >= max(1, min) (ties: alphabetically
    last). Targets start from the replicas reporting metrics, which equal
    current when the model is stable.
    """
    if not variants:
        raise ValueError("saturation: a model needs at least one variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"saturation: variant names must be unique, got {names}")
    unknown = sorted({r.variant for r in analysis.replicas} - set(names))
    if unknown:
        pods = [r.pod for r in analysis.replicas if r.variant in unknown]
        raise ValueError(f"saturation: pods {pods} belong to unknown variant(s) {unknown}; known: {sorted(names)}")

    blocked = transition_reasons(analysis, variants)
    if blocked:
        targets = []
        for v in variants:
            if v.has_target_in_flight:
                targets.append(VariantTarget(v.name, v.current_replicas, v.desired_replicas, "preserved",
                                             "model in transition: desired target preserved"))
            else:
                targets.append(VariantTarget(v.name, v.current_replicas, v.current_replicas, "preserved",
                                             "model in transition: current replicas preserved"))
        return ModelSaturation(analysis, True, blocked, tuple(targets))

    ready = {v.name: v.current_replicas for v in variants}
    chosen: str | None = None
    action: VariantAction = "no_change"
    note = analysis.message
    if analysis.should_scale_up:
        eligible = [
            v for v in variants
            if v.pending_replicas == 0 and (v.max_replicas is None or ready[v.name] + 1 <= v.max_replicas)
        ]
        if eligible:
            chosen, action = min(eligible, key=_cost_order).name, "scale_up"
            ready[chosen] += 1
        else:
            note = f"{analysis.message}; no eligible variant (all pending or at max)"
    elif analysis.scale_down_safe:
        eligible = [v for v in variants if ready[v.name] - 1 >= max(1, v.min_replicas)]
        if eligible:
            chosen, action = max(eligible, key=_cost_order).name, "scale_down"
            ready[chosen] -= 1
        else:
            note = f"{analysis.message}; no variant above its minimum"

    targets = []
    for v in variants:
        target = v.clamp(ready[v.name])
        if v.name == chosen:
            what = "cheapest eligible" if action == "scale_up" else "most expensive eligible"
            reason = f"{what} variant (cost {v.cost:g}): {note}"
            targets.append(VariantTarget(v.name, v.current_replicas, target, action, reason))
        else:
            targets.append(VariantTarget(v.name, v.current_replicas, target, "no_change", note))
    return ModelSaturation(analysis, False, (), tuple(targets))


def analyze_model(
    *, pods: Sequence[PodMetrics], variants: Sequence[VariantState], thresholds: SaturationThresholds
) -> ModelSaturation:
    """The general multi-variant guardrail: analysis then per-variant targets."""
    return saturation_targets(analysis=analyze_saturation(pods=pods, thresholds=thresholds), variants=variants)


def analyze_pool(
    *,
    pool: Pool,
    pods: Sequence[PodMetrics],
    state: PoolState,
    thresholds: SaturationThresholds,
    desired_replicas: int | None = None,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    variants: Sequence[VariantState] | None = None,
) -> PoolSaturation:
    """Analyse one prefill or decode pool as its own model.

    pods: the pool's replicas (others are ignored, so the whole observation can
        be passed). Without `variants` the pool is one variant (named after
        its pods' variant label) built from `state`: pending = current - ready.
    desired_replicas: the pool target a previous decision set and has not
        reached (None when none is in flight).
    """
    mine = [p for p in pods if p.pool == pool]
    current = state.current_replicas
    if variants is None:
        labels = sorted({p.variant for p in mine}) or ["default"]
        if len(labels) > 1:
            raise ValueError(
                f"saturation: pool {pool} has pods of variants {labels}; pass `variants` with their counts"
            )
        variants = [
            VariantState(
                name=labels[0],
                current_replicas=current,
                desired_replicas=desired_replicas,
                pending_replicas=max(0, current - state.ready_replicas),
                min_replicas=min_replicas,
                max_replicas=max_replicas,
            )
        ]
    elif sum(v.current_replicas for v in variants) != current:
        raise ValueError(
            f"saturation: pool {pool} variants sum to {sum(v.current_replicas for v in variants)} replicas, "
            f"pool state says {current}"
        )
    model = analyze_model(pods=mine, variants=variants, thresholds=thresholds)
    a = model.analysis
    target = model.total_target
    if model.in_transition:
        signal: PoolSignal = "transition"
        floor = target
        message = "in transition, targets preserved: " + "; ".join(model.transition_reasons)
    elif a.signal == "no_data":
        signal, floor, message = "no_data", current, f"{a.message}: no scale-down"
    elif a.signal == "scale_up":
        signal, floor, message = "scale_up", max(current, target), a.message
    elif a.signal == "scale_down_safe":
        lowest = sum(max(1, v.min_replicas) for v in variants)
        signal, floor, message = "scale_down_safe", max(lowest, current - a.max_safe_removals), a.message
        floor = min(floor, current)
    else:
        signal, floor, message = "steady", current, a.message
    numbers = dict(a.numbers)
    numbers.update(current_replicas=current, target_replicas=target, floor_replicas=floor)
    return PoolSaturation(
        pool=pool,
        signal=signal,
        current_replicas=current,
        target_replicas=target,
        floor_replicas=floor,
        model=model,
        message=f"{pool}: {message}",
        numbers={k: float(v) for k, v in numbers.items()},
    )


def desired_in_flight(*, fleet: FleetState, pool: Pool, now_s: float, wait_for_previous_s: float) -> int | None:
    """The previous decision's target for `pool` while it is not done and not timed out, else None.

    now_s: the run's clock, seconds; wait_for_previous_s: how long a target
    counts as in flight, seconds.
    """
    last = fleet.last_decision
    if last is None or last.done or now_s - last.decided_at_s >= wait_for_previous_s:
        return None
    return last.prefill_replicas if pool == "prefill" else last.decode_replicas


def analyze_fleet(
    *,
    obs: Observation,
    fleet: FleetState,
    saturation_cfg: SaturationConfig,
    decision_cfg: DecisionConfig,
    model_id: str,
    namespace: str,
    now_s: float,
    variants: Mapping[Pool, Sequence[VariantState]] | None = None,
) -> dict[Pool, PoolSaturation] | None:
    """Both pools' guardrail verdicts for `decide`; None when the guardrail is disabled.

    Thresholds come from the 'modelID#namespace' override or the default.
    """
    if not saturation_cfg.enabled:
        return None
    thresholds = saturation_cfg.for_model(model_id, namespace)
    out: dict[Pool, PoolSaturation] = {}
    for pool in POOLS:
        bounds = getattr(decision_cfg, pool)
        out[pool] = analyze_pool(
            pool=pool,
            pods=obs.pods,
            state=getattr(fleet, pool),
            thresholds=thresholds,
            desired_replicas=desired_in_flight(
                fleet=fleet, pool=pool, now_s=now_s, wait_for_previous_s=decision_cfg.wait_for_previous_s
            ),
            min_replicas=bounds.min_replicas,
            max_replicas=bounds.max_replicas,
            variants=None if variants is None else variants.get(pool),
        )
    return out


__all__ = [
    "ModelSaturation",
    "PoolSaturation",
    "ReplicaVerdict",
    "SaturationAnalysis",
    "VariantAnalysis",
    "VariantState",
    "VariantTarget",
    "analyze_fleet",
    "analyze_model",
    "analyze_pool",
    "analyze_saturation",
    "classify_replica",
    "desired_in_flight",
    "saturation_targets",
    "spare_after_removal",
    "transition_reasons",
]
