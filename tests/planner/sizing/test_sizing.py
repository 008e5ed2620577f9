"""Replica sizing, both modes, with hand arithmetic on the hand-made profiles (see fixtures_profile).

Hand prefill: TTFT = 0.1 ms/token, throughput 10,000 tokens/s/GPU.
Hand decode, context row 1000: ITL = 7.5 + 25*kv ms, throughput = 10,000*kv tokens/s/GPU, max_kv 100,000.
A forecast with ISL 900 and OSL 200 lands exactly on context 900 + 200/2 = 1000.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.profiles import load_profile_dir
from planner.config import SizingConfig, SloTarget
from planner.latency.queueing import (
    ceil_replicas,
    decode_itl_quantile,
    erlang_c,
    mean_wait_s,
    replicas_for_itl_quantile,
    replicas_for_ttft,
    variability_factor,
    wait_quantile_s,
)
from planner.sizing.pools import lead_intervals, size_decode, size_prefill
from planner.types import Corrections, Forecast
from tests.support.fixtures_profile import linear_decode, linear_prefill

DYNAMO = SizingConfig(mode="dynamo-1.0.2")
SLA = SizingConfig()  # defaults: 99% of reachable requests, p99 ITL, prompt/context CV 1, g = 1, no extra headroom
# One prompt length (isl_cv 0), the p95 TTFT and a decode sized on throughput with 15% headroom (the ITL
# quantile at .51 is about the mean ITL: it binds only where the mean ITL itself would miss): the
# single-class arithmetic the tables below work out by hand. isl_cv 0 reduces the per-request criterion
# to "S + Wq_p95 <= target" exactly.
# No startup lead either: the p90 is the next interval's.
CLASSIC = SizingConfig(
    ttft_quantile=0.95, isl_cv=0.0, itl_quantile=0.51, decode_headroom_frac=0.15, replica_startup_s=0.0
)


def fc(requests: float, *, isl: float = 1000.0, osl: float = 200.0, p90: float | None = None) -> Forecast:
    return Forecast(
        num_requests=requests, avg_isl_tokens=isl, avg_osl_tokens=osl,
        num_requests_p90=requests if p90 is None else p90, predictor="test",
    )


def prefill(forecast, *, cfg=CLASSIC, corr=1.0, ttft_ms=200.0, size_on="mean", enabled=True):
    return size_prefill(
        forecast, corrections=Corrections(prefill=corr, enabled=enabled), profile=linear_prefill(),
        slo=SloTarget(ttft_ms=ttft_ms, itl_ms=25.0), cfg=cfg, interval_s=60.0, size_on=size_on,
    )


def decode(forecast, *, cfg=CLASSIC, corr=1.0, itl_ms=25.0, size_on="mean", max_kv_tokens=1_000_000):
    return size_decode(
        forecast, corrections=Corrections(decode=corr), profile=linear_decode(max_kv_tokens=max_kv_tokens),
        slo=SloTarget(ttft_ms=200.0, itl_ms=itl_ms), cfg=cfg, interval_s=60.0, size_on=size_on,
    )


# -- queueing maths ---------------------------------------------------------------


@pytest.mark.parametrize("servers, load, expected", [
    pytest.param(1, 0.5, 0.5, id="M/M/1: P(wait) = rho = 0.5"),
    pytest.param(2, 1.0, 1 / 3, id="M/M/2, a=1: B=0.2, C = 2*0.2/(2-0.8) = 1/3"),
    pytest.param(2, 0.5, 0.1, id="M/M/2, a=0.5: B=1/13, C = (2/13)/(2-0.5*12/13) = 0.1"),
    pytest.param(3, 3.0, 1.0, id="a >= c: unstable, always waits"),
    pytest.param(4, 0.0, 0.0, id="no load: never waits"),
])
def test_erlang_c(servers, load, expected):
    assert erlang_c(servers, load) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kw, expected_s", [
    pytest.param(dict(servers=1, arrival_rps=0.5, service_s=1.0, quantile=0.95, variability=1.0), 2 * math.log(10),
                 id="M/M/1 rho .5: P(W>t)=.5 e^(-.5t); p95: t = ln(.5/.05)/.5 = 4.605 s"),
    pytest.param(dict(servers=1, arrival_rps=0.5, service_s=1.0, quantile=0.95, variability=0.5), math.log(10),
                 id="M/D/1 (g=1/2): half the M/M/1 wait, 2.303 s"),
    pytest.param(dict(servers=2, arrival_rps=5.0, service_s=0.1, quantile=0.95, variability=1.0), 0.1 / 1.5 * math.log(2),
                 id="M/M/2 a=.5: C=.1 > .05: .1/1.5*ln(.1/.05) = 46.2 ms"),
    pytest.param(dict(servers=3, arrival_rps=5.0, service_s=0.1, quantile=0.95, variability=1.0), 0.0,
                 id="M/M/3 a=.5: C=.0152 <= .05: p95 wait 0"),
    pytest.param(dict(servers=1, arrival_rps=20.0, service_s=0.1, quantile=0.95, variability=1.0), math.inf,
                 id="a=2 on 1 server: unstable -> inf"),
])
def test_wait_quantile(kw, expected_s):
    assert wait_quantile_s(**kw) == pytest.approx(expected_s, rel=1e-9)


@pytest.mark.parametrize("variability, expected_s", [
    pytest.param(1.0, 1.0, id="M/M/1 rho .5, S 1 s: rho/(mu-lambda) = .5/.5 = 1 s"),
    pytest.param(0.5, 0.5, id="M/D/1: Pollaczek-Khinchine rho*S/(2(1-rho)) = 0.5 s (Allen-Cunneen exact for c=1)"),
])
def test_mean_wait(variability, expected_s):
    assert mean_wait_s(servers=1, arrival_rps=0.5, service_s=1.0, variability=variability) == pytest.approx(expected_s)


@pytest.mark.parametrize("ca, cs, g", [
    pytest.param(1.0, 1.0, 1.0, id="Poisson, exponential service: (1+1)/2 = 1 (M/M/c)"),
    pytest.param(1.0, 0.0, 0.5, id="Poisson, deterministic: (1+0)/2 = 0.5 (M/D/c)"),
    pytest.param(2.0, 1.0, 2.5, id="bursty arrivals cv 2: (4+1)/2 = 2.5"),
])
def test_variability_factor(ca, cs, g):
    assert variability_factor(ca, cs) == g


@pytest.mark.parametrize("x, n", [
    pytest.param(40 / 10, 4, id="4.0 -> 4"),
    pytest.param(0.1 * 3 / 0.3 * 4, 4, id="float noise 4.0000000000000001 -> 4"),
    pytest.param(4.01, 5, id="4.01 -> 5"),
])
def test_ceil_replicas(x, n):
    assert ceil_replicas(x) == n


# -- dynamo mode ---------------------------------------------------------------------


@pytest.mark.parametrize("requests, isl, corr, gpus, expected", [
    pytest.param(1800, 1000, 1.0, 1, 3, id="30 rps*1000 = 30000 tok/s / 10000 = 3"),
    pytest.param(1860, 1000, 1.0, 1, 4, id="31 rps*1000 / 10000 = 3.1 -> 4"),
    pytest.param(1800, 1000, 0.5, 1, 2, id="correction 0.5: 3*0.5 = 1.5 -> 2"),
    pytest.param(1800, 1000, 2.0, 1, 3, id="correction 2: min(1, 2) = 1 -> 3"),
    pytest.param(1800, 1000, 1.0, 2, 2, id="2 GPUs/engine: 3/2 = 1.5 -> 2"),
    pytest.param(6, 1000, 1.0, 1, 1, id="0.1 rps: 0.01 -> 1 (any load gets a replica)"),
    pytest.param(0, 1000, 1.0, 1, 0, id="no requests -> 0"),
])
def test_dynamo_prefill(requests, isl, corr, gpus, expected):
    cfg = SizingConfig(mode="dynamo-1.0.2", gpus_per_prefill_engine=gpus)
    s = prefill(fc(requests, isl=isl), cfg=cfg, corr=corr)
    assert s.replicas == expected
    assert s.pool == "prefill"
    if requests:
        assert s.numbers["raw_replicas"] == pytest.approx(requests / 60 * isl * min(1, corr) / 10_000 / gpus)
        assert s.message.startswith("dynamo:")


@pytest.mark.parametrize("requests, corr, gpus, itl_ms, expected", [
    pytest.param(21_000, 1.0, 1, 25.0, 10, id="350 rps*200 = 70000 tok/s; ITL 25 -> kv .7, 7000/GPU: 10"),
    pytest.param(21_000, 1.25, 1, 25.0, 14, id="corr 1.25: ITL 25/1.25 = 20 -> kv .5, 5000/GPU: 14"),
    pytest.param(21_000, 1.0, 2, 25.0, 5, id="2 GPUs/engine: 70000/7000/2 = 5"),
    pytest.param(21_000, 1.0, 1, 100.0, 8, id="loose ITL: kv .9, 9000/GPU: 7.78 -> 8"),
    pytest.param(21_000, 1.0, 1, 5.0, 70, id="ITL 5 unreachable: lowest ITL point kv .1, 1000/GPU: 70"),
    pytest.param(600, 1.0, 1, 25.0, 1, id="10 rps*200 = 2000 / 7000 = 0.29 -> 1"),
])
def test_dynamo_decode(requests, corr, gpus, itl_ms, expected):
    cfg = SizingConfig(mode="dynamo-1.0.2", gpus_per_decode_engine=gpus)
    s = decode(fc(requests, isl=900.0), cfg=cfg, corr=corr, itl_ms=itl_ms)
    assert s.replicas == expected
    assert s.numbers["context_tokens"] == 1000.0
    assert s.numbers["target_reachable"] == (0.0 if itl_ms == 5.0 else 1.0)


# -- sla mode: prefill -------------------------------------------------------------------


@pytest.mark.parametrize("requests, ttft_ms, corr, expected, ttft_p95_ms", [
    pytest.param(300, 600.0, 1.0, 1, 100 + 460.5,
                 id="5 rps x 100 ms = .5 erlang; c=1: p95 wait .1/.5*ln(10) = 460.5 ms -> 560.5 <= 600: 1"),
    pytest.param(300, 500.0, 1.0, 2, 100 + 46.2,
                 id="target 500: c=1 gives 560.5 > 500; c=2: 100 + 46.2 = 146.2: 2"),
    pytest.param(300, 140.0, 1.0, 3, 100.0,
                 id="target 140: c=2 146.2 > 140; c=3: C=.015 <= .05 so p95 wait 0: 3"),
    pytest.param(1620, 10_000.0, 1.0, 3, None,
                 id="27 rps x 100 ms = 2.7 erlangs, lax target: utilisation cap .9 -> ceil(2.7/.9) = 3"),
    pytest.param(0, 200.0, 1.0, 0, None, id="no requests -> 0"),
])
def test_sla_prefill(requests, ttft_ms, corr, expected, ttft_p95_ms):
    s = prefill(fc(requests), ttft_ms=ttft_ms, corr=corr)
    assert s.replicas == expected
    if ttft_p95_ms is not None:
        assert s.numbers["ttft_quantile_ms"] == pytest.approx(ttft_p95_ms, rel=1e-3)
        assert s.numbers["target_reachable"] == 1.0
        assert s.message.startswith(f"p95 TTFT {s.numbers['ttft_quantile_ms']:.0f} ms <= {ttft_ms:g} ms with {expected}")


def test_sla_prefill_correction_hand_value():
    """S = 150 ms, 5 rps: a = .75. c=2: B = .75*(.75/1.75)/(2+.75*.75/1.75) = .1385; C = 2B/(2-.75(1-B)) = .2045;
    p95 wait = .15/1.25 * ln(.2045/.05) = 169.0 ms; TTFT 319 ms <= 600 (c=1: 150 + 1625 ms > 600)."""
    s = prefill(fc(300), ttft_ms=600.0, corr=1.5)
    b = 0.75 * (0.75 / 1.75) / (2 + 0.75 * 0.75 / 1.75)
    c_wait = 2 * b / (2 - 0.75 * (1 - b))
    assert s.replicas == 2
    assert s.numbers["p_wait_frac"] == pytest.approx(c_wait)
    assert s.numbers["ttft_quantile_ms"] == pytest.approx(150 + 1000 * 0.15 / 1.25 * math.log(c_wait / 0.05))
    assert s.numbers["service_ms"] == pytest.approx(150.0)


def test_sla_prefill_deterministic_service_needs_fewer_replicas():
    """M/D/c (service cv 0, g = .5): 5 rps, target 500: c=1 wait p95 = .5*460.5 = 230 ms -> 330 ms: 1 (M/M/c: 2)."""
    s = prefill(fc(300), ttft_ms=500.0, cfg=CLASSIC.model_copy(update={"prefill_service_cv": 0.0}))
    assert s.replicas == 1
    assert s.numbers["ttft_quantile_ms"] == pytest.approx(100 + 0.5 * 460.517, rel=1e-4)


def test_sla_prefill_unreachable_target_sizes_for_best_latency_plus_slack():
    """Target 80 ms < 100 ms single-request TTFT: size for 125 ms instead (25% slack); c=2 gives 146, c=3 gives 100: 3."""
    s = prefill(fc(300), ttft_ms=80.0)
    assert s.replicas == 3
    assert s.numbers["target_reachable"] == 0.0
    assert s.numbers["effective_ttft_target_ms"] == pytest.approx(125.0)
    assert "TTFT target 80 ms unreachable: single-request TTFT 100 ms" in s.message


def test_sla_prefill_p90_vs_mean():
    """Mean 300 requests (5 rps) -> 2 replicas at 500 ms; p90 1200 (20 rps, a = 2) -> 3."""
    mean = prefill(fc(300, p90=1200), ttft_ms=500.0, size_on="mean")
    p90 = prefill(fc(300, p90=1200), ttft_ms=500.0, size_on="p90")
    assert mean.replicas == 2 and mean.numbers["load_rps"] == 5.0
    assert p90.numbers["load_rps"] == 20.0
    # a = 2: c=3 -> B = .2105, C = .4444; p95 wait = .1/1 * ln(.4444/.05) = 218.5 ms -> 318.5 <= 500: 3
    assert p90.replicas == 3
    assert p90.numbers["ttft_quantile_ms"] == pytest.approx(100 + 100 * math.log((4 / 9) / 0.05), rel=1e-4)
    # a p90 below the mean never sizes below the mean
    assert prefill(fc(300, p90=10), ttft_ms=500.0, size_on="p90").numbers["load_rps"] == 5.0


# -- sla mode: decode ------------------------------------------------------------------------


@pytest.mark.parametrize("requests, max_kv, corr, expected, bound", [
    pytest.param(21_000, 1_000_000, 1.0, 12, "throughput",
                 id="70000 tok/s / (7000*(1-.15) = 5950) = 11.76 -> 12; KV 1750 running*1000/800k = 2.2"),
    pytest.param(21_000, 100_000, 1.0, 26, "ITL quantile",
                 id="max_kv 100k: KV cap alone 350 rps*200*25 ms = 1750 running x 1000 / (100k*.8) = 21.9 -> 22, "
                    "but there kv .8 -> ITL 27.5 > 25; Little's law kv = 7.5a/(1-25a), a = 350/r*200*1000/1e8: "
                    "r=25 kv .7 ITL 25.0 (mean on target, p51 above), r=26 kv .618 ITL 22.9: 26"),
    pytest.param(21_000, 1_000_000, 1.25, 17, "throughput",
                 id="corr 1.25: ITL 20 -> 5000/GPU*.85 = 4250: 70000/4250 = 16.5 -> 17"),
    pytest.param(600, 1_000_000, 1.0, 1, "throughput", id="10 rps*200 = 2000 / 5950 = .34 -> 1"),
    pytest.param(0, 1_000_000, 1.0, 0, None, id="no requests -> 0"),
])
def test_sla_decode(requests, max_kv, corr, expected, bound):
    s = decode(fc(requests, isl=900.0), corr=corr, max_kv_tokens=max_kv)
    assert s.replicas == expected
    if bound:
        assert f"({bound}-bound)" in s.message
        assert s.numbers["headroom_frac"] == 0.15
        assert s.numbers["utilization_frac"] <= 0.85 + 1e-9


def test_sla_decode_kv_numbers():
    s = decode(fc(21_000, isl=900.0), max_kv_tokens=100_000)
    assert s.numbers["running_requests"] == pytest.approx(350 * 200 * 0.025)  # 1750
    assert s.numbers["kv_tokens_needed"] == pytest.approx(1750 * 1000)
    assert s.numbers["replicas_for_kv"] == pytest.approx(1_750_000 / 80_000)
    assert s.replicas == 26  # the mean ITL, not the KV cap, binds (test_sla_decode)
    assert s.numbers["predicted_kv_usage_frac"] == pytest.approx(1_750_000 / (26 * 100_000))
    a = 350 / 26 * 200 * 1000 / 1e8
    assert s.numbers["mean_kv_usage_frac"] == pytest.approx(7.5 * a / (1 - 25 * a), rel=1e-6)


def test_sla_decode_kv_capacity_bound():
    """Loose ITL 100 ms: the best point is kv .9 (ITL 30): 350 rps*200*30 ms = 2100 running x 1000 tokens
    / (100k*.8) = 26.25 -> 27, while Little's law at 27 replicas gives only kv .55 (ITL 21.3 ms)."""
    s = decode(fc(21_000, isl=900.0), max_kv_tokens=100_000, itl_ms=100.0)
    assert s.replicas == 27
    assert "(KV capacity-bound)" in s.message
    assert s.numbers["replicas_for_kv"] == pytest.approx(2_100_000 / 80_000)


