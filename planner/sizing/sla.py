"""The SLA sizing mode: each pool sized so a share of its requests meets the latency target.

The SLA is per request, so each pool is sized for a share of requests meeting
its target, with the latency models of planner.latency.queueing: prefill so that
`ttft_quantile` of the requests whose own prefill fits in the TTFT target meet
it (M/G/c wait, prompt lengths spread around the forecast mean); decode so that
the `itl_quantile` ITL under the pool's KV fluctuation meets the ITL target, and
never above `decode_max_kv_usage_frac` of KV cache or below throughput with
`decode_headroom_frac` kept free.

Unreachable targets: when the target is below the best latency the engine can
do for every request (single-request TTFT for prefill, ITL at one running
request for decode), no replica count meets it. We then size for that best
latency plus `unreachable_slack_frac`, report target_reachable = 0 in the
numbers and say so in the message, instead of returning an unbounded count.

Prefill's single-request TTFT comes from a `planner.latency.ttft_view.TtftView`: the
profile, or the published latency model the router uses (its mean is the
service time, its p90 the reachability check); the message names the source and
the numbers carry ttft_from_published_model (0/1).
"""

from __future__ import annotations

import numpy as np

from planner.signals.burst import arrival_classes, history_classes
from planner.config import SizingConfig, SloTarget
from planner.latency.decode_profile import DecodeOperatingPoint, DecodeProfile
from planner.latency.queueing import (
    arrival_peakedness,
    ceil_replicas,
    decode_itl_quantile,
    prompt_length_points,
    replicas_for_itl_quantile,
    replicas_for_ttft,
    variability_factor,
)
from planner.latency.ttft_view import TtftView
from planner.types import Forecast, PoolSizing, SizingLoad

# -- prefill -------------------------------------------------------------------


def sla_prefill(
    load: SizingLoad,
    forecast: Forecast,
    *,
    ttft: TtftView,
    slo: SloTarget,
    cfg: SizingConfig,
    numbers: dict[str, float],
) -> PoolSizing:
    """Prefill replicas so cfg.ttft_quantile of the requests that can meet slo.ttft_ms do (M/G/c wait).

    ttft: single-request TTFT by prompt length (planner.latency.ttft_view: the profile or a
        published model): its mean is the service time, its p90 decides which
        requests can meet the target and how long each may wait.
    forecast: its burst figures (peak ratio and window, recent peaks) size
        for sub-interval bursts too (cfg.burst_basis).
    numbers: the dispatcher's figures; this mode's are added to them.
    """
    rps, isl, corr = load.rps, load.isl_tokens, load.correction
    target_s = slo.ttft_ms / 1000.0
    # Prompt lengths vary, so service times do: the requests that can meet the target
    # at all are those whose own prefill fits in it, and each may wait only the rest.
    lengths = prompt_length_points(isl_tokens=isl, isl_cv=cfg.isl_cv)
    service_points_s = ttft.ttft_ms_many(lengths, quantile="mean") * corr / 1000.0
    # A model's p90 keeps requests that only make the target on a good day out of the
    # reachable set (the profile has one figure per length: its p90 is its mean).
    own_points_s = ttft.ttft_ms_many(lengths, quantile="p90") * corr / 1000.0
    service_s = float(np.mean(service_points_s))
    own_s = float(np.mean(own_points_s))
    fits = own_points_s < target_s
    reachable_frac = float(np.mean(fits))
    reachable = reachable_frac > 0
    if reachable:
        effective_target_s = target_s
        slack_s = target_s - own_points_s[fits]
    else:
        effective_target_s = own_s * (1.0 + cfg.unreachable_slack_frac)
        slack_s = np.array([effective_target_s - own_s])
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
        replicas, queue, burst = _size_for_burst(
            load, forecast, basis=cfg.burst_basis, flat=(replicas, queue), queue_kw=queue_kw, numbers=numbers)
    numbers.update(queue)
    numbers.update(
        correction_used=corr,
        service_ms=service_s * 1000.0,
        service_p90_ms=own_s * 1000.0,
        ttft_from_published_model=float(ttft.published),
        offered_load_erlangs=rps * service_s,
        variability_factor=g,
        ttft_quantile=cfg.ttft_quantile,
        isl_cv=cfg.isl_cv,
        reachable_frac=reachable_frac,
        target_reachable=float(reachable),
        effective_ttft_target_ms=effective_target_s * 1000.0,
        max_utilization_frac=cfg.prefill_max_utilization_frac,
    )
    msg = _prefill_message(load, slo=slo, cfg=cfg, replicas=replicas, queue=queue, service_s=own_s,
                           reachable_frac=reachable_frac, effective_target_s=effective_target_s,
                           slack_points=len(slack_s))
    return PoolSizing("prefill", replicas, numbers, f"{msg}{burst}; TTFT from {ttft.source}")


