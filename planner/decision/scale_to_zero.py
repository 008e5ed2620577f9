"""Scale to zero: a pool idles to 0 replicas only when a cold start costs less than the GPUs it frees.

After `quiet_s` seconds without a request, the pools allowed to reach zero
(min_replicas 0) go there when the expected cost of the cold start the next
request would pay is below the GPU-hours saved until the next decision:

    late requests  = upper_rps x startup_s   when startup_s > the TTFT target, else 0
    cost (GPU-h)   = late requests x late_request_cost_gpu_h
    saved (GPU-h)  = sum over those pools of replicas x GPUs per replica x interval_s / 3600

upper_rps is the forecast's upper quantile (requests/s): the requests expected
in the startup window a wake opens, each waiting up to startup_s against the
TTFT target. startup_s is the slowest of those pools' startup times, measured
from the fleet's own scale-ups (planner.signals.startup_time).
A pool the rule keeps above zero keeps at least one replica: sizing at no load
may ask 0, and only this rule may take a running pool to zero. A pool already
at zero is left to the other rules: a forecast above zero, or the wake signal
(planner.saturation.wake), scales it up.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.signals.startup_time import StartupTime
from planner.types import POOLS, LoadHistory, Pool, Reason, ReasonCode, Step, Targets


@dataclass(frozen=True)
class ZeroCase:
    """What the scale-to-zero rule weighs, per run.

    quiet_s: how long no request has arrived, s (trailing intervals with none).
    upper_rps: the forecast's upper quantile, requests/s.
    ttft_target_s: the SLA's TTFT target, s.
    interval_s: until the next decision, s: the GPUs freed are counted over it.
    startup: each pool's startup time (planner.signals.startup_time).
    gpus_per_replica: per pool.
    """

    quiet_s: float
    upper_rps: float
    ttft_target_s: float
    interval_s: float
    startup: Mapping[Pool, StartupTime]
    gpus_per_replica: Mapping[Pool, int]


def quiet_for_s(history: LoadHistory | None, *, num_requests: float | None) -> float:
    """Seconds without a request: the trailing intervals of the history with none, the latest included.

    num_requests: the latest interval's arrivals (the observation's); a request there ends the quiet.
    None history: only the latest interval counts (0 s if it had requests or is unknown).
    """
    if num_requests is None or num_requests > 0:
        return 0.0
    if history is None or len(history) == 0:
        return 0.0
    quiet = 0
    for n in reversed(history.num_requests):
        if n != n or n > 0:  # NaN: unknown, not quiet
            break
        quiet += 1
    return quiet * history.interval_s


def scale_to_zero(
    targets: Targets,
    *,
    current: Targets,
    zero_pools: tuple[Pool, ...],
    case: ZeroCase | None,
    quiet_needed_s: float,
    late_request_cost_gpu_h: float,
) -> Step:
    """Targets with zero_pools at 0 when quiet long enough and the cold start is worth it, else at >= 1.

    zero_pools: the pools allowed to reach zero (min_replicas 0 with scale-to-zero allowed).
    case: this run's numbers; None (load data or sizing missing): the rule keeps running pools above zero.
    quiet_needed_s: the quiet period before any pool goes to zero, s.
    late_request_cost_gpu_h: GPU-hours one request that misses its TTFT target is worth.
    Pools already at zero are left as the other rules set them.
    """
    out = dict(targets)
    running = tuple(p for p in zero_pools if current[p] > 0)
    if not running:
        return out, []

    def keep(why: str, numbers: dict[str, float]) -> Step:
        reasons = []
        for p in running:
            if out[p] < 1:
                out[p] = 1
                reasons.append(Reason(ReasonCode.KEPT_ABOVE_ZERO, p, f"{p}: 0 raised to 1: {why}",
                                      {**numbers, "requested_replicas": 0.0}))
        return out, reasons

    if case is None:
        return keep("load data or sizing missing, no scale to zero on it", {})
    numbers = {"quiet_s": case.quiet_s, "quiet_needed_s": quiet_needed_s}
    if case.quiet_s < quiet_needed_s:
        return keep(f"quiet {case.quiet_s:.0f} s < {quiet_needed_s:.0f} s", numbers)
    startup = max(running, key=lambda p: case.startup[p].startup_s)
    startup_s = case.startup[startup].startup_s
    late = case.upper_rps * startup_s if startup_s > case.ttft_target_s else 0.0
    cost = late * late_request_cost_gpu_h
    saved = sum(current[p] * case.gpus_per_replica[p] for p in running) * case.interval_s / 3600.0
    numbers.update({
        "upper_rps": case.upper_rps, "startup_s": startup_s, "ttft_target_s": case.ttft_target_s,
        "interval_s": case.interval_s, "expected_late_requests": late, "late_request_cost_gpu_h":
        late_request_cost_gpu_h, "cold_start_cost_gpu_h": cost, "saved_gpu_h": saved,
        "startup_measured": float(case.startup[startup].source == "measured"),
    })
    weighed = (f"quiet {case.quiet_s:.0f} s; upper forecast {case.upper_rps:.3g} rps x "
               f"{case.startup[startup].describe()} = {late:.3g} requests late against TTFT "
               f"{case.ttft_target_s:g} s, cold start {cost:.3g} GPU-h")
    if cost >= saved:
        return keep(f"{weighed} >= {saved:.3g} GPU-h saved until the next decision", numbers)
    reasons = []
    for p in running:
        reasons.append(Reason(ReasonCode.SCALE_TO_ZERO, p,
                              f"{p}: {out[p]} -> 0: {weighed} < {saved:.3g} GPU-h saved until the next decision",
                              {**numbers, "requested_replicas": float(out[p])}))
        out[p] = 0
    return out, reasons


def zero_pools(*, allow: bool, min_replicas: Mapping[Pool, int]) -> tuple[Pool, ...]:
    """The pools the rule may take to zero: min_replicas 0, with scale-to-zero allowed."""
    return tuple(p for p in POOLS if allow and min_replicas[p] == 0)


__all__ = ["ZeroCase", "quiet_for_s", "scale_to_zero", "zero_pools"]