def test_sla_decode_unreachable_itl():
    """ITL 5 ms < 10 ms at one request: size at 10*1.25 = 12.5 ms: kv .2, 2000/GPU*.85 = 1700: 70000/1700 = 41.2 -> 42."""
    s = decode(fc(21_000, isl=900.0), itl_ms=5.0)
    assert s.replicas == 42
    assert s.numbers["target_reachable"] == 0.0
    assert s.numbers["effective_itl_target_ms"] == pytest.approx(12.5)
    assert "ITL target 5 ms unreachable: best 10 ms" in s.message


# -- guards ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    pytest.param("num_requests", float("nan"), id="NaN requests"),
    pytest.param("num_requests", -1.0, id="negative requests"),
    pytest.param("avg_isl_tokens", float("inf"), id="inf ISL"),
    pytest.param("num_requests_p90", float("nan"), id="NaN p90"),
])
def test_bad_forecast_is_an_error(field, value):
    f = Forecast(**{**fc(600).__dict__, field: value})
    for fn in (prefill, decode):
        with pytest.raises(ValueError, match=f"forecast.{field} must be a finite number >= 0"):
            fn(f)


def test_bad_interval_and_size_on():
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        size_prefill(fc(1), corrections=Corrections(), profile=linear_prefill(), slo=SloTarget(), cfg=SLA, interval_s=0)
    with pytest.raises(ValueError, match="size_on must be 'mean' or 'p90'"):
        prefill(fc(1), size_on="p99")


