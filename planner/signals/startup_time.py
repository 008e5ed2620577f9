"""Replica startup time per pool, measured from the fleet's own history.

A scale-up's startup is the time from its decision to the pool counting the
decided replicas as ready: the applied decisions (when, which targets) against
ready-count samples (the connector's ready counts, or Prometheus's count of
serving workers). Stateless: the history is an argument, so every run
measures afresh from what it reads. A scale-up a later decision changed before
it was ready is left out (its end is not its own), and so is one still
starting. Too few measurements: the configured sizing.replica_startup_s.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.types import POOLS, Pool


@dataclass(frozen=True)
class StartupTime:
    """One pool's startup time and where it came from.

    startup_s: the median of the measured scale-ups, or the configured value, seconds.
    measured_s: each measured scale-up's startup, oldest first (empty: none measured).
    source: "measured" or "configured".
    """

    pool: Pool
    startup_s: float
    source: str
    measured_s: tuple[float, ...] = field(default=())

    def describe(self) -> str:
        if self.source == "measured":
            return (f"{self.pool} startup {self.startup_s:.0f} s (median of {len(self.measured_s)} measured "
                    f"scale-ups)")
        return f"{self.pool} startup {self.startup_s:.0f} s (configured: no measured scale-up)"


def measured_startups_s(
    pool: Pool,
    *,
    applied: Sequence[tuple[float, int, int]],
    ready: Sequence[tuple[float, int, int]],
) -> list[float]:
    """Seconds from each of the pool's scale-up decisions to its ready count first reaching the decided target.

    applied: (decided_at_s, prefill, decode) of the applied decisions, oldest first.
    ready: (t_s, prefill_ready, decode_ready) samples, any order.
    A scale-up is a decision whose target for the pool is above the previous decision's; it counts only when a
    sample at or after it, and before the pool's next change of target, shows the target ready.
    """
    i = POOLS.index(pool)
    samples = sorted((float(s[0]), int(s[1 + i])) for s in ready)
    rows = sorted(applied, key=lambda a: a[0])
    out: list[float] = []
    for k in range(1, len(rows)):
        t, target, before = float(rows[k][0]), int(rows[k][1 + i]), int(rows[k - 1][1 + i])
        if target <= before:
            continue
        until = next((float(r[0]) for r in rows[k + 1:] if int(r[1 + i]) != target), float("inf"))
        at = next((ts for ts, n in samples if t <= ts < until and n >= target), None)
        if at is not None:
            out.append(at - t)
    return out


def startup_times(
    *,
    applied: Sequence[tuple[float, int, int]],
    ready: Sequence[tuple[float, int, int]],
    configured_s: float,
    min_measured: int = 1,
) -> dict[Pool, StartupTime]:
    """Each pool's startup time: the median of its measured scale-ups, else configured_s (seconds).

    min_measured: fewest measurements to trust over the configured value (>= 1).
    """
    if min_measured < 1:
        raise ValueError(f"startup_times: min_measured must be >= 1, got {min_measured!r}")
    if not configured_s >= 0:
        raise ValueError(f"startup_times: configured_s must be >= 0 s, got {configured_s!r}")
    out: dict[Pool, StartupTime] = {}
    for pool in POOLS:
        measured = measured_startups_s(pool, applied=applied, ready=ready)
        if len(measured) >= min_measured:
            out[pool] = StartupTime(pool, float(np.median(measured)), "measured", tuple(measured))
        else:
            out[pool] = StartupTime(pool, float(configured_s), "configured", tuple(measured))
    return out


__all__ = ["StartupTime", "measured_startups_s", "startup_times"]
