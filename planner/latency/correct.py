"""Correction factors: observed latency / the latency the profile predicts.

A factor above 1 means the fleet is slower than profiled (different hardware,
overheads the profiler did not see, prefix-cache misses...); sizing scales its
latency expectations by it.

* prefill = observed mean TTFT / expected TTFT at the observed ISL. Expected is
  the profile's single-request TTFT, as in Dynamo, or the mean of the published
  latency model when sizing uses that instead (planner.latency.ttft_view): the factor
  always compares with the source sizing multiplies. With an `isl_cv` (the
  correction's prefill_expected "length_mix"), expected is the mean single-request
  TTFT over the prompt-length mix sizing uses (planner.latency.queueing's
  prompt_length_points at that CV, lengths past the profile extrapolated as sizing
  and the simulator do): the factor then holds only what sizing does not count
  itself. Without it, the mean prompt's TTFT clamped to the profiled lengths, so a
  mean prompt of 24k tokens on a profile measured to 16k reads as slow engines
  (factor 1.64 on Mooncake) that sizing, extrapolating, charges a second time.
  When the caller also passes
  `prefill_replicas` and the sizing config, the expectation includes the
  queueing delay the sizing model (M/G/c, planner.sizing.pools) predicts at the
  observed load, and the factor is the service-time multiplier k that makes
  the model's mean TTFT equal the observed one: k*S + Wq(k*S) = observed.
  That keeps queueing out of the factor, so a congested interval does not
  read as slow engines and double-count the queue at sizing time.
* decode = observed mean ITL / expected ITL at the observed load and context.
  KV usage per decode replica is estimated by Little's law from the observed
  arrival rate, OSL and ITL: running = rps * osl * itl_s / decode_replicas,
  kv = running * context / max_kv_tokens, context = isl + osl/2.

Bounds. A factor is 1.0 (with a note saying why) when corrections are
disabled, the observation is stale, fewer than `min_requests` requests
arrived (cold start), or any input is missing, NaN, zero or negative; so an
empty or broken interval never moves sizing. A computed factor outside
[min_factor, max_factor] is clamped to the nearer bound, also with a note:
a 10x "slowdown" is a measurement problem or an outage, and one interval must
not multiply the fleet by it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq

from planner.signals.burst import arrival_classes, peak_ratio, window_mean_wait_s
from planner.config import CorrectionConfig, SizingConfig
from planner.latency.profile import EngineProfile
from planner.latency.queueing import mean_wait_s, prompt_length_points, variability_factor
from planner.latency.ttft_view import TtftView, ttft_view_of
from planner.types import Corrections, Observation, is_number


def _positive(name: str, value: float | None) -> str | None:
    """None if value is a finite number > 0, else why not."""
    if value is None:
        return f"{name} missing"
    if not is_number(value):
        return f"{name} is {value!r}"
    if value <= 0:
        return f"{name} is {value:g}"
    return None


def _bound(name: str, raw: float, cfg: CorrectionConfig, notes: list[str], detail: str) -> float:
    if raw < cfg.min_factor:
        notes.append(f"{name}: factor {raw:.3g} ({detail}) clamped to min_factor {cfg.min_factor:g}")
        return cfg.min_factor
    if raw > cfg.max_factor:
        notes.append(f"{name}: factor {raw:.3g} ({detail}) clamped to max_factor {cfg.max_factor:g}")
        return cfg.max_factor
    return raw


def _clamp_quiet(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def _prefill_factor(
    obs: Observation,
    profile: EngineProfile,
    cfg: CorrectionConfig,
    notes: list[str],
    prefill_replicas: int | None,
    sizing: SizingConfig | None,
    ttft: TtftView,
    isl_cv: float | None,
) -> float:
    why = _positive("avg_ttft_ms", obs.avg_ttft_ms) or _positive("avg_isl_tokens", obs.avg_isl_tokens)
    if why:
        notes.append(f"prefill: factor 1 ({why})")
        return 1.0
    if isl_cv is not None:
        service_ms = expected_prefill_ms(ttft, isl_tokens=obs.avg_isl_tokens, isl_cv=isl_cv)
        notes.append(f"prefill: expected TTFT {service_ms:.4g} ms, the mean over prompts of mean "
                     f"{obs.avg_isl_tokens:.0f} tokens at CV {isl_cv:.3g}")
    else:
        lo, hi = profile.prefill.isl_range_tokens
        isl = obs.avg_isl_tokens
        # The profiled range is where the profile was measured; a published model's view
        # covers any length itself (planner.latency.ttft_view), so only the profile is clamped.
        if not ttft.published and not lo <= isl <= hi:
            notes.append(f"prefill: ISL {isl:g} tokens outside profiled {lo:g}..{hi:g}; expected TTFT at the nearer end")
            isl = _clamp_quiet(isl, lo, hi)
        # The factor says how far observation is from the source sizing will use, so it
        # compares with that source's mean: the profile, or the published model.
        service_ms = ttft.ttft_ms_at(isl)
    observed = obs.avg_ttft_ms
    if prefill_replicas is None or sizing is None or prefill_replicas < 1:
        raw = observed / service_ms
        return _bound("prefill", raw, cfg, notes, f"{observed:.4g} ms / {service_ms:.4g} ms")

    rps = obs.num_requests / obs.interval_s
    g = variability_factor(sizing.prefill_arrival_cv, sizing.prefill_service_cv)
    ratio = peak_ratio(num_requests=obs.num_requests, peak_rps=obs.peak_rps, interval_s=obs.interval_s,
                       window_s=obs.peak_window_s) if cfg.burst_aware else None
    if ratio is not None:
        return _burst_prefill_factor(obs, cfg, notes, prefill_replicas, service_ms, rps, g, ratio)

    def model_ms(k: float) -> float:
        s = k * service_ms / 1000.0
        w = mean_wait_s(servers=prefill_replicas, arrival_rps=rps, service_s=s, variability=g)
        return 1000.0 * (s + w) if math.isfinite(w) else math.inf

    detail = f"{observed:.4g} ms observed vs M/G/{prefill_replicas} model at {rps:.3g} rps, service {service_ms:.4g} ms"
    # The model's mean TTFT rises with k and is unbounded as k*S*rps approaches the replica count.
    k_unstable = prefill_replicas / (rps * service_ms / 1000.0) if rps > 0 else math.inf
    if k_unstable <= cfg.min_factor:
        notes.append(
            f"prefill: queue model overloaded at the observed load ({rps:.3g} rps x {service_ms:.4g} ms "
            f"on {prefill_replicas} replicas); plain TTFT ratio used"
        )
        return _bound("prefill", observed / service_ms, cfg, notes, f"{observed:.4g} ms / {service_ms:.4g} ms")
    return _solve_prefill_factor(model_ms, observed, cfg, notes, detail,
                                 k_hi=min(cfg.max_factor, k_unstable * (1.0 - 1e-9)))


def expected_prefill_ms(ttft: TtftView, *, isl_tokens: float, isl_cv: float) -> float:
    """Mean single-request TTFT (ms) over prompts of mean `isl_tokens` (tokens) at CV `isl_cv` (Gamma):
    the service time SLA sizing charges per request before its factor (planner.sizing.sla)."""
    if not (is_number(isl_tokens) and isl_tokens > 0):
        raise ValueError(f"expected_prefill_ms: isl_tokens must be a number > 0, got {isl_tokens!r}")
    if not (is_number(isl_cv) and isl_cv >= 0):
        raise ValueError(f"expected_prefill_ms: isl_cv must be a number >= 0, got {isl_cv!r}")
    if isl_cv == 0:
        # one length: the view's scalar path, bit for bit what the clamped rule reads inside the profile
        return ttft.ttft_ms_at(isl_tokens)
    lengths = prompt_length_points(isl_tokens=isl_tokens, isl_cv=isl_cv)
    return float(np.mean(ttft.ttft_ms_many(lengths, quantile="mean")))


def _solve_prefill_factor(
    model_ms, observed: float, cfg: CorrectionConfig, notes: list[str], detail: str, *, k_hi: float
) -> float:
    """The k in [min_factor, k_hi] where the queue model's mean TTFT (rising in k) meets the
    observed one; clamped to an end of that range, with a note, when it lies outside."""
    if observed <= model_ms(cfg.min_factor):
        notes.append(f"prefill: factor clamped to min_factor {cfg.min_factor:g} ({detail})")
        return cfg.min_factor
    if observed >= model_ms(k_hi):
        notes.append(f"prefill: factor clamped to max_factor {cfg.max_factor:g} ({detail})" if k_hi == cfg.max_factor
                     else f"prefill: factor {k_hi:.3g}, the most the queue model allows ({detail})")
        return k_hi
    return brentq(lambda k: model_ms(k) - observed, cfg.min_factor, k_hi, xtol=1e-9)


def _burst_prefill_factor(
    obs: Observation, cfg: CorrectionConfig, notes: list[str], replicas: int, service_ms: float, rps: float,
    g: float, ratio: float,
) -> float:
    """The service-time factor k with the interval's burst in the queue model (planner.signals.burst).

    The share of requests in the peak window met that window's queue, the rest the
    rest of the interval's; each part's wait is the window-limited M/G/c wait, finite
    at any load, so a burst above the pool's capacity is explained by its backlog
    rather than by slow engines.
    """
    classes = arrival_classes(rps=rps, ratio=ratio, window_s=obs.peak_window_s, interval_s=obs.interval_s)

    def model_ms(k: float) -> float:
        s = k * service_ms / 1000.0
        total = 0.0
        for share, rate, window_s in classes:
            stationary = mean_wait_s(servers=replicas, arrival_rps=rate, service_s=s, variability=g)
            total += share * (s + window_mean_wait_s(servers=replicas, arrival_rps=rate, service_s=s, variability=g,
                                                     window_s=window_s, stationary_wait_s=stationary))
        return 1000.0 * total

    detail = (f"{obs.avg_ttft_ms:.4g} ms observed vs M/G/{replicas} model with a {obs.peak_window_s:g} s burst "
              f"at {ratio:.2f}x {rps:.3g} rps, service {service_ms:.4g} ms")
    return _solve_prefill_factor(model_ms, obs.avg_ttft_ms, cfg, notes, detail, k_hi=cfg.max_factor)


def _decode_factor(
    obs: Observation, profile: EngineProfile, cfg: CorrectionConfig, notes: list[str], decode_replicas: float
) -> float:
    why = (
        _positive("avg_itl_ms", obs.avg_itl_ms)
        or _positive("avg_isl_tokens", obs.avg_isl_tokens)
        or _positive("avg_osl_tokens", obs.avg_osl_tokens)
        or (None if decode_replicas >= 1 else f"decode_replicas is {decode_replicas}")
    )
    if why:
        notes.append(f"decode: factor 1 ({why})")
        return 1.0
    dec = profile.decode
    context = obs.avg_isl_tokens + obs.avg_osl_tokens / 2.0
    c_lo, c_hi = dec.context_range_tokens
    if not c_lo <= context <= c_hi:
        notes.append(f"decode: context {context:g} tokens outside profiled {c_lo:g}..{c_hi:g}; used the nearer end")
        context = _clamp_quiet(context, c_lo, c_hi)
    rps = obs.num_requests / obs.interval_s
    running = rps * obs.avg_osl_tokens * obs.avg_itl_ms / 1000.0 / decode_replicas
    kv = dec.kv_usage_for(running, context)
    _, kv_hi = dec.kv_range_frac(context)
    if kv > kv_hi:
        notes.append(f"decode: estimated KV usage {kv:.3g} above profiled {kv_hi:.3g}; used {kv_hi:.3g}")
        kv = kv_hi
    expected = dec.itl_ms_at(kv, context)
    return _bound(
        "decode", obs.avg_itl_ms / expected, cfg, notes,
        f"{obs.avg_itl_ms:.4g} ms / {expected:.4g} ms at KV {kv:.3g}, context {context:.0f}",
    )


def correction_factors(
    obs: Observation,
    *,
    profile: EngineProfile,
    decode_replicas: float,
    cfg: CorrectionConfig,
    prefill_replicas: int | None = None,
    sizing: SizingConfig | None = None,
    ttft_view: TtftView | None = None,
    isl_cv: float | None = None,
) -> Corrections:
    """Bounded observed/expected latency factors for both pools (see the module docstring).

    decode_replicas: decode replicas serving during the observed interval (time-weighted: may be fractional).
    prefill_replicas, sizing: optional; with both, the prefill factor separates
        queueing delay from service time using the sizing queue model.
    ttft_view: the expected single-request TTFT (planner.latency.ttft_view); None: the profile's.
    isl_cv: prompt-length CV: prefill's expectation is the mean over that length mix, past the profile
        extrapolated (correction.prefill_expected "length_mix"); None: the mean prompt's, clamped to the profile.
    """
    if not cfg.enabled:
        return Corrections(1.0, 1.0, enabled=False, notes=("corrections disabled",))
    if obs.is_stale:
        return Corrections(1.0, 1.0, notes=(f"stale observation ({'; '.join(obs.stale_reasons)}): factors 1",))
    why = _positive("num_requests", obs.num_requests) or _positive("interval_s", obs.interval_s)
    if why:
        return Corrections(1.0, 1.0, notes=(f"no load to compare ({why}): factors 1",))
    if obs.num_requests < cfg.min_requests:
        return Corrections(
            1.0, 1.0,
            notes=(f"cold start: {obs.num_requests:g} requests < min_requests {cfg.min_requests:g}: factors 1",),
        )
    notes: list[str] = []
    prefill = _prefill_factor(obs, profile, cfg, notes, prefill_replicas, sizing,
                              ttft_view_of(profile.prefill, ttft_view), isl_cv)
    decode = _decode_factor(obs, profile, cfg, notes, decode_replicas)
    return Corrections(prefill=float(prefill), decode=float(decode), notes=tuple(notes))