@pytest.mark.parametrize("mode", ["sla", "dynamo"])
def test_real_profile_never_nan_and_at_least_one(h200_profile_dir, mode):
    prof = load_profile_dir(h200_profile_dir)
    cfg = SizingConfig(mode=mode)
    slo = SloTarget(ttft_ms=150.0, itl_ms=15.0)
    for requests in (1, 60, 6000, 120_000):
        for isl, osl in ((50, 5), (3000, 300), (40_000, 2000)):
            for corr in (0.5, 1.0, 3.0):
                f = fc(requests, isl=isl, osl=osl)
                c = Corrections(prefill=corr, decode=corr)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # clamps are reported in the numbers, not warned
                    p = size_prefill(f, corrections=c, profile=prof.prefill, slo=slo, cfg=cfg, interval_s=60.0,
                                     size_on="mean")
                    d = size_decode(f, corrections=c, profile=prof.decode, slo=slo, cfg=cfg, interval_s=60.0,
                                    size_on="mean")
                for s in (p, d):
                    assert s.replicas >= 1
                    assert all(math.isfinite(v) for v in s.numbers.values()), s.numbers
                    assert s.message


def test_disabled_corrections_are_ignored():
    """Corrections(enabled=False, prefill=0.5) sizes like factor 1: 30 rps*1000/10000 = 3 (not 1.5 -> 2)."""
    assert prefill(fc(1800), cfg=DYNAMO, corr=0.5, enabled=False).replicas == 3


