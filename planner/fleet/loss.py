"""Expected SLA loss at fewer replicas: the share of a pool's requests meeting its target, per replica count.

The arbitration (planner.fleet.arbitrate) compares deployments by what each would lose. These are the
sizing step's own latency models (planner.latency.queueing) read the other way round: sizing asks for
the fewest replicas reaching a share, here the share is asked of each count.

Prefill, TTFT: the M/G/c wait of the SLA sizing mode (planner.sizing.sla) at the sized load, prompt
lengths spread around the forecast mean; a request meets the target when its own prefill fits and its
wait fits in the rest. The forecast's sub-interval burst (its peak ratio) counts: the requests arriving
in the peak meet the queue of the peak's rate, whatever basis sizing took.

Decode, ITL: the pool's KV usage is normal around Little's law's operating point (mean and spread from
planner.latency.queueing.decode_itl_quantile); a request meets the target while its replica's KV usage
keeps the profile's ITL within it, so the share is the normal CDF at the KV usage where ITL reaches
the target.

0 replicas with load: nothing is met; no load: everything is.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from scipy.optimize import brentq

from planner.latency.decode_profile import DecodeProfile
from planner.latency.queueing import (
    arrival_peakedness,
    decode_itl_quantile,
    erlang_c,
    prompt_length_points,
    variability_factor,
)
from planner.latency.ttft_view import TtftView
from planner.signals.burst import arrival_classes

_Z1 = NormalDist().cdf(1.0)  # the quantile one standard deviation above the mean


def ttft_met_fracs(
    *, rps: float, isl_tokens: float, isl_cv: float, correction: float, ttft_target_ms: float, ttft: TtftView,
    arrival_cv: float, service_cv: float, up_to: int, peak_ratio: float | None = None,
    peak_window_s: float | None = None, interval_s: float = 60.0,
) -> tuple[float, ...]:
    """Share of all requests whose TTFT meets ttft_target_ms with 0..up_to prefill replicas.

    rps: arrivals, requests/s. isl_tokens: mean prompt length, tokens; isl_cv: its coefficient of
    variation. correction: the prefill correction factor (observed / profile). ttft: single-request
    TTFT by prompt length (its mean the service time, its p90 whether a request can make it at all).
    arrival_cv, service_cv: the Allen-Cunneen variability of the queue. peak_ratio, peak_window_s: the
    forecast's sub-interval burst (planner.signals.burst.arrival_classes over interval_s, s): the share of
    requests arriving in the peak meets the queue of its rate; None: flat within the interval.
    """
    if rps <= 0:
        return (1.0,) * (up_to + 1)
    lengths = prompt_length_points(isl_tokens=isl_tokens, isl_cv=isl_cv)
    service_s = float(np.mean(ttft.ttft_ms_many(lengths, quantile="mean"))) * correction / 1000.0
    own_s = ttft.ttft_ms_many(lengths, quantile="p90") * correction / 1000.0
    target_s = ttft_target_ms / 1000.0
    fits = own_s < target_s
    reachable = float(np.mean(fits))
    slack_s = target_s - own_s[fits]
    g = variability_factor(arrival_cv, service_cv)
    parts = [(w, r * service_s) for w, r, _ in arrival_classes(rps=rps, ratio=peak_ratio, window_s=peak_window_s,
                                                               interval_s=interval_s)]
    out = [0.0]
    for c in range(1, up_to + 1):
        met = 0.0
        for w, a in parts:
            if reachable <= 0 or a >= c:
                continue
            if g <= 0:
                met += w * reachable
            else:
                scale = g * service_s / (c - a)
                met += w * reachable * float(np.mean(1.0 - erlang_c(c, a) * np.exp(-slack_s / scale)))
        out.append(met)
    return tuple(out)


def itl_met_fracs(
    profile: DecodeProfile, *, rps: float, osl_tokens: float, context_tokens: float, correction: float,
    itl_target_ms: float, context_cv: float, arrival_cv: float, up_to: int,
) -> tuple[float, ...]:
    """Share of requests whose ITL meets itl_target_ms with 0..up_to decode replicas.

    rps: arrivals, requests/s; osl_tokens: mean output length; context_tokens: KV a decoding request holds
    (ISL + OSL/2), tokens, with coefficient of variation context_cv. correction: the decode correction
    factor. arrival_cv: inter-arrival CV (the pool's peakedness).
    """
    if rps <= 0 or osl_tokens <= 0:
        return (1.0,) * (up_to + 1)
    lo, hi = profile.context_range_tokens
    ctx = min(max(context_tokens, lo), hi)
    kv_lo, kv_hi = profile.kv_range_frac(ctx)
    kv_target = _kv_at_itl(profile, ctx=ctx, kv_lo=kv_lo, kv_hi=kv_hi, itl_ms=itl_target_ms / correction)
    out = [0.0]
    for r in range(1, up_to + 1):
        q = decode_itl_quantile(profile, rps=rps, osl_tokens=osl_tokens, context_tokens=context_tokens,
                                correction=correction, replicas=r, quantile=_Z1, context_cv=context_cv,
                                peakedness=arrival_peakedness(arrival_cv))
        mean, one_sd = q["mean_kv_usage_frac"], q["kv_usage_quantile_frac"]
        if not math.isfinite(mean) or kv_target is None:
            out.append(0.0)
            continue
        sd = one_sd - mean
        # KV usage above the profiled range leaves it: those requests are counted as missing, as sizing does.
        limit = min(kv_target, kv_hi)
        out.append(1.0 if sd <= 0 and mean <= limit else 0.0 if sd <= 0 else NormalDist(mean, sd).cdf(limit))
    return tuple(out)


def _kv_at_itl(profile: DecodeProfile, *, ctx: float, kv_lo: float, kv_hi: float, itl_ms: float) -> float | None:
    """KV usage (fraction) at which the profile's ITL reaches itl_ms; None when even the lowest exceeds it."""
    def excess(kv: float) -> float:
        return profile.itl_ms_at(kv, ctx) - itl_ms

    if excess(kv_lo) > 0:
        return None
    if excess(kv_hi) <= 0:
        return kv_hi
    return brentq(excess, kv_lo, kv_hi, xtol=1e-6)
