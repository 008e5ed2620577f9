"""Latency of a pool of replicas at a given load: the models sizing inverts.

Prefill: an M/G/c queue. Each replica serves one prompt at a time (the profile's
TTFT is single-request) and the router feeds all replicas from one logical queue.
The probability of waiting is Erlang C for c servers at offered load a = lambda*S;
the wait is approximated Allen-Cunneen style by the M/M/c exponential tail with
its rate divided by g = (ca^2 + cs^2)/2 (ca, cs: coefficients of variation of
inter-arrival and service times):
    P(Wq > t) = C(c, a) * exp(-(c - a) * t / (g * S))
Prompts differ in length, so requests differ in how long they may wait: a request
meets the TTFT target when its wait fits in the target minus its own prefill
time. `prefill_service_points_ms` turns a mean prompt length and its coefficient
of variation into equally likely service times (Gamma-distributed lengths through
the profile), `replicas_for_ttft` finds the fewest servers for which the wanted
share of the requests that can meet the target at all does.

Decode: Little's law against the profile gives the mean KV usage and ITL of a
replica; the KV usage fluctuates with the number of running requests (Poisson in
an infinite-server system, scaled by the arrival peakedness) and their context
lengths, and a request's ITL follows its replica's KV usage. `decode_itl_quantile`
gives the ITL quantile of a pool, `replicas_for_itl_quantile` the fewest replicas
keeping it within target.

Pure functions, no I/O; every time is in the unit its name says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from scipy.optimize import brentq
from scipy.stats import gamma as gamma_dist

from planner.latency.decode_profile import DecodeProfile
from planner.latency.profile import PrefillProfile
from planner.latency.ttft_view import extrapolated_ttft_ms

# Never search past this many replicas; far beyond any real pool.
MAX_REPLICAS_SEARCH = 100_000


def ceil_replicas(x: float) -> int:
    """ceil(x) that ignores float noise below 1e-9 (40/10 -> 4, not 5)."""
    return int(math.ceil(round(x, 9)))


# -- prefill queue ---------------------------------------------------------------


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival waits in M/M/c (Erlang C); 1.0 when offered_load >= servers.

    offered_load: arrival rate * mean service time (erlangs).
    """
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    b = 1.0  # Erlang B by its stable recursion
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return servers * b / (servers - offered_load * (1.0 - b))


def variability_factor(arrival_cv: float, service_cv: float) -> float:
    """Allen-Cunneen factor g = (ca^2 + cs^2)/2 scaling M/M/c waits to G/G/c."""
    return (arrival_cv**2 + service_cv**2) / 2.0


def wait_quantile_s(
    *, servers: int, arrival_rps: float, service_s: float, quantile: float, variability: float
) -> float:
    """Approximate `quantile` of the M/G/c queueing delay, seconds (inf if unstable)."""
    a = arrival_rps * service_s
    if a <= 0 or variability <= 0:
        return 0.0
    if a >= servers:
        return math.inf
    c_wait = erlang_c(servers, a)
    if c_wait <= 1.0 - quantile:
        return 0.0
    return variability * service_s / (servers - a) * math.log(c_wait / (1.0 - quantile))


def mean_wait_s(*, servers: int, arrival_rps: float, service_s: float, variability: float) -> float:
    """Approximate mean M/G/c queueing delay, seconds (inf if unstable)."""
    a = arrival_rps * service_s
    if a <= 0 or variability <= 0:
        return 0.0
    if a >= servers:
        return math.inf
    return erlang_c(servers, a) * variability * service_s / (servers - a)