def test_out_of_range_inputs_are_flagged_in_numbers_not_warned():
    """ISL 8000 > 4000 profiled: sized at 4000 (TTFT 400 ms) with isl_clamped = 1; context 5100 > 2000 likewise."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = prefill(fc(300, isl=8000.0), ttft_ms=1000.0)
        d = decode(fc(300, isl=5000.0))
    assert p.numbers["isl_clamped"] == 1.0 and p.numbers["single_request_ttft_ms"] == pytest.approx(400.0)
    assert p.numbers["isl_tokens"] == 8000.0
    assert d.numbers["context_clamped"] == 1.0 and d.numbers["context_tokens"] == 5100.0


_H200 = None


def _h200(path):
    global _H200
    if _H200 is None:
        _H200 = load_profile_dir(path)
    return _H200


@pytest.mark.parametrize("mode", ["sla", "dynamo"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rps=st.floats(0.01, 500.0),
    extra=st.floats(0.0, 2.0),
    isl=st.floats(50.0, 20_000.0),
    osl=st.floats(1.0, 4_000.0),
    corr=st.floats(0.5, 3.0),
)
def test_more_load_never_fewer_replicas(h200_profile_dir, mode, rps, extra, isl, osl, corr):
    """Property: on the measured H200 profile, more requests never need fewer replicas, results are >= 1."""
    prof = _h200(h200_profile_dir)
    cfg = SizingConfig(mode=mode)
    slo = SloTarget(ttft_ms=150.0, itl_ms=20.0)
    c = Corrections(prefill=corr, decode=corr)
    for fn, p in ((size_prefill, prof.prefill), (size_decode, prof.decode)):
        lo, hi = (
            fn(fc(r * 60.0, isl=isl, osl=osl), corrections=c, profile=p, slo=slo, cfg=cfg, interval_s=60.0,
               size_on="mean")
            for r in (rps, rps * (1.0 + extra))
        )
        assert 1 <= lo.replicas <= hi.replicas


# -- lead time: the upper forecast at the horizon new replicas serve ----------------------------


@pytest.mark.parametrize("startup_s, interval_s, expected", [
    pytest.param(60.0, 60.0, 2, id="60 s startup, 60 s interval: added at end of k, serves k+2: 1 + 1 = 2"),
    pytest.param(0.0, 60.0, 1, id="instant start: the next interval, 1"),
    pytest.param(90.0, 60.0, 3, id="90 s: 1 + ceil(1.5) = 3"),
    pytest.param(120.0, 60.0, 3, id="120 s: 1 + ceil(2) = 3 (no float creep to 4)"),
    pytest.param(300.0, 30.0, 11, id="300 s at 30 s: 1 + 10 = 11"),
])
def test_lead_intervals(startup_s, interval_s, expected):
    assert lead_intervals(startup_s=startup_s, interval_s=interval_s) == expected


@pytest.mark.parametrize("startup_s, expected_requests", [
    pytest.param(0.0, 1200.0, id="no lead: p90 as forecast, 1200"),
    pytest.param(60.0, 300 + 900 * math.sqrt(2), id="2 intervals ahead: 300 + (1200-300)*sqrt(2) = 1572.8"),
    pytest.param(180.0, 300 + 900 * 2.0, id="4 intervals ahead: 300 + 900*sqrt(4) = 2100"),
])
def test_upper_forecast_widens_to_the_lead_time(startup_s, expected_requests):
    cfg = CLASSIC.model_copy(update={"replica_startup_s": startup_s})
    for fn in (prefill, decode):
        s = fn(fc(300, p90=1200), cfg=cfg, size_on="p90")
        assert s.numbers["requests"] == pytest.approx(expected_requests)
    assert prefill(fc(300, p90=1200), cfg=cfg, size_on="mean").numbers["requests"] == 300.0


def test_dynamo_mode_sizes_the_next_interval_as_the_seed_did():
    """The seed formulas take next interval's p90 as is: 1200 requests (20 rps*1000/10000 = 2), no widening."""
    s = prefill(fc(300, p90=1200), cfg=SizingConfig(mode="dynamo-1.0.2"), size_on="p90")
    assert s.numbers["requests"] == 1200.0 and s.replicas == 2