def _size_for_burst(
    load: SizingLoad, forecast: Forecast, *, basis: str, flat: tuple[int, dict], queue_kw: dict,
    numbers: dict[str, float],
) -> tuple[int, dict, str]:
    """(replicas, queue figures, message tail): the burst sizing when it asks more than the flat one (`flat`)."""
    replicas, queue = flat
    # A share of each interval's requests arrives in its peak window at several times the
    # mean rate: the queue those requests meet is the burst's, not the interval mean's.
    parts, burst_rps, source = _burst_parts(forecast, basis=basis, rps=load.rps, interval_s=load.interval_s)
    if len(parts) <= 1:
        return replicas, queue, ""
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
        return r_burst, q_burst, burst
    return replicas, queue, burst


def _prefill_message(
    load: SizingLoad, *, slo: SloTarget, cfg: SizingConfig, replicas: int, queue: dict, service_s: float,
    reachable_frac: float, effective_target_s: float, slack_points: int,
) -> str:
    rps, isl = load.rps, load.isl_tokens
    pct = f"p{cfg.ttft_quantile * 100:g}"
    if reachable_frac <= 0:
        return (
            f"TTFT target {slo.ttft_ms:g} ms unreachable: single-request TTFT {service_s * 1000:.0f} ms "
            f"at ISL {isl:.0f}; sized {replicas} for {pct} TTFT {queue['ttft_quantile_ms']:.0f} ms "
            f"<= {effective_target_s * 1000:.0f} ms at {rps:.3g} rps"
        )
    if slack_points == 1 and reachable_frac == 1.0:
        return (
            f"{pct} TTFT {queue['ttft_quantile_ms']:.0f} ms <= {slo.ttft_ms:g} ms with {replicas} replicas "
            f"at {rps:.3g} rps ({load.basis}), ISL {isl:.0f}, utilisation {queue['utilization_frac']:.2f}"
        )
    return (
        f"TTFT <= {slo.ttft_ms:g} ms for {queue['ttft_met_frac']:.1%} of the {reachable_frac:.1%} of requests "
        f"whose prefill fits in it (ISL {isl:.0f}, CV {cfg.isl_cv:.3g} {load.length_cv_source}) with {replicas} "
        f"replicas at {rps:.3g} rps ({load.basis}), utilisation {queue['utilization_frac']:.2f}"
    )


