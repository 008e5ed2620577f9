"""Replicas each pool needs to meet the SLA at the forecast load.

Two modes (SizingConfig.mode):

* "dynamo": Dynamo's seed formulas, verbatim. Both pools are sized for 100%
  of profiled throughput, and prefill ignores the TTFT target:
    prefill = ceil(req * isl / interval * min(1, prefill_corr)
                   / prefill_thpt_per_gpu(isl) / gpus_per_prefill_engine)
    decode  = ceil(req * osl / interval
                   / best_decode_thpt_per_gpu(itl_target / decode_corr, isl + osl/2)
                   / gpus_per_decode_engine)
* "sla" (default): the SLA is per request, so each pool is sized for a share of
  requests meeting its target, with the latency models of planner.queueing:
  prefill so that `ttft_quantile` of the requests whose own prefill fits in the
  TTFT target meet it (M/G/c wait, prompt lengths spread around the forecast
  mean); decode so that the `itl_quantile` ITL under the pool's KV fluctuation
  meets the ITL target, and never above `decode_max_kv_usage_frac` of KV cache or
  below throughput with `decode_headroom_frac` kept free.

Load: the mean forecast or its upper quantile (`size_on`). A count set now serves
once new replicas are ready, `lead_intervals` intervals ahead, so the upper
quantile is widened to that horizon.

Unreachable targets: when the target is below the best latency the engine can
do for every request (single-request TTFT for prefill, ITL at one running
request for decode), no replica count meets it. We then size for that best
latency plus `unreachable_slack_frac`, report target_reachable = 0 in the
numbers and say so in the message, instead of returning an unbounded count.

Every number behind a result is in PoolSizing.numbers (floats; flags are 0/1).
A pool with no forecast load gets 0 replicas (min_replicas is the decide
step's business); a pool with any load gets at least 1.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from planner.burst import arrival_classes, history_classes
from planner.config import SizingConfig, SloTarget
from planner.profile import DecodeProfile, PrefillProfile
from planner.queueing import (
    MAX_REPLICAS_SEARCH,
    arrival_peakedness,
    ceil_replicas,
    decode_itl_quantile,
    erlang_c,
    mean_wait_s,
    prefill_service_points_ms,
    replicas_for_itl_quantile,
    replicas_for_ttft,
    variability_factor,
    wait_quantile_s,
)
from planner.types import Corrections, Forecast, PoolSizing

# Re-exported: the correction step and older callers import the queue maths from here.
__all__ = [
    "MAX_REPLICAS_SEARCH",
    "ceil_replicas",
    "erlang_c",
    "engine_gpus",
    "lead_intervals",
    "resolve_engine_gpus",
    "mean_wait_s",
    "size_decode",
    "size_prefill",
    "variability_factor",
    "wait_quantile_s",
]

SizeOn = Literal["mean", "p90"]

# -- inputs --------------------------------------------------------------------


def engine_gpus(cfg: SizingConfig, pool: str) -> int:
    """GPUs one replica of the pool uses: as configured (or resolved from the profile), else 1."""
    n = cfg.gpus_per_prefill_engine if pool == "prefill" else cfg.gpus_per_decode_engine
    return 1 if n is None else n


def resolve_engine_gpus(cfg: SizingConfig, *, prefill: int | None, decode: int | None) -> SizingConfig:
    """cfg with each unset GPUs-per-engine taken from the profile's (prefill, decode); the config wins."""
    update = {}
    if cfg.gpus_per_prefill_engine is None and prefill is not None:
        update["gpus_per_prefill_engine"] = prefill
    if cfg.gpus_per_decode_engine is None and decode is not None:
        update["gpus_per_decode_engine"] = decode
    return cfg.model_copy(update=update) if update else cfg


def lead_intervals(*, startup_s: float, interval_s: float) -> int:
    """Planner intervals until a replica added now serves: 1 + ceil(startup_s / interval_s).

    A run at the end of interval k adds replicas that serve from (k+1) x interval
    + startup_s, i.e. from interval k + 1 + ceil(startup/interval); the count a run
    sets is the one that serves then, so that is the horizon to size for.
    """
    return 1 + max(0, math.ceil(startup_s / interval_s - 1e-9))