# -- prefill: prompts of different lengths ----------------------------------------------------------


@pytest.mark.parametrize("slack_s, share, expected", [
    pytest.param([0.46, 0.1], 0.80, 1,
                 id="a=.5, c=1: C=.5, scale .1/.5=.2 s: mean(1-.5e^-2.3, 1-.5e^-.5) = mean(.950, .697) = .823 >= .8: 1"),
    pytest.param([0.46, 0.1], 0.95, 2,
                 id="c=2: C=.1, scale .1/1.5: mean(1-.1e^-6.9, 1-.1e^-1.5) = mean(.9999, .9777) = .9888 >= .95: 2"),
    pytest.param([0.46, 0.1], 0.99, 3, id="c=2 gives .9888 < .99: 3"),
    pytest.param([0.46], 0.95, 2,
                 id="one class = classic p95: wait .2*ln(.5/.05) = 460.5 ms > 460 ms slack (1-.5e^-2.3 = .9499): 2"),
])
def test_replicas_for_ttft_with_slack_classes(slack_s, share, expected):
    c, q = replicas_for_ttft(arrival_rps=5.0, service_s=0.1, slack_s=slack_s, share=share, variability=1.0,
                             max_utilization_frac=0.9)
    assert c == expected
    assert q["ttft_met_frac"] >= share


