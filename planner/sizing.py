"""Replicas each pool needs to meet the SLA at the forecast load.

Two modes (SizingConfig.mode):

* "dynamo": Dynamo's seed formulas, verbatim. Both pools are sized for 100%
  of profiled throughput, and prefill ignores the TTFT target:
    prefill = ceil(req * isl / interval * min(1, prefill_corr)
                   / prefill_thpt_per_gpu(isl) / gpus_per_prefill_engine)
    decode  = ceil(req * osl / interval
                   / best_decode_thpt_per_gpu(itl_target / decode_corr, isl + osl/2)
                   / gpus_per_decode_engine)
* "sla" (default): prefill is an M/G/c queue sized so that the configured
  percentile of TTFT (queueing delay + prefill time) stays within the target;
  decode keeps `decode_headroom_frac` of throughput free for bursts and also
  sizes on KV-cache capacity.

Prefill queueing model. Each prefill replica serves one prompt at a time (the
profile's TTFT is single-request) with service time S = TTFT(isl) * correction,
and the router feeds all replicas from one logical queue: M/G/c. The
probability of waiting is Erlang C for c servers at offered load a = lambda*S;
the waiting time is approximated Allen-Cunneen style by the M/M/c exponential
tail with its rate divided by g = (ca^2 + cs^2)/2, where ca and cs are the
coefficients of variation of inter-arrival and service times:
    P(Wq > t) = C(c, a) * exp(-(c - a) * t / (g * S))
so the p-quantile of the wait is g*S/(c - a) * ln(C/(1 - p)) (0 when C <= 1-p)
and the mean is C*g*S/(c - a). g = 1 is M/M/c; cs = 0 is M/D/c (g = 1/2 with
Poisson arrivals), whose Allen-Cunneen error is a few percent. Predicted
TTFT_p = S + Wq_p, with S at the mean ISL. The fewest c with TTFT_p within the
target and utilisation a/c within `prefill_max_utilization_frac` wins.

Unreachable targets: when the target is below the best latency the engine can
do (single-request TTFT for prefill, ITL at one running request for decode),
no replica count meets it. We then size for that best latency plus
`unreachable_slack_frac`, report target_reachable = 0 in the numbers and say
so in the message, instead of returning an unbounded count.

Every number behind a result is in PoolSizing.numbers (floats; flags are 0/1).
A pool with no forecast load gets 0 replicas (min_replicas is the decide
step's business); a pool with any load gets at least 1.
"""

from __future__ import annotations

import math
from typing import Literal

from planner.config import SizingConfig, SloTarget
from planner.profile import DecodeProfile, PrefillProfile
from planner.types import Corrections, Forecast, PoolSizing

SizeOn = Literal["mean", "p90"]

# Never search past this many replicas; far beyond any real pool.
MAX_REPLICAS_SEARCH = 100_000


def ceil_replicas(x: float) -> int:
    """ceil(x) that ignores float noise below 1e-9 (40/10 -> 4, not 5)."""
    return int(math.ceil(round(x, 9)))


# -- queueing ----------------------------------------------------------------


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
    ttft_target_s: float,
    quantile: float,
    variability: float,
    max_utilization_frac: float,
) -> tuple[int, dict[str, float]]:
    """Fewest servers keeping the TTFT quantile within target and utilisation within the cap.

    Needs service_s < ttft_target_s (else no count works; the caller handles it).
    Returns the count and its queue numbers (utilisation, P(wait), waits in ms).
    """
    a = arrival_rps * service_s
    c_min = max(1, ceil_replicas(a / max_utilization_frac))
    b = 1.0
    for c in range(1, MAX_REPLICAS_SEARCH + 1):
        b = a * b / (c + a * b)  # Erlang B(c, a), incrementally
        if c < c_min or a >= c:
            continue
        p_wait = c * b / (c - a * (1.0 - b))
        scale = variability * service_s / (c - a)
        wait_p = 0.0 if (variability <= 0 or p_wait <= 1.0 - quantile) else scale * math.log(p_wait / (1.0 - quantile))
        if service_s + wait_p <= ttft_target_s:
            return c, {
                "utilization_frac": a / c,
                "p_wait_frac": p_wait,
                "mean_wait_ms": 1000.0 * p_wait * scale,
                "wait_quantile_ms": 1000.0 * wait_p,
                "ttft_quantile_ms": 1000.0 * (service_s + wait_p),
            }
    raise ValueError(
        f"sizing: no replica count up to {MAX_REPLICAS_SEARCH} keeps TTFT within {ttft_target_s * 1000:g} ms "
        f"at {arrival_rps:g} rps with {service_s * 1000:g} ms service"
    )


