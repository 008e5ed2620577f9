"""Replicas each pool needs to meet the SLA at the forecast load: the inputs and the choice of mode.

Two modes (SizingConfig.mode), each in its own module: "sla" (default,
planner.sizing.sla) sizes each pool so a share of its requests meets the
latency target; "dynamo-1.0.2" (planner.sizing.dynamo) is Dynamo 1.0.2's throughput
formulas, 100% of profiled throughput ("dynamo" is its deprecated alias). Both read the same `SizingLoad`, built here.

Load: the mean forecast or its upper quantile (`size_on`). A count set now serves
once new replicas are ready, `lead_intervals` intervals ahead, so the upper
quantile is widened to that horizon.

Every number behind a result is in PoolSizing.numbers (floats; flags are 0/1).
A pool with no forecast load gets 0 replicas (min_replicas is the decide
step's business); a pool with any load gets at least 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from planner.config import SizingConfig, SloTarget
from planner.latency.decode_profile import DecodeProfile
from planner.latency.profile import PrefillProfile
from planner.sizing.dynamo import dynamo_decode, dynamo_prefill
from planner.sizing.sla import sla_decode, sla_prefill
from planner.latency.ttft_view import TtftView, ttft_view_of
from planner.types import Corrections, Forecast, PoolSizing, SizingLoad

__all__ = ["engine_gpus", "lead_intervals", "resolve_engine_gpus", "size_decode", "size_prefill"]

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
    return sized_value(forecast.num_requests, forecast.num_requests_p90, size_on, horizon_intervals=horizon_intervals)


def sized_value(mean: float, upper: float, size_on: SizeOn, *, horizon_intervals: int = 1) -> tuple[float, str]:
    """(value to size for, its basis): the mean, or the upper forecast widened to the horizon by
    sqrt(horizon_intervals) (never below the mean)."""
    if size_on == "mean":
        return mean, "mean"
    if size_on == "p90":
        band = max(0.0, upper - mean)
        if horizon_intervals <= 1:
            return mean + band, "p90"
        return mean + band * math.sqrt(horizon_intervals), f"p90 {horizon_intervals} intervals ahead"
    raise ValueError(f"sizing: size_on must be 'mean' or 'p90', got {size_on!r}")


def _prompt_token_load(forecast: Forecast, load: SizingLoad, requests: float, *, cfg: SizingConfig, size_on: SizeOn,
                       numbers: dict[str, float]) -> tuple[float, SizingLoad]:
    """(requests, load) for prefill from the prompt-token forecast when there is one: the sized tokens over the
    mean ISL forecast, the requests that carry that prefill work; else as given."""
    if forecast.prompt_tokens is None or forecast.prompt_tokens_p90 is None:
        return requests, load
    for name in ("prompt_tokens", "prompt_tokens_p90"):
        v = getattr(forecast, name)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"sizing: forecast.{name} must be a finite number >= 0, got {v!r}")
    tokens, basis = sized_value(forecast.prompt_tokens, forecast.prompt_tokens_p90, size_on,
                                horizon_intervals=_horizon(cfg, load.interval_s))
    numbers.update(prompt_tokens=tokens, requests_from_count=requests)
    if load.isl_tokens <= 0:
        return requests, load
    requests = tokens / load.isl_tokens
    return requests, dataclasses.replace(load, rps=requests / load.interval_s, basis=f"prompt tokens, {basis}")


def _check_interval(interval_s: float) -> None:
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"sizing: interval_s must be > 0, got {interval_s!r}")


def _factor(value: float, enabled: bool) -> float:
    return value if enabled and math.isfinite(value) and value > 0 else 1.0


def _within(value: float, lo: float, hi: float) -> tuple[float, bool]:
    """Clamp to the profiled range; the flag goes into the numbers instead of a warning."""
    clamped = min(max(value, lo), hi)
    return clamped, clamped != value


def _with_length_shape(cfg: SizingConfig, forecast: Forecast) -> tuple[SizingConfig, float]:
    """cfg with the measured length CVs when it asks for them and they were measured; (cfg, 1.0 if measured)."""
    shape = forecast.length_shape
    if cfg.length_cv != "measured" or shape is None:
        return cfg, 0.0
    return cfg.model_copy(update={"isl_cv": shape.isl_cv, "decode_context_cv": shape.decode_context_cv}), 1.0


def _sizing_load(
    forecast: Forecast, *, correction: float, cfg: SizingConfig, pool: str, interval_s: float, size_on: SizeOn,
    measured: float = 0.0,
) -> tuple[float, SizingLoad]:
    """(requests to size for, the load the modes read) for one pool."""
    _check_interval(interval_s)
    requests, basis = _load(forecast, size_on, horizon_intervals=_horizon(cfg, interval_s))
    return requests, SizingLoad(
        rps=requests / interval_s,
        basis=basis,
        isl_tokens=forecast.avg_isl_tokens,
        osl_tokens=forecast.avg_osl_tokens,
        correction=correction,
        gpus_per_engine=engine_gpus(cfg, pool),
        interval_s=interval_s,
        length_cv_source="measured" if measured else "configured",
    )


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
    ttft_view: TtftView | None = None,
) -> PoolSizing:
    """Prefill replicas for the forecast load, in the configured mode (planner.sizing.sla or sizing_dynamo).

    interval_s: the forecast's interval, seconds (requests / interval_s = rps).
    size_on: size on the mean forecast or its p90.
    ttft_view: single-request TTFT to size with (planner.latency.ttft_view); None: the
        profile's. Throughput per GPU (the dynamo mode) always comes from the profile.
    """
    ttft = ttft_view_of(profile, ttft_view)
    cfg, measured = _with_length_shape(cfg, forecast)
    corr = _factor(corrections.prefill, corrections.enabled)
    requests, load = _sizing_load(forecast, correction=corr, cfg=cfg, pool="prefill", interval_s=interval_s,
                                  size_on=size_on, measured=measured)
    numbers: dict[str, float] = {}
    requests, load = _prompt_token_load(forecast, load, requests, cfg=cfg, size_on=size_on, numbers=numbers)
    isl, rps = load.isl_tokens, load.rps
    numbers |= {
        "requests": requests,
        "load_rps": rps,
        "isl_tokens": isl,
        "interval_s": interval_s,
        "prefill_correction": corr,
        "ttft_target_ms": slo.ttft_ms,
        "forecast_upper_rps": forecast.num_requests_p90 / interval_s,
        "replica_startup_s": cfg.replica_startup_s,
        "gpus_per_engine": float(load.gpus_per_engine),
        "length_cv_measured": measured,
        "sized_on_mean": float(size_on == "mean"),
    }
    if requests <= 0 or isl <= 0:
        return PoolSizing("prefill", 0, numbers, f"no prefill load ({requests:g} requests, ISL {isl:g} tokens)")
    isl_eval, clamped = _within(isl, *profile.isl_range_tokens)
    thpt = profile.throughput_per_gpu_at(isl_eval)
    numbers["throughput_per_gpu"] = thpt
    numbers["single_request_ttft_ms"] = ttft.ttft_ms_at(isl_eval)
    numbers["isl_clamped"] = float(clamped)
    numbers["prefill_tokens_per_s"] = rps * isl
    if cfg.mode == "dynamo-1.0.2":
        return dynamo_prefill(load, throughput_per_gpu=thpt, numbers=numbers)
    return sla_prefill(load, forecast, ttft=ttft, slo=slo, cfg=cfg, numbers=numbers)


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
    """Decode replicas for the forecast load, in the configured mode (planner.sizing.sla or sizing_dynamo).

    interval_s: the forecast's interval, seconds. size_on: mean or p90 forecast.
    """
    cfg, measured = _with_length_shape(cfg, forecast)
    corr = _factor(corrections.decode, corrections.enabled)
    requests, load = _sizing_load(forecast, correction=corr, cfg=cfg, pool="decode", interval_s=interval_s,
                                  size_on=size_on, measured=measured)
    isl, osl, rps = load.isl_tokens, load.osl_tokens, load.rps
    context = isl + osl / 2.0
    numbers: dict[str, float] = {
        "requests": requests,
        "load_rps": rps,
        "isl_tokens": isl,
        "osl_tokens": osl,
        "context_tokens": context,
        "interval_s": interval_s,
        "output_tokens_per_s": rps * osl,
        "decode_correction": corr,
        "forecast_upper_rps": forecast.num_requests_p90 / interval_s,
        "replica_startup_s": cfg.replica_startup_s,
        "itl_target_ms": slo.itl_ms,
        "gpus_per_engine": float(load.gpus_per_engine),
        "max_kv_tokens": float(profile.max_kv_tokens),
        "length_cv_measured": measured,
        "sized_on_mean": float(size_on == "mean"),
    }
    if requests <= 0 or osl <= 0:
        return PoolSizing("decode", 0, numbers, f"no decode load ({requests:g} requests, OSL {osl:g} tokens)")
    corrected_itl = slo.itl_ms / corr
    context_eval, clamped = _within(context, *profile.context_range_tokens)
    op = profile.best_throughput_per_gpu(corrected_itl, context_eval)
    numbers.update(corrected_itl_target_ms=corrected_itl, context_clamped=float(clamped))
    if cfg.mode == "dynamo-1.0.2":
        return dynamo_decode(load, op=op, corrected_itl_ms=corrected_itl, numbers=numbers)
    return sla_decode(load, op=op, corrected_itl_ms=corrected_itl, context_eval_tokens=context_eval, profile=profile,
                      slo=slo, cfg=cfg, numbers=numbers)