def _horizon(cfg: SizingConfig, interval_s: float) -> int:
    # The dynamo mode stays the seed formulas: next interval's forecast as is.
    return lead_intervals(startup_s=cfg.replica_startup_s, interval_s=interval_s) if cfg.mode == "sla" else 1


def _load(forecast: Forecast, size_on: SizeOn, *, horizon_intervals: int = 1) -> tuple[float, str]:
    """Requests to size for: the mean, or the upper forecast at the horizon (never below the mean).

    The forecast's upper quantile is one step ahead; a forecast `horizon_intervals`
    steps ahead is as uncertain as the sum of that many one-step errors, so its
    band widens by sqrt(horizon) (random-walk growth; the series the predictors
    face behave so, see docs/predictors.md).
    """
    for name in ("num_requests", "num_requests_p90", "avg_isl_tokens", "avg_osl_tokens"):
        v = getattr(forecast, name)
        if v is None or not math.isfinite(v) or v < 0:
            raise ValueError(f"sizing: forecast.{name} must be a finite number >= 0, got {v!r}")
    if size_on == "mean":
        return forecast.num_requests, "mean"
    if size_on == "p90":
        band = max(0.0, forecast.num_requests_p90 - forecast.num_requests)
        if horizon_intervals <= 1:
            return forecast.num_requests + band, "p90"
        return forecast.num_requests + band * math.sqrt(horizon_intervals), f"p90 {horizon_intervals} intervals ahead"
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
    requests, basis = _load(forecast, size_on, horizon_intervals=_horizon(cfg, interval_s))
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
        "gpus_per_engine": float(engine_gpus(cfg, "prefill")),
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
        raw = load_tps * used / thpt / engine_gpus(cfg, "prefill")
        replicas = max(1, ceil_replicas(raw))
        numbers.update(correction_used=used, raw_replicas=raw, utilization_frac=raw / replicas)
        msg = (
            f"dynamo: {rps:.3g} rps x {isl:.0f} tokens x {used:.2f} = {load_tps * used:.4g} tokens/s "
            f"/ {thpt:.4g} tokens/s/GPU / {engine_gpus(cfg, 'prefill')} GPU = {raw:.2f} -> {replicas}"
        )
        return PoolSizing("prefill", replicas, numbers, msg)

    target_s = slo.ttft_ms / 1000.0
    # Prompt lengths vary, so service times do: the requests that can meet the target
    # at all are those whose own prefill fits in it, and each may wait only the rest.
    service_points_s = prefill_service_points_ms(profile, isl_tokens=isl, isl_cv=cfg.isl_cv) * corr / 1000.0
    service_s = float(np.mean(service_points_s))
    fits = service_points_s < target_s
    reachable_frac = float(np.mean(fits))
    reachable = reachable_frac > 0
    if reachable:
        effective_target_s = target_s
        slack_s = target_s - service_points_s[fits]
    else:
        effective_target_s = service_s * (1.0 + cfg.unreachable_slack_frac)
        slack_s = np.array([effective_target_s - service_s])
    g = variability_factor(cfg.prefill_arrival_cv, cfg.prefill_service_cv)
    queue_kw = dict(
        service_s=service_s,
        slack_s=slack_s,
        share=cfg.ttft_quantile,
        variability=g,
        max_utilization_frac=cfg.prefill_max_utilization_frac,
    )
    replicas, queue = replicas_for_ttft(arrival_rps=rps, **queue_kw)
    burst = ""
    if cfg.burst_basis != "off" and forecast.peak_ratio is not None and forecast.peak_window_s is not None:
        # A share of each interval's requests arrives in its peak window at several times the
        # mean rate: the queue those requests meet is the burst's, not the interval mean's.
        parts, burst_rps, source = _burst_parts(forecast, basis=cfg.burst_basis, rps=rps, interval_s=interval_s)
        if len(parts) > 1:
            r_burst, q_burst = replicas_for_ttft(arrival_rps=burst_rps, classes=parts, **queue_kw)
            share, peak_rps = max(parts, key=lambda p: p[1])
            numbers.update(
                peak_ratio=forecast.peak_ratio,
                peak_window_s=forecast.peak_window_s,
                burst_share_frac=share,
                burst_rps=peak_rps,
                replicas_flat=float(replicas),
                replicas_for_burst=float(r_burst),
            )
            burst = (f"; burst ({source}): {share:.0%} of requests at {peak_rps:.3g} rps in "
                     f"{forecast.peak_window_s:g} s peaks -> {r_burst} replicas, {replicas} flat")
            if r_burst >= replicas:
                replicas, queue = r_burst, q_burst
    numbers.update(queue)
    numbers.update(
        correction_used=corr,
        service_ms=service_s * 1000.0,
        offered_load_erlangs=rps * service_s,
        variability_factor=g,
        ttft_quantile=cfg.ttft_quantile,
        isl_cv=cfg.isl_cv,
        reachable_frac=reachable_frac,
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
    elif len(slack_s) == 1 and reachable_frac == 1.0:
        msg = (
            f"{pct} TTFT {queue['ttft_quantile_ms']:.0f} ms <= {slo.ttft_ms:g} ms with {replicas} replicas "
            f"at {rps:.3g} rps ({basis}), ISL {isl:.0f}, utilisation {queue['utilization_frac']:.2f}"
        )
    else:
        msg = (
            f"TTFT <= {slo.ttft_ms:g} ms for {queue['ttft_met_frac']:.1%} of the {reachable_frac:.1%} of requests "
            f"whose prefill fits in it (ISL {isl:.0f}, CV {cfg.isl_cv:g}) with {replicas} replicas at {rps:.3g} rps "
            f"({basis}), utilisation {queue['utilization_frac']:.2f}"
        )
    msg += burst
    return PoolSizing("prefill", replicas, numbers, msg)


def _burst_parts(
    forecast: Forecast, *, basis: str, rps: float, interval_s: float
) -> tuple[list[tuple[float, float]], float, str]:
    """(share, rate) parts of the traffic to size prefill for, their mean rate (rps), and where they came from.

    history: the recent intervals' peak and off-peak parts as they came, each
    interval weighted by its requests (planner.burst.history_classes); mean /
    upper: the forecast burst ratio applied to the mean / sized forecast rate.
    """
    if basis == "history" and forecast.recent_peaks:
        parts = list(history_classes(forecast.recent_peaks, window_s=forecast.peak_window_s, interval_s=interval_s))
        mean_rps = sum(n for n, _ in forecast.recent_peaks) / (len(forecast.recent_peaks) * interval_s)
        return parts, mean_rps, f"last {len(forecast.recent_peaks)} intervals"
    base = rps if basis == "upper" else forecast.num_requests / interval_s
    classes = arrival_classes(rps=base, ratio=forecast.peak_ratio, window_s=forecast.peak_window_s,
                              interval_s=interval_s)
    return [(w, r) for w, r, _ in classes], base, f"{forecast.peak_ratio:.2f}x the {basis} forecast"


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
    requests, basis = _load(forecast, size_on, horizon_intervals=_horizon(cfg, interval_s))
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
        "gpus_per_engine": float(engine_gpus(cfg, "decode")),
        "max_kv_tokens": float(profile.max_kv_tokens),
    }
    if requests <= 0 or osl <= 0:
        return PoolSizing("decode", 0, numbers, f"no decode load ({requests:g} requests, OSL {osl:g} tokens)")
    corrected_itl = slo.itl_ms / corr
    context_eval, clamped = _within(context, *profile.context_range_tokens)
    op = profile.best_throughput_per_gpu(corrected_itl, context_eval)
    numbers.update(corrected_itl_target_ms=corrected_itl, context_clamped=float(clamped))

    if cfg.mode == "dynamo":
        raw = out_tps / op.throughput_per_gpu / engine_gpus(cfg, "decode")
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
            f"tokens/s/GPU at ITL {corrected_itl:.3g} ms / {engine_gpus(cfg, 'decode')} GPU = {raw:.2f} -> {replicas}"
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
    per_replica_tps = op.throughput_per_gpu * engine_gpus(cfg, "decode")
    usable_tps = per_replica_tps * (1.0 - cfg.decode_headroom_frac)
    r_thpt = out_tps / usable_tps
    # Little's law: requests in decode = arrival rate x time to emit osl tokens at the
    # (corrected) operating ITL; each holds about `context` tokens of KV cache.
    running = rps * osl * op.itl_ms * corr / 1000.0
    kv_tokens = running * context
    r_kv = kv_tokens / (profile.max_kv_tokens * cfg.decode_max_kv_usage_frac)
    r_floor = max(1, ceil_replicas(max(r_thpt, r_kv)))
    # The SLA is per request, so the mean ITL on target is not enough: size for the
    # ITL quantile under the pool's KV fluctuation (see replicas_for_itl_quantile).
    # A target within the unreachable slack of the best ITL would need a near-idle
    # pool to hold at a quantile, so the quantile rule never aims below that.
    idle_itl = profile.itl_ms_at(profile.kv_range_frac(context_eval)[0], context_eval)
    quantile_itl = max(effective_itl, idle_itl * (1.0 + cfg.unreachable_slack_frac))
    r_q, q = replicas_for_itl_quantile(
        profile,
        rps=rps,
        osl_tokens=osl,
        context_tokens=context,
        correction=corr,
        itl_target_ms=quantile_itl * corr,
        quantile=cfg.itl_quantile,
        context_cv=cfg.decode_context_cv,
        peakedness=arrival_peakedness(cfg.prefill_arrival_cv),
    )
    replicas = max(r_floor, r_q)
    if replicas > r_q:
        q = decode_itl_quantile(
            profile, rps=rps, osl_tokens=osl, context_tokens=context, correction=corr, replicas=replicas,
            quantile=cfg.itl_quantile, context_cv=cfg.decode_context_cv,
            peakedness=arrival_peakedness(cfg.prefill_arrival_cv),
        )
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
        replicas_for_itl_quantile=float(r_q),
        itl_quantile=cfg.itl_quantile,
        itl_quantile_target_ms=quantile_itl * corr,
        mean_itl_ms=q["mean_itl_ms"],
        itl_quantile_ms=q["itl_quantile_ms"],
        mean_kv_usage_frac=q["mean_kv_usage_frac"],
        kv_usage_quantile_frac=q["kv_usage_quantile_frac"],
        utilization_frac=out_tps / (replicas * per_replica_tps),
        predicted_kv_usage_frac=per_replica_kv,
        predicted_itl_ms=pred_itl * corr,
    )
    # The first rule that alone asks for this many replicas names the bound.
    bound = next(
        name for n, name in ((ceil_replicas(r_thpt), "throughput"), (ceil_replicas(r_kv), "KV capacity"),
                             (r_q, "ITL quantile"))
        if n >= replicas
    )
    head = (
        f"ITL target {slo.itl_ms:g} ms unreachable: best {best_itl * corr:.3g} ms at context {context:.0f} "
        f"(profile {best_itl:.3g} ms x correction {corr:.2f}); " if not reachable else ""
    )
    pct = f"p{cfg.itl_quantile * 100:g}"
    msg = (
        f"{head}{replicas} replicas ({bound}-bound) for {out_tps:.4g} output tokens/s at {rps:.3g} rps ({basis}): "
        f"{pct} ITL {q['itl_quantile_ms']:.3g} ms (mean {q['mean_itl_ms']:.3g} ms), "
        f"KV {q['mean_kv_usage_frac']:.0%} mean, {q['kv_usage_quantile_frac']:.0%} {pct}; "
        f"{op.throughput_per_gpu:.4g} tokens/s/GPU at ITL {op.itl_ms:.3g} ms, {cfg.decode_headroom_frac:.0%} headroom"
    )
    return PoolSizing("decode", replicas, numbers, msg)
