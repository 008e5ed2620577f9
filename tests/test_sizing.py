"""Replica sizing, both modes, with hand arithmetic on the hand-made profiles (see fixtures_profile).

Hand prefill: TTFT = 0.1 ms/token, throughput 10,000 tokens/s/GPU.
Hand decode, context row 1000: ITL = 7.5 + 25*kv ms, throughput = 10,000*kv tokens/s/GPU, max_kv 100,000.
A forecast with ISL 900 and OSL 200 lands exactly on context 900 + 200/2 = 1000.
"""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.profiles import load_profile_dir
from planner.config import SizingConfig, SloTarget
from planner.sizing import (
    ceil_replicas,
    erlang_c,
    mean_wait_s,
    size_decode,
    size_prefill,
    variability_factor,
    wait_quantile_s,
)
from planner.types import Corrections, Forecast
from tests.fixtures_profile import linear_decode, linear_prefill

DYNAMO = SizingConfig(mode="dynamo")
SLA = SizingConfig()  # p95, Poisson arrivals, service CV 1 (g = 1: M/M/c), 90% util cap, 15% decode headroom


def fc(requests: float, *, isl: float = 1000.0, osl: float = 200.0, p90: float | None = None) -> Forecast:
    return Forecast(
        num_requests=requests, avg_isl_tokens=isl, avg_osl_tokens=osl,
        num_requests_p90=requests if p90 is None else p90, predictor="test",
    )


def prefill(forecast, *, cfg=SLA, corr=1.0, ttft_ms=200.0, size_on="mean", enabled=True):
    return size_prefill(
        forecast, corrections=Corrections(prefill=corr, enabled=enabled), profile=linear_prefill(),
        slo=SloTarget(ttft_ms=ttft_ms, itl_ms=25.0), cfg=cfg, interval_s=60.0, size_on=size_on,
    )


def decode(forecast, *, cfg=SLA, corr=1.0, itl_ms=25.0, size_on="mean", max_kv_tokens=1_000_000):
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
    cfg = SizingConfig(mode="dynamo", gpus_per_prefill_engine=gpus)
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
    cfg = SizingConfig(mode="dynamo", gpus_per_decode_engine=gpus)
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
    s = prefill(fc(300), ttft_ms=500.0, cfg=SizingConfig(prefill_service_cv=0.0))
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
    pytest.param(21_000, 100_000, 1.0, 22, "KV capacity",
                 id="max_kv 100k: 350 rps*200*25 ms = 1750 running x 1000 tokens / (100k*.8) = 21.9 -> 22"),
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
    assert s.numbers["predicted_kv_usage_frac"] == pytest.approx(1_750_000 / (22 * 100_000))


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
