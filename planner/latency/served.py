"""The replicas that served an interval: time-weighted ready replicas, rebuilt from the applied decisions.

The correction step compares the interval's latency with what its load predicts on the replicas that
carried it. The fleet a run reads is the fleet at the interval's end: a scale-up applied one run ago
counts replicas that turn ready only as the interval they were meant for ends, and dividing the
interval's load by them reads its queueing as slow engines (every scale-up inflates the next
correction). So the step asks, for each moment of the interval, how many replicas were ready.

Stateless: the answer is rebuilt each run from the applied decisions the connector keeps
(FleetState.applied_targets: (t_s, prefill, decode), oldest first). A pool's target at time t is the
latest decision at or before t; a replica added at t_a serves from t_a + startup_s, a removed one
stops at once, so the replicas ready at t are min(target(t), target(t - startup_s)). Before the oldest
decision the fleet is taken to have held that decision's targets (nothing older is known).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from planner.types import POOLS, FleetState, Pool


def ready_at(applied: Sequence[tuple[float, int, int]], pool: Pool, t_s: float, *, startup_s: float) -> int:
    """Replicas of `pool` ready at t_s (s), by the applied decisions (oldest first) and the startup delay (s)."""
    return min(_target_at(applied, pool, t_s), _target_at(applied, pool, t_s - startup_s))


def served_replicas(
    applied: Sequence[tuple[float, int, int]], pool: Pool, *, start_s: float, end_s: float, startup_s: float,
) -> float | None:
    """Time-weighted mean of the replicas of `pool` ready over [start_s, end_s], s; None without decisions.

    applied: (t_s, prefill, decode) of the applied decisions, oldest first (FleetState.applied_targets).
    startup_s: time from adding a replica to it serving, s (sizing.replica_startup_s).
    """
    if pool not in POOLS:
        raise ValueError(f"served_replicas: pool must be one of {', '.join(POOLS)}, got {pool!r}")
    if not end_s > start_s:
        raise ValueError(f"served_replicas: need start_s < end_s, got {start_s:g} .. {end_s:g}")
    if startup_s < 0:
        raise ValueError(f"served_replicas: startup_s must be >= 0, got {startup_s:g}")
    if not applied:
        return None
    times = [t for t, _, _ in applied]
    if times != sorted(times):
        raise ValueError("served_replicas: applied decisions must be oldest first")
    # The count changes only at a decision or a decision + startup_s: constant between those moments.
    cuts = sorted({start_s, end_s, *(t for t in times if start_s < t < end_s),
                   *(t + startup_s for t in times if start_s < t + startup_s < end_s)})
    total = sum((b - a) * ready_at(applied, pool, a, startup_s=startup_s) for a, b in zip(cuts, cuts[1:]))
    return total / (end_s - start_s)


def _target_at(applied: Sequence[tuple[float, int, int]], pool: Pool, t_s: float) -> int:
    """The pool's target of the latest decision at or before t_s; the oldest decision's before it."""
    i = bisect.bisect_right(applied, t_s, key=lambda e: e[0]) - 1
    entry = applied[max(i, 0)]
    return entry[1] if pool == "prefill" else entry[2]


def interval_replicas(
    fleet: FleetState, *, end_s: float, interval_s: float, startup_s: float,
) -> tuple[dict[Pool, float], str]:
    """Per pool, the replicas that served the interval ending at end_s (s), and a note saying where from.

    From the applied decisions (served_replicas) when the connector keeps them; without any, the replicas
    the fleet has now (FleetState.current_replicas), as the correction took them before.
    """
    if not fleet.applied_targets:
        return ({p: float(getattr(fleet, p).current_replicas) for p in POOLS},
                "served replicas: no applied decisions recorded, the fleet's current replicas")
    out = {p: served_replicas(fleet.applied_targets, p, start_s=end_s - interval_s, end_s=end_s,
                              startup_s=startup_s) for p in POOLS}
    return out, (f"served replicas (time-weighted ready over the interval, from the applied decisions, startup "
                 f"{startup_s:g} s): prefill {out['prefill']:.3g}, decode {out['decode']:.3g}")