def replicas_for_ttft(
    *,
    arrival_rps: float,
    service_s: float,
    slack_s: Sequence[float],
    share: float,
    variability: float,
    max_utilization_frac: float,
    classes: Sequence[tuple[float, float]] | None = None,
) -> tuple[int, dict[str, float]]:
    """Fewest servers letting `share` of the requests wait no longer than their slack.

    service_s: mean service time, seconds (offered load = arrival_rps x service_s).
    slack_s: equally likely per-request wait budgets, seconds: TTFT target minus each
        request class's own service time (only classes that can meet the target).
    classes: optional (share of requests, arrival rate in requests/s) parts of the
        interval with their own rates (planner.signals.burst: a burst and the rest); each is
        a stationary M/G/c at its rate, a part at or above saturation meets nothing.
        None: one part at arrival_rps.
    With the Allen-Cunneen tail P(W > t) = C exp(-(c - a) t / (g S)), the share
    meeting the target is mean_i(1 - C exp(-(c - a) slack_i / (g S))), weighted over
    the parts. With one slack and one part this is the classic "S + Wq_share <=
    target". Utilisation at the mean rate stays within the cap either way. Returns
    the count and its queue numbers (utilisation, P(wait), mean and `share`-quantile
    waits in ms of the busiest part, predicted share met).
    """
    slack = np.asarray(slack_s, dtype=float)
    if slack.size == 0 or np.any(slack < 0):
        raise ValueError(f"sizing: slack_s must be non-empty and >= 0, got {slack.tolist()}")
    parts = [(1.0, arrival_rps)] if classes is None else [(w, r) for w, r in classes if w > 0]
    if not parts or any(r < 0 for _, r in parts):
        raise ValueError(f"sizing: classes must hold (share > 0, rate >= 0) pairs, got {classes!r}")
    a = arrival_rps * service_s
    loads = [r * service_s for _, r in parts]
    weights = [w / sum(w for w, _ in parts) for w, _ in parts]
    busiest = int(np.argmax(loads))
    c_min = max(1, ceil_replicas(a / max_utilization_frac))
    b = [1.0] * len(parts)
    for c in range(1, MAX_REPLICAS_SEARCH + 1):
        for j, load in enumerate(loads):
            b[j] = load * b[j] / (c + load * b[j])  # Erlang B(c, load), incrementally
        if c < c_min or a >= c:
            continue
        met = 0.0
        queue: dict[str, float] = {}
        for j, load in enumerate(loads):
            if load >= c:
                part_met, p_wait, scale = 0.0, 1.0, math.inf
            else:
                p_wait = c * b[j] / (c - load * (1.0 - b[j])) if load > 0 else 0.0
                scale = variability * service_s / (c - load)
                part_met = 1.0 if (variability <= 0 or load <= 0) else float(np.mean(1.0 - p_wait * np.exp(-slack / scale)))
            met += weights[j] * part_met
            if j == busiest:
                queue = {"p_wait_frac": p_wait, "scale_s": scale}
        if met >= share - 1e-12:
            p_wait, scale = queue["p_wait_frac"], queue["scale_s"]
            if not math.isfinite(scale):
                wait_q = math.inf
            else:
                wait_q = 0.0 if (variability <= 0 or p_wait <= 1.0 - share) else scale * math.log(p_wait / (1.0 - share))
            return c, {
                "utilization_frac": a / c,
                "peak_utilization_frac": loads[busiest] / c,
                "p_wait_frac": p_wait,
                "mean_wait_ms": 1000.0 * p_wait * scale if math.isfinite(scale) else math.inf,
                "wait_quantile_ms": 1000.0 * wait_q,
                "ttft_quantile_ms": 1000.0 * (service_s + wait_q),
                "ttft_met_frac": met,
            }
    raise ValueError(
        f"sizing: no replica count up to {MAX_REPLICAS_SEARCH} lets {share:.1%} of requests meet TTFT "
        f"at {arrival_rps:g} rps with {service_s * 1000:g} ms mean service"
    )


def prompt_length_points(*, isl_tokens: float, isl_cv: float, points: int = 64) -> np.ndarray:
    """`points` equally likely prompt lengths (tokens) around a mean ISL.

    Prompt lengths are Gamma-distributed with mean `isl_tokens` and coefficient of
    variation `isl_cv` (0: every prompt has the mean length; one point).
    """
    if isl_cv <= 0:
        return np.array([isl_tokens])
    shape = 1.0 / isl_cv**2
    return gamma_dist.ppf((np.arange(points) + 0.5) / points, shape, scale=isl_tokens / shape)


def prefill_service_points_ms(profile: PrefillProfile, *, isl_tokens: float, isl_cv: float, points: int = 64) -> np.ndarray:
    """The profile's single-request TTFTs (ms) of `prompt_length_points` around a mean ISL.

    Shorter than the profiled range: the shortest measured TTFT. Longer: the
    longest measured TTFT scaled linearly with length (prefill is compute-bound
    there), which is how the simulator extrapolates too (planner.latency.ttft_view).
    """
    return extrapolated_ttft_ms(profile, prompt_length_points(isl_tokens=isl_tokens, isl_cv=isl_cv, points=points))


# -- decode ITL quantile ---------------------------------------------------------

_INF_QUANTILE = {
    "mean_itl_ms": math.inf, "itl_quantile_ms": math.inf,
    "mean_kv_usage_frac": math.inf, "kv_usage_quantile_frac": math.inf,
}


def arrival_peakedness(arrival_cv: float) -> float:
    """Variance/mean of the number of requests in an infinite-server system fed by these arrivals.

    1 for Poisson arrivals (M/G/inf); (1 + ca^2)/2 for a renewal stream with
    inter-arrival CV ca, the same two-moment form as Allen-Cunneen's factor.
    """
    return (1.0 + arrival_cv**2) / 2.0