def test_replicas_for_ttft_hand_values():
    c, q = replicas_for_ttft(arrival_rps=5.0, service_s=0.1, slack_s=[0.46, 0.1], share=0.8, variability=1.0,
                             max_utilization_frac=0.9)
    assert q["p_wait_frac"] == pytest.approx(0.5)
    assert q["ttft_met_frac"] == pytest.approx(np.mean([1 - 0.5 * math.exp(-2.3), 1 - 0.5 * math.exp(-0.5)]))
    with pytest.raises(ValueError, match="slack_s must be non-empty and >= 0"):
        replicas_for_ttft(arrival_rps=5.0, service_s=0.1, slack_s=[], share=0.8, variability=1.0,
                          max_utilization_frac=0.9)


@pytest.mark.parametrize("isl, expected_points", [
    pytest.param(1000.0, 55, id="exponential ISL mean 1000: 200 ms fits ISL < 2000, P = 1-e^-2 = .865: 55 of 64"),
    pytest.param(3000.0, 31, id="mean 3000 (300 ms > 200 alone): P(ISL < 2000) = 1-e^-2/3 = .487: 31 of 64"),
])
def test_sla_prefill_sizes_for_the_prompts_that_can_meet_ttft(isl, expected_points):
    """Hand prefill (0.1 ms/token), isl_cv 1 (exponential lengths, 64 midpoint quantiles (i+.5)/64)."""
    cfg = SizingConfig(isl_cv=1.0, replica_startup_s=0.0)
    s = prefill(fc(300, isl=isl), cfg=cfg)
    assert s.numbers["reachable_frac"] == pytest.approx(expected_points / 64)
    assert s.numbers["target_reachable"] == 1.0
    assert s.numbers["ttft_met_frac"] >= 0.99
    assert f"of the {expected_points / 64:.1%} of requests whose prefill fits in it" in s.message


