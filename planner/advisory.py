"""Advisory mode's core: what a recommend-only planner would have set against what the running autoscaler set.

A recommend-only run decides from the fleet the running autoscaler keeps (`advisory_fleet`), then compares.

Both sides are replica histories, rows (t_s, prefill, decode) oldest first, a pool's value None where
it is unknown. A row holds from its t_s until the next row, for at most `step_s` (a gap in a history
is unknown, not the last value carried on). The comparison samples both on the run's grid, one point
per adjustment interval ending at now_s, and counts only the intervals where both sides are known:
GPU-hours each (replicas x GPUs per replica x interval), and in how many intervals the advisory had
more GPUs, fewer, or as many.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.types import POOLS, Decision, FleetState, Pool

ReplicaRow = tuple[float, "int | None", "int | None"]
# Prometheus stamps range-query points to the millisecond; a row this close after a grid point counts at it.
_STAMP_SLACK_S = 1e-3


@dataclass(frozen=True)
class PoolComparison:
    """One pool over the window: GPU-hours each side held, and the intervals each was above."""

    advisory_gpu_hours: float
    autoscaler_gpu_hours: float
    more_intervals: int
    fewer_intervals: int
    same_intervals: int


@dataclass(frozen=True)
class AdvisoryComparison:
    """This run's targets against the autoscaler's replicas now, and both histories over the window.

    now_difference: per pool, advisory target - autoscaler replicas at now_s (None: a side unknown).
    intervals: grid points where both sides are known in both pools (the window's total counts them).
    more/fewer/same_intervals: of those, intervals where the advisory's GPUs (both pools) were above,
    below, equal to the autoscaler's.
    """

    window_s: float
    step_s: float
    advisory_now: Mapping[Pool, int | None]
    autoscaler_now: Mapping[Pool, int | None]
    now_difference: Mapping[Pool, int | None]
    pools: Mapping[Pool, PoolComparison]
    intervals: int
    advisory_gpu_hours: float
    autoscaler_gpu_hours: float
    more_intervals: int
    fewer_intervals: int
    same_intervals: int


def value_at(rows: Sequence[ReplicaRow], t_s: float, *, pool: Pool, max_age_s: float) -> int | None:
    """The pool's replicas in effect at t_s (seconds): the newest row at or before it, if younger than max_age_s.

    rows: oldest first.
    """
    at = bisect.bisect_right(rows, t_s + _STAMP_SLACK_S, key=lambda row: row[0])
    if at == 0 or t_s - rows[at - 1][0] >= max_age_s:
        return None
    return rows[at - 1][POOLS.index(pool) + 1]


def compare(
    advisory: Sequence[ReplicaRow], autoscaler: Sequence[ReplicaRow], *, now_s: float, window_s: float,
    step_s: float, gpus_per_replica: Mapping[Pool, int],
) -> AdvisoryComparison:
    """Compare the advisory's history with the autoscaler's over the window_s (seconds) ending at now_s.

    Both histories end with their value at now_s (this run's targets; the replicas the connector reads).
    step_s: the adjustment interval, s; each grid point stands for one interval. gpus_per_replica: per pool.
    """
    if step_s <= 0 or window_s < step_s:
        raise ValueError(f"advisory comparison: need 0 < step_s <= window_s, got step {step_s} s, window {window_s} s")
    advisory, autoscaler = sorted(advisory, key=_time), sorted(autoscaler, key=_time)
    grid = comparison_grid(now_s=now_s, window_s=window_s, step_s=step_s)
    hours = step_s / 3600.0
    gpu = {"advisory": dict.fromkeys(POOLS, 0.0), "autoscaler": dict.fromkeys(POOLS, 0.0)}
    per_pool = {p: [0, 0, 0] for p in POOLS}
    total = [0, 0, 0]
    intervals = 0
    for t in grid:
        ours = {p: value_at(advisory, t, pool=p, max_age_s=step_s) for p in POOLS}
        theirs = {p: value_at(autoscaler, t, pool=p, max_age_s=step_s) for p in POOLS}
        if any(v is None for v in (*ours.values(), *theirs.values())):
            continue
        intervals += 1
        for p in POOLS:
            gpu["advisory"][p] += ours[p] * gpus_per_replica[p] * hours
            gpu["autoscaler"][p] += theirs[p] * gpus_per_replica[p] * hours
            per_pool[p][_side(ours[p], theirs[p])] += 1
        total[_side(sum(ours[p] * gpus_per_replica[p] for p in POOLS),
                    sum(theirs[p] * gpus_per_replica[p] for p in POOLS))] += 1
    now_ours = {p: value_at(advisory, now_s, pool=p, max_age_s=step_s) for p in POOLS}
    now_theirs = {p: value_at(autoscaler, now_s, pool=p, max_age_s=step_s) for p in POOLS}
    return AdvisoryComparison(
        window_s=window_s, step_s=step_s, advisory_now=now_ours, autoscaler_now=now_theirs,
        now_difference={p: None if now_ours[p] is None or now_theirs[p] is None else now_ours[p] - now_theirs[p]
                        for p in POOLS},
        pools={p: PoolComparison(gpu["advisory"][p], gpu["autoscaler"][p], *per_pool[p]) for p in POOLS},
        intervals=intervals,
        advisory_gpu_hours=sum(gpu["advisory"].values()),
        autoscaler_gpu_hours=sum(gpu["autoscaler"].values()),
        more_intervals=total[0], fewer_intervals=total[1], same_intervals=total[2],
    )


def comparison_grid(*, now_s: float, window_s: float, step_s: float) -> list[float]:
    """The comparison's points, oldest first: one per step_s over window_s ending at now_s (seconds)."""
    return [now_s - k * step_s for k in range(int(window_s // step_s))][::-1]


def _side(ours: float, theirs: float) -> int:
    """0: the advisory above, 1: below, 2: equal."""
    return 0 if ours > theirs else 1 if ours < theirs else 2


def changes(rows: Sequence[ReplicaRow]) -> tuple[tuple[float, int, int], ...]:
    """The rows where the replicas changed, both pools known (FleetState.applied_targets' form), oldest first."""
    out: list[tuple[float, int, int]] = []
    for t, prefill, decode in sorted(rows, key=_time):
        if prefill is None or decode is None:
            continue
        if not out or (out[-1][1], out[-1][2]) != (prefill, decode):
            out.append((t, prefill, decode))
    return tuple(out)


def _time(row: ReplicaRow) -> float:
    return row[0]


def advisory_fleet(fleet: FleetState, *, autoscaler: Sequence[ReplicaRow],
                   recommended: Sequence[ReplicaRow]) -> FleetState:
    """The fleet a recommend-only run decides from: the replicas as the running autoscaler set them, the
    advisory's own recommendations as the stabilization history, the autoscaler's changes as the applied
    targets (the replicas that served; the chart's actual line) and no last decision of ours to wait for.

    recommended: the advisory's recommendations, rows with a pool unknown are left out.
    """
    return dataclasses.replace(
        fleet, last_decision=None, applied_targets=changes(autoscaler),
        recent_targets=tuple((t, p, d) for t, p, d in sorted(recommended, key=_time) if p is not None and d is not None),
    )


def compare_run(
    decision: Decision, fleet: FleetState, *, advisory: Sequence[ReplicaRow], autoscaler: Sequence[ReplicaRow],
    now_s: float, window_s: float, step_s: float,
) -> AdvisoryComparison:
    """`compare` for one run: the advisory's history ending with this decision's targets, the autoscaler's
    ending with the replicas the fleet has now (both at now_s, seconds); GPUs per replica from the fleet."""
    return compare(
        (*advisory, advisory_targets(decision, now_s=now_s)),
        (*autoscaler, (now_s, fleet.prefill.current_replicas, fleet.decode.current_replicas)),
        now_s=now_s, window_s=window_s, step_s=step_s,
        gpus_per_replica={p: getattr(fleet, p).gpus_per_replica for p in POOLS},
    )


def advisory_targets(decision: Decision, *, now_s: float) -> ReplicaRow:
    """This run's row of the advisory's history: its targets at now_s (seconds)."""
    return now_s, decision.prefill_replicas, decision.decode_replicas