def _mean_decode_kv(profile: DecodeProfile, *, a: float, context_tokens: float, kv_hi: float) -> float:
    """KV usage where Little's law and the profile agree: kv = a * ITL(kv); inf when none within kv_hi.

    a: KV fraction added per ms of ITL (rps x osl x context x correction / (1000 x max_kv)).
    """
    def excess(kv: float) -> float:
        return a * profile.itl_ms_at(kv, context_tokens) - kv

    if excess(kv_hi) > 0:
        return math.inf
    return brentq(excess, 0.0, kv_hi, xtol=1e-9)


def decode_itl_quantile(
    profile: DecodeProfile,
    *,
    rps: float,
    osl_tokens: float,
    context_tokens: float,
    correction: float,
    replicas: int,
    quantile: float,
    context_cv: float,
    peakedness: float,
) -> dict[str, float]:
    """Mean and `quantile` ITL (ms) of a decode pool of `replicas` at `rps`, with their KV usage.

    The mean operating point solves Little's law against the profile: each
    replica holds N = rps/replicas x osl x ITL(kv)/1000 running requests of about
    `context_tokens` KV each. A request's ITL follows its replica's KV usage while it
    runs, and that usage fluctuates: the number in service of an infinite-server
    system is Poisson (variance x `peakedness` for burstier arrivals) and each
    request holds a context with coefficient of variation `context_cv`, so
    Var(KV tokens) = N x peakedness x (1 + cv^2) x context^2. The router balances
    the replicas (least-loaded), so the fluctuation is the pool's, shared by its
    replicas. The quantile ITL is the profile's ITL at the normal quantile of
    that KV usage, times the correction factor. inf when it leaves the profile.
    """
    lo, hi = profile.context_range_tokens
    ctx_eval = min(max(context_tokens, lo), hi)
    kv_hi = profile.kv_range_frac(ctx_eval)[1]
    a = rps / replicas * osl_tokens * context_tokens * correction / (1000.0 * profile.max_kv_tokens)
    kv_mean = _mean_decode_kv(profile, a=a, context_tokens=ctx_eval, kv_hi=kv_hi)
    if not math.isfinite(kv_mean):
        return dict(_INF_QUANTILE)
    running_pool = kv_mean * profile.max_kv_tokens / context_tokens * replicas
    sd_tokens = math.sqrt(running_pool * peakedness * (1.0 + context_cv**2)) * context_tokens / replicas
    z = NormalDist().inv_cdf(quantile)
    kv_q = kv_mean + z * sd_tokens / profile.max_kv_tokens
    out = {
        "mean_itl_ms": correction * profile.itl_ms_at(kv_mean, ctx_eval),
        "itl_quantile_ms": math.inf,
        "mean_kv_usage_frac": kv_mean,
        "kv_usage_quantile_frac": kv_q,
    }
    if kv_q <= kv_hi:
        out["itl_quantile_ms"] = correction * profile.itl_ms_at(max(kv_q, 0.0), ctx_eval)
    return out


def replicas_for_itl_quantile(
    profile: DecodeProfile,
    *,
    rps: float,
    osl_tokens: float,
    context_tokens: float,
    correction: float,
    itl_target_ms: float,
    quantile: float,
    context_cv: float,
    peakedness: float,
    min_replicas: int = 1,
) -> tuple[int, dict[str, float]]:
    """Fewest replicas (>= min_replicas) whose `quantile` ITL is within itl_target_ms.

    More replicas never raise the quantile (less KV per replica, a smaller
    fluctuation), so the count is found by doubling then bisection. The caller
    guarantees the target is above the ITL of an idle replica.
    """
    kw = dict(rps=rps, osl_tokens=osl_tokens, context_tokens=context_tokens, correction=correction,
              quantile=quantile, context_cv=context_cv, peakedness=peakedness)

    def ok(r: int) -> tuple[bool, dict[str, float]]:
        q = decode_itl_quantile(profile, replicas=r, **kw)
        return q["itl_quantile_ms"] <= itl_target_ms, q

    lo = max(1, min_replicas)
    good, q = ok(lo)
    if good:
        return lo, q
    hi = lo
    while True:
        if hi >= MAX_REPLICAS_SEARCH:
            raise ValueError(
                f"sizing: no decode replica count up to {MAX_REPLICAS_SEARCH} keeps p{quantile * 100:g} ITL "
                f"within {itl_target_ms:g} ms at {rps:g} rps"
            )
        hi = min(2 * hi, MAX_REPLICAS_SEARCH)
        good, q_hi = ok(hi)
        if good:
            break
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        good, q_mid = ok(mid)
        if good:
            hi, q_hi = mid, q_mid
        else:
            lo = mid
    return hi, q_hi