def test_sla_prefill_long_mean_prompt_no_longer_gives_up_on_the_short_ones():
    """Mean ISL 3000 (300 ms alone): one class calls the 200 ms target unreachable and sizes for 375 ms;
    with prompt lengths spread (CV 1) half the requests can meet 200 ms and get the replicas they need."""
    one = prefill(fc(6000, isl=3000.0), cfg=SizingConfig(isl_cv=0.0, replica_startup_s=0.0))
    spread = prefill(fc(6000, isl=3000.0), cfg=SizingConfig(isl_cv=1.0, replica_startup_s=0.0))
    assert one.numbers["target_reachable"] == 0.0
    assert spread.numbers["target_reachable"] == 1.0
    assert spread.replicas > one.replicas


def test_prefill_service_points_extrapolate_long_prompts_linearly():
    """Hand profile measured to 4000 tokens (400 ms): a prompt of 8000 takes 800 ms, one of 100 the 50 ms floor."""
    from planner.latency.queueing import prefill_service_points_ms

    pts = prefill_service_points_ms(linear_prefill(), isl_tokens=1000.0, isl_cv=1.0, points=64)
    isl = np.array([-1000.0 * math.log(1 - (i + 0.5) / 64) for i in range(64)])  # exponential quantiles
    expected = np.where(isl > 4000, 400.0 * isl / 4000, np.clip(isl, 500, 4000) * 0.1)
    assert pts == pytest.approx(expected, rel=1e-6)
    assert prefill_service_points_ms(linear_prefill(), isl_tokens=1000.0, isl_cv=0.0) == pytest.approx([100.0])


# -- decode: the ITL quantile under KV fluctuation --------------------------------------------------


