"""Wake from zero: what still counts when a pool has no replicas, and the scale-up it starts at once.

At zero the planner's usual inputs are silent: no worker reports queue or KV
use, and Dynamo 1.6.1's frontend removes a model whose workers are gone and
answers its requests 404 without counting them in any dynamo_frontend_*
series (measured, docs/scale-to-zero.md). What still counts: requests the
frontend did count (a pool at zero while the other serves), requests queued
at the frontend, and requests held in front of it by the waker (the local
fleet's front door, executor.waker). Any of them at or above
decision.scale_to_zero.wake_min_requests wakes every pool at zero to
wake_replicas, without waiting for the next interval.

Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.config import DecisionConfig
from planner.decision.decide import finish, in_flight_or_current
from planner.decision.scale_to_zero import zero_pools
from planner.types import POOLS, Decision, FleetState, Pool, Reason, ReasonCode, is_number


@dataclass(frozen=True)
class WakeSignal:
    """Whether requests are waiting for a pool at zero, and the numbers behind it.

    at_zero: the pools with no replica set or in flight.
    """

    fire: bool
    at_zero: tuple[Pool, ...]
    message: str
    numbers: dict[str, float] = field(default_factory=dict)


def at_zero(fleet: FleetState, cfg: DecisionConfig) -> tuple[Pool, ...]:
    """Pools allowed to reach zero with no replica set (the pending decision's targets while it is not done)."""
    targets, _ = in_flight_or_current(fleet)
    allowed = zero_pools(allow=cfg.allow_scale_to_zero, min_replicas={p: getattr(cfg, p).min_replicas
                                                                      for p in POOLS})
    return tuple(p for p in allowed if targets[p] == 0)


def wake_signal(*, pools_at_zero: tuple[Pool, ...], waiting_requests: float | None, min_requests: float) -> WakeSignal:
    """The wake's verdict: fire when a pool is at zero and at least min_requests are waiting or were seen.

    waiting_requests: requests held, queued or counted for the model over the watcher's window (the query
        metrics.queries.wake_requests); None or NaN: not known, never fires.
    """
    numbers = {"min_requests": float(min_requests)}
    if is_number(waiting_requests):
        numbers["waiting_requests"] = float(waiting_requests)
    if not pools_at_zero:
        return WakeSignal(False, (), "no pool at zero", numbers)
    names = " and ".join(pools_at_zero)
    if not is_number(waiting_requests):
        return WakeSignal(False, pools_at_zero, f"{names} at zero, waiting requests not known", numbers)
    if waiting_requests < min_requests:
        return WakeSignal(False, pools_at_zero,
                          f"{names} at zero, {waiting_requests:g} requests waiting (< {min_requests:g})", numbers)
    return WakeSignal(True, pools_at_zero,
                      f"{names} at zero with {waiting_requests:g} requests waiting (>= {min_requests:g})", numbers)


def decide_wake(*, fleet: FleetState, cfg: DecisionConfig, signal: WakeSignal) -> Decision:
    """Every pool at zero to decision.scale_to_zero.wake_replicas (within its bounds); the others as set.

    Built on what is set or in flight (a wake still starting is never undone or doubled); no cooldown: the first
    request starts the scale-up. A signal that does not fire, or no pool at zero, changes nothing.
    """
    current = {p: getattr(fleet, p).current_replicas for p in POOLS}
    baseline, _ = in_flight_or_current(fleet)
    targets = dict(baseline)
    reasons: list[Reason] = []
    for pool in signal.at_zero if signal.fire else ():
        if baseline[pool] != 0:
            continue
        to = min(max(cfg.scale_to_zero.wake_replicas, getattr(cfg, pool).min_replicas),
                 getattr(cfg, pool).max_replicas)
        targets[pool] = to
        reasons.append(Reason(ReasonCode.WAKE_FROM_ZERO, pool, f"{pool}: 0 -> {to}: {signal.message}",
                              {**signal.numbers, "to_replicas": float(to)}))
    if not reasons:
        what = signal.message if not signal.fire else "no pool at zero any more"
        reasons.append(Reason(ReasonCode.WAKE_FROM_ZERO, None, f"wake: nothing to do ({what})",
                              dict(signal.numbers)))
    return finish(targets, baseline=baseline, reasons=reasons, recommended=targets, based_on=current)


__all__ = ["WakeSignal", "at_zero", "decide_wake", "wake_signal"]