def _burst_parts(
    forecast: Forecast, *, basis: str, rps: float, interval_s: float
) -> tuple[list[tuple[float, float]], float, str]:
    """(share, rate) parts of the traffic to size prefill for, their mean rate (rps), and where they came from.

    history: the recent intervals' peak and off-peak parts as they came, each
    interval weighted by its requests (planner.signals.burst.history_classes); mean /
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


def sla_decode(
    load: SizingLoad,
    *,
    op: DecodeOperatingPoint,
    corrected_itl_ms: float,
    context_eval_tokens: float,
    profile: DecodeProfile,
    slo: SloTarget,
    cfg: SizingConfig,
    numbers: dict[str, float],
) -> PoolSizing:
    """Decode replicas for the p(itl_quantile) ITL under KV fluctuation, never below throughput or KV capacity.

    op: the profile's best operating point at corrected_itl_ms (ms).
    context_eval_tokens: the load's context clamped to the profiled range, tokens.
    numbers: the dispatcher's figures; this mode's are added to them.
    """
    rps, osl, corr = load.rps, load.osl_tokens, load.correction
    context = load.isl_tokens + osl / 2.0
    out_tps = rps * osl
    reachable = op.meets_target
    best_itl = op.itl_ms
    effective_itl = corrected_itl_ms
    if not reachable:
        effective_itl = op.itl_ms * (1.0 + cfg.unreachable_slack_frac)
        op = profile.best_throughput_per_gpu(effective_itl, context_eval_tokens)
    per_replica_tps = op.throughput_per_gpu * load.gpus_per_engine
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
    idle_itl = profile.itl_ms_at(profile.kv_range_frac(context_eval_tokens)[0], context_eval_tokens)
    quantile_itl = max(effective_itl, idle_itl * (1.0 + cfg.unreachable_slack_frac))
    quantile_kw = dict(rps=rps, osl_tokens=osl, context_tokens=context, correction=corr, quantile=cfg.itl_quantile,
                       context_cv=cfg.decode_context_cv, peakedness=arrival_peakedness(cfg.prefill_arrival_cv))
    r_q, q = replicas_for_itl_quantile(profile, itl_target_ms=quantile_itl * corr, **quantile_kw)
    replicas = max(r_floor, r_q)
    if replicas > r_q:
        q = decode_itl_quantile(profile, replicas=replicas, **quantile_kw)
    per_replica_kv = kv_tokens / (replicas * profile.max_kv_tokens)
    pred_itl = profile.itl_ms_at(min(per_replica_kv, profile.kv_range_frac(context_eval_tokens)[1]),
                                 context_eval_tokens)
    numbers.update(
        target_reachable=float(reachable), effective_itl_target_ms=effective_itl, best_itl_ms=best_itl,
        throughput_per_gpu=op.throughput_per_gpu, op_kv_usage_frac=op.kv_usage_frac, op_itl_ms=op.itl_ms,
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
    return PoolSizing("decode", replicas, numbers, _decode_message(load, slo=slo, cfg=cfg, op=op, numbers=numbers,
                                                                   replicas=replicas))


def _decode_message(
    load: SizingLoad, *, slo: SloTarget, cfg: SizingConfig, op: DecodeOperatingPoint, numbers: dict[str, float],
    replicas: int,
) -> str:
    rps, osl, corr = load.rps, load.osl_tokens, load.correction
    context = load.isl_tokens + osl / 2.0
    out_tps = rps * osl
    best_itl = numbers["best_itl_ms"]
    # The first rule that alone asks for this many replicas names the bound.
    bound = next(
        name for n, name in ((ceil_replicas(numbers["replicas_for_throughput"]), "throughput"),
                             (ceil_replicas(numbers["replicas_for_kv"]), "KV capacity"),
                             (int(numbers["replicas_for_itl_quantile"]), "ITL quantile"))
        if n >= replicas
    )
    head = (
        f"ITL target {slo.itl_ms:g} ms unreachable: best {best_itl * corr:.3g} ms at context {context:.0f} "
        f"(profile {best_itl:.3g} ms x correction {corr:.2f}); " if not numbers["target_reachable"] else ""
    )
    pct = f"p{cfg.itl_quantile * 100:g}"
    return (
        f"{head}{replicas} replicas ({bound}-bound) for {out_tps:.4g} output tokens/s at {rps:.3g} rps ({load.basis}): "
        f"{pct} ITL {numbers['itl_quantile_ms']:.3g} ms (mean {numbers['mean_itl_ms']:.3g} ms), "
        f"KV {numbers['mean_kv_usage_frac']:.0%} mean, {numbers['kv_usage_quantile_frac']:.0%} {pct} "
        f"(context CV {cfg.decode_context_cv:.3g} {load.length_cv_source}); "
        f"{op.throughput_per_gpu:.4g} tokens/s/GPU at ITL {op.itl_ms:.3g} ms, {cfg.decode_headroom_frac:.0%} headroom"
    )