def test_decode_itl_quantile_hand_values():
    """Hand decode, context 1000 (ITL = 7.5 + 25 kv), max_kv 100k, osl 200, 10 rps on 1 replica:
    a = 10*200*1000/(1000*1e5) = .02; kv = 7.5a/(1-25a) = .3 -> ITL 15 ms; N = .3*1e5/1000 = 30 running;
    sd = sqrt(30 * 1 * (1+1)) * 1000 = 7746 tokens = .0775; p99: z 2.3263 -> kv .4802 -> ITL 19.5 ms."""
    q = decode_itl_quantile(linear_decode(), rps=10.0, osl_tokens=200.0, context_tokens=1000.0, correction=1.0,
                            replicas=1, quantile=0.99, context_cv=1.0, peakedness=1.0)
    assert q["mean_kv_usage_frac"] == pytest.approx(0.3, rel=1e-6)
    assert q["mean_itl_ms"] == pytest.approx(15.0, rel=1e-6)
    kv_q = 0.3 + 2.326348 * math.sqrt(60) * 1000 / 100_000
    assert q["kv_usage_quantile_frac"] == pytest.approx(kv_q, rel=1e-5)
    assert q["itl_quantile_ms"] == pytest.approx(7.5 + 25 * kv_q, rel=1e-5)


@pytest.mark.parametrize("target_ms, expected", [
    pytest.param(20.0, 1, id="p99 19.5 ms on 1 replica <= 20: 1"),
    pytest.param(19.0, 2, id="19.5 > 19; 2 replicas: a .01, kv .1 (10 ms), pool N 20, sd sqrt(40)*1000/2 -> 11.8 ms: 2"),
    pytest.param(11.0, 3, id="11.8 > 11 on 2; 3: a .00667, ITL flat 10 below kv .1 so kv .0667, pool N 20, "
                             "sd sqrt(40)*1000/3 = .0211 -> kv .1157 -> 10.4 ms: 3"),
])
def test_replicas_for_itl_quantile(target_ms, expected):
    r, q = replicas_for_itl_quantile(linear_decode(), rps=10.0, osl_tokens=200.0, context_tokens=1000.0,
                                     correction=1.0, itl_target_ms=target_ms, quantile=0.99, context_cv=1.0,
                                     peakedness=1.0)
    assert r == expected
    assert q["itl_quantile_ms"] <= target_ms


def test_decode_itl_quantile_past_the_profile_is_inf():
    """40 rps on 1 replica: a = .08, 25a = 2 > 1: no KV usage where Little's law and the ITL curve agree."""
    q = decode_itl_quantile(linear_decode(), rps=40.0, osl_tokens=200.0, context_tokens=1000.0, correction=1.0,
                            replicas=1, quantile=0.99, context_cv=1.0, peakedness=1.0)
    assert q["itl_quantile_ms"] == math.inf and q["mean_itl_ms"] == math.inf


def test_default_decode_sizes_for_the_p99_itl_at_the_slo():
    """Defaults: the quantile rule aims at the SLO itself (not the best ITL plus slack), and the p99 it
    reports is within it. 600 requests/min = 10 rps, ISL 900 + OSL 200/2 = context 1000, ITL 20: 1 replica."""
    s = decode(fc(600, isl=900.0), cfg=SizingConfig(replica_startup_s=0.0), itl_ms=20.0, max_kv_tokens=100_000)
    assert s.numbers["itl_quantile_target_ms"] == 20.0
    assert s.replicas == 1 and s.numbers["itl_quantile_ms"] <= 20.0
    tight = decode(fc(600, isl=900.0), cfg=SizingConfig(replica_startup_s=0.0), itl_ms=19.0, max_kv_tokens=100_000)
    assert tight.replicas == 2 and "(ITL quantile-bound)" in tight.message


def test_dynamo_is_a_deprecated_alias_of_dynamo_1_0_2():
    """The mode is Dynamo 1.0.2's formulas and named for them; the old name still loads, as that mode."""
    assert SizingConfig(mode="dynamo").mode == "dynamo-1.0.2"
    old = prefill(fc(300, p90=1200), cfg=SizingConfig(mode="dynamo"), size_on="p90")
    new = prefill(fc(300, p90=1200), cfg=SizingConfig(mode="dynamo-1.0.2"), size_on="p90")
    assert (old.replicas, old.message) == (new.replicas, new.message)
    assert new.message.startswith("dynamo:")
    with pytest.raises(ValueError, match="mode"):
        SizingConfig(mode="dynamo-1.6.1")