# -- inputs --------------------------------------------------------------------


def _load(forecast: Forecast, size_on: SizeOn) -> tuple[float, str]:
    """Requests to size for: the mean, or the p90 (never below the mean)."""
    for name in ("num_requests", "num_requests_p90", "avg_isl_tokens", "avg_osl_tokens"):
        v = getattr(forecast, name)
        if v is None or not math.isfinite(v) or v < 0:
            raise ValueError(f"sizing: forecast.{name} must be a finite number >= 0, got {v!r}")
    if size_on == "mean":
        return forecast.num_requests, "mean"
    if size_on == "p90":
        return max(forecast.num_requests, forecast.num_requests_p90), "p90"
    raise ValueError(f"sizing: size_on must be 'mean' or 'p90', got {size_on!r}")


def _check_interval(interval_s: float) -> None:
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"sizing: interval_s must be > 0, got {interval_s!r}")


def _factor(value: float, enabled: bool) -> float:
    return value if enabled and math.isfinite(value) and value > 0 else 1.0


def _within(value: float, lo: float, hi: float) -> tuple[float, bool]:
    """Clamp to the profiled range; the flag goes into the numbers instead of a warning."""
    clamped = min(max(value, lo), hi)
    return clamped, clamped != value


# -- prefill -------------------------------------------------------------------


def size_prefill(
    forecast: Forecast,
    *,
    corrections: Corrections,
    profile: PrefillProfile,
    slo: SloTarget,
    cfg: SizingConfig,
    interval_s: float,
    size_on: SizeOn = "p90",
) -> PoolSizing:
    """Prefill replicas for the forecast load (see the module docstring for both modes).

    interval_s: the forecast's interval, seconds (requests / interval_s = rps).
    size_on: size on the mean forecast or its p90.
    """
    _check_interval(interval_s)
    requests, basis = _load(forecast, size_on)
    isl = forecast.avg_isl_tokens
    rps = requests / interval_s
    corr = _factor(corrections.prefill, corrections.enabled)
    numbers: dict[str, float] = {
        "requests": requests,
        "load_rps": rps,
        "isl_tokens": isl,
        "interval_s": interval_s,
        "prefill_correction": corr,
        "ttft_target_ms": slo.ttft_ms,
        "gpus_per_engine": float(cfg.gpus_per_prefill_engine),
    }
    if requests <= 0 or isl <= 0:
        return PoolSizing("prefill", 0, numbers, f"no prefill load ({requests:g} requests, ISL {isl:g} tokens)")
    isl_eval, clamped = _within(isl, *profile.isl_range_tokens)
    thpt = profile.throughput_per_gpu_at(isl_eval)
    ttft_ms = profile.ttft_ms_at(isl_eval)
    numbers["throughput_per_gpu"] = thpt
    numbers["single_request_ttft_ms"] = ttft_ms
    numbers["isl_clamped"] = float(clamped)
    load_tps = rps * isl
    numbers["prefill_tokens_per_s"] = load_tps

    if cfg.mode == "dynamo":
        used = min(1.0, corr)
        raw = load_tps * used / thpt / cfg.gpus_per_prefill_engine
        replicas = max(1, ceil_replicas(raw))
        numbers.update(correction_used=used, raw_replicas=raw, utilization_frac=raw / replicas)
        msg = (
            f"dynamo: {rps:.3g} rps x {isl:.0f} tokens x {used:.2f} = {load_tps * used:.4g} tokens/s "
            f"/ {thpt:.4g} tokens/s/GPU / {cfg.gpus_per_prefill_engine} GPU = {raw:.2f} -> {replicas}"
        )
        return PoolSizing("prefill", replicas, numbers, msg)

    service_s = ttft_ms * corr / 1000.0
    target_s = slo.ttft_ms / 1000.0
    reachable = service_s < target_s
    effective_target_s = target_s if reachable else service_s * (1.0 + cfg.unreachable_slack_frac)
    g = variability_factor(cfg.prefill_arrival_cv, cfg.prefill_service_cv)
    replicas, queue = replicas_for_ttft(
        arrival_rps=rps,
        service_s=service_s,
        ttft_target_s=effective_target_s,
        quantile=cfg.ttft_quantile,
        variability=g,
        max_utilization_frac=cfg.prefill_max_utilization_frac,
    )
    numbers.update(queue)
    numbers.update(
        correction_used=corr,
        service_ms=service_s * 1000.0,
        offered_load_erlangs=rps * service_s,
        variability_factor=g,
        ttft_quantile=cfg.ttft_quantile,
        target_reachable=float(reachable),
        effective_ttft_target_ms=effective_target_s * 1000.0,
        max_utilization_frac=cfg.prefill_max_utilization_frac,
    )
    pct = f"p{cfg.ttft_quantile * 100:g}"
    if not reachable:
        msg = (
            f"TTFT target {slo.ttft_ms:g} ms unreachable: single-request TTFT {service_s * 1000:.0f} ms "
            f"at ISL {isl:.0f}; sized {replicas} for {pct} TTFT {queue['ttft_quantile_ms']:.0f} ms "
            f"<= {effective_target_s * 1000:.0f} ms at {rps:.3g} rps"
        )
    else:
        msg = (
            f"{pct} TTFT {queue['ttft_quantile_ms']:.0f} ms <= {slo.ttft_ms:g} ms with {replicas} replicas "
            f"at {rps:.3g} rps ({basis}), ISL {isl:.0f}, utilisation {queue['utilization_frac']:.2f}"
        )
    return PoolSizing("prefill", replicas, numbers, msg)


# -- decode --------------------------------------------------------------------


def size_decode(
    forecast: Forecast,
    *,
    corrections: Corrections,
    profile: DecodeProfile,
    slo: SloTarget,
    cfg: SizingConfig,
    interval_s: float,
    size_on: SizeOn = "p90",
) -> PoolSizing:
    """Decode replicas for the forecast load (see the module docstring for both modes).

    interval_s: the forecast's interval, seconds. size_on: mean or p90 forecast.
    """
    _check_interval(interval_s)
    requests, basis = _load(forecast, size_on)
    isl, osl = forecast.avg_isl_tokens, forecast.avg_osl_tokens
    rps = requests / interval_s
    corr = _factor(corrections.decode, corrections.enabled)
    context = isl + osl / 2.0
    out_tps = rps * osl
    numbers: dict[str, float] = {
        "requests": requests,
        "load_rps": rps,
        "isl_tokens": isl,
        "osl_tokens": osl,
        "context_tokens": context,
        "interval_s": interval_s,
        "output_tokens_per_s": out_tps,
        "decode_correction": corr,
        "itl_target_ms": slo.itl_ms,
        "gpus_per_engine": float(cfg.gpus_per_decode_engine),
        "max_kv_tokens": float(profile.max_kv_tokens),
    }
    if requests <= 0 or osl <= 0:
        return PoolSizing("decode", 0, numbers, f"no decode load ({requests:g} requests, OSL {osl:g} tokens)")
    corrected_itl = slo.itl_ms / corr
    context_eval, clamped = _within(context, *profile.context_range_tokens)
    op = profile.best_throughput_per_gpu(corrected_itl, context_eval)
    numbers.update(corrected_itl_target_ms=corrected_itl, context_clamped=float(clamped))

    if cfg.mode == "dynamo":
        raw = out_tps / op.throughput_per_gpu / cfg.gpus_per_decode_engine
        replicas = max(1, ceil_replicas(raw))
        numbers.update(
            throughput_per_gpu=op.throughput_per_gpu,
            op_kv_usage_frac=op.kv_usage_frac,
            op_itl_ms=op.itl_ms,
            target_reachable=float(op.meets_target),
            raw_replicas=raw,
        )
        msg = (
            f"dynamo: {rps:.3g} rps x {osl:.0f} tokens = {out_tps:.4g} tokens/s / {op.throughput_per_gpu:.4g} "
            f"tokens/s/GPU at ITL {corrected_itl:.3g} ms / {cfg.gpus_per_decode_engine} GPU = {raw:.2f} -> {replicas}"
        )
        if not op.meets_target:
            msg += f" (ITL target unreachable: best {op.itl_ms:.3g} ms at context {context:.0f})"
        return PoolSizing("decode", replicas, numbers, msg)

    reachable = op.meets_target
    best_itl = op.itl_ms
    effective_itl = corrected_itl
    if not reachable:
        effective_itl = op.itl_ms * (1.0 + cfg.unreachable_slack_frac)
        op = profile.best_throughput_per_gpu(effective_itl, context_eval)
    per_replica_tps = op.throughput_per_gpu * cfg.gpus_per_decode_engine
    usable_tps = per_replica_tps * (1.0 - cfg.decode_headroom_frac)
    r_thpt = out_tps / usable_tps
    # Little's law: requests in decode = arrival rate x time to emit osl tokens at the
    # (corrected) operating ITL; each holds about `context` tokens of KV cache.
    running = rps * osl * op.itl_ms * corr / 1000.0
    kv_tokens = running * context
    r_kv = kv_tokens / (profile.max_kv_tokens * cfg.decode_max_kv_usage_frac)
    replicas = max(1, ceil_replicas(max(r_thpt, r_kv)))
    per_replica_kv = kv_tokens / (replicas * profile.max_kv_tokens)
    pred_itl = profile.itl_ms_at(min(per_replica_kv, profile.kv_range_frac(context_eval)[1]), context_eval)
    numbers.update(
        target_reachable=float(reachable),
        effective_itl_target_ms=effective_itl,
        best_itl_ms=best_itl,
        throughput_per_gpu=op.throughput_per_gpu,
        op_kv_usage_frac=op.kv_usage_frac,
        op_itl_ms=op.itl_ms,
        op_concurrency=op.concurrency,
        throughput_per_replica=per_replica_tps,
        headroom_frac=cfg.decode_headroom_frac,
        replicas_for_throughput=r_thpt,
        running_requests=running,
        kv_tokens_needed=kv_tokens,
        max_kv_usage_frac=cfg.decode_max_kv_usage_frac,
        replicas_for_kv=r_kv,
        utilization_frac=out_tps / (replicas * per_replica_tps),
        predicted_kv_usage_frac=per_replica_kv,
        predicted_itl_ms=pred_itl * corr,
    )
    bound = "KV capacity" if r_kv > r_thpt else "throughput"
    head = (
        f"ITL target {slo.itl_ms:g} ms unreachable: best {best_itl * corr:.3g} ms at context {context:.0f} "
        f"(profile {best_itl:.3g} ms x correction {corr:.2f}); " if not reachable else ""
    )
    msg = (
        f"{head}{replicas} replicas ({bound}-bound) for {out_tps:.4g} output tokens/s at {rps:.3g} rps ({basis}): "
        f"{op.throughput_per_gpu:.4g} tokens/s/GPU at ITL {op.itl_ms:.3g} ms, {cfg.decode_headroom_frac:.0%} headroom, "
        f"predicted ITL {pred_itl * corr:.3g} ms, KV {per_replica_kv:.0%}"
    )
    return PoolSizing("decode", replicas, numbers, msg)
