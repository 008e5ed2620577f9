"""Sub-interval bursts: the burst ratio, its classes, burst-aware sizing and correction, the pipeline.

Hand-made profiles (see fixtures_profile): prefill TTFT = 0.1 ms/token, so ISL 1000 is 100 ms.
Burst ratios are the busiest window's count less one Poisson standard deviation over the mean
window's count, so the examples use square counts: 144 requests in the busiest 15 s of an
interval of 176 give (144 - 12) / (176 x 15/60) = 3.0.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.signals.burst import (
    arrival_classes,
    expected_peak_ratio,
    history_classes,
    peak_ratio,
    recent_peaks,
    window_mean_wait_s,
)
from planner.config import CorrectionConfig, PlannerConfig, ProfileConfig, SizingConfig, SloTarget
from planner.latency.correct import correction_factors
from planner.pipeline import plan_interval
from planner.steps import predict_load
from planner.latency.queueing import mean_wait_s, replicas_for_ttft
from planner.sizing.pools import size_prefill
from planner.types import Corrections, FleetState, Forecast, LoadHistory, Observation, PoolState
from planner.whatif import WhatIf, apply_what_if
from tests.support.fixtures_profile import linear_engine, linear_prefill

NAN = float("nan")


@pytest.mark.parametrize("n, peak, window_s, expected", [
    # busiest 15 s: 9.6 x 15 = 144 requests, less one Poisson sd sqrt(144) = 12 -> 132; the mean window 176/4 = 44
    pytest.param(176.0, 9.6, 15.0, 3.0, id="(144 - 12) / (176/4) = 3.0"),
    pytest.param(100.0, 2.4, 15.0, 1.2, id="(36 - 6) / (100/4) = 1.2"),
    pytest.param(60.0, 1.0, 15.0, 1.0, id="flat: (15 - 3.9) / 15 < 1 -> floor 1"),
    pytest.param(10.0, 100.0, 15.0, 4.0, id="(1500 - 38.7) / 2.5 = 584 -> at most 60/15 = 4"),
    pytest.param(176.0, 9.6, 60.0, 1.0, id="window = interval: nothing to see, 1"),
    pytest.param(0.0, 8.0, 15.0, None, id="no requests: unknown"),
    pytest.param(176.0, None, 15.0, None, id="no peak: unknown"),
    pytest.param(176.0, NAN, 15.0, None, id="NaN peak: unknown"),
    pytest.param(176.0, 9.6, None, None, id="no window: unknown"),
])
def test_peak_ratio(n, peak, window_s, expected):
    got = peak_ratio(num_requests=n, peak_rps=peak, interval_s=60.0, window_s=window_s)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("rps, ratio, window_s, expected", [
    pytest.param(2.5, 3.2, 15.0, ((0.8, 8.0, 15.0), (0.2, 30.0 / 45.0, 45.0)),
                 id="share 3.2x15/60 = 0.8 at 8 rps; rest 0.2 x 150 = 30 requests / 45 s"),
    pytest.param(2.5, 4.0, 15.0, ((1.0, 10.0, 15.0),), id="ratio 4 = 60/15: all in the window"),
    pytest.param(2.5, 1.0, 15.0, ((1.0, 2.5, 60.0),), id="ratio 1: one class at the mean"),
    pytest.param(2.5, None, None, ((1.0, 2.5, 60.0),), id="unknown: one class at the mean"),
])
def test_arrival_classes(rps, ratio, window_s, expected):
    got = arrival_classes(rps=rps, ratio=ratio, window_s=window_s, interval_s=60.0)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == pytest.approx(e)
    assert sum(share for share, _, _ in got) == pytest.approx(1.0)
    # the classes carry the interval's requests: sum(rate x duration) = rps x 60
    assert sum(rate * dur for _, rate, dur in got) == pytest.approx(rps * 60.0)


def hist(n, peaks, window_s=15.0):
    return LoadHistory(t_s=tuple(60.0 * (k + 1) for k in range(len(n))), num_requests=tuple(n),
                       avg_isl_tokens=(1000.0,) * len(n), avg_osl_tokens=(200.0,) * len(n), interval_s=60.0,
                       peak_rps=None if peaks is None else tuple(peaks), peak_window_s=window_s)


# Two intervals from the table above: 100 requests at ratio 1.2, then 176 at ratio 3.0.
@pytest.mark.parametrize("n, peaks, lookback, expected", [
    pytest.param([100, 176], [2.4, 9.6], 5, (100 * 1.2 + 176 * 3.0) / 276, id="weighted (120 + 528)/276 = 2.348"),
    pytest.param([100, 176], [2.4, 9.6], 1, 3.0, id="lookback 1: the last interval, 3.0"),
    pytest.param([100, 0, 176], [2.4, 0, 9.6], 5, (120 + 528) / 276, id="an empty interval is skipped"),
    pytest.param([100, 176], [2.4, NAN], 5, 1.2, id="NaN peak skipped: 100 x 1.2 / 100 = 1.2"),
    pytest.param([0, 0], [0, 0], 5, None, id="no requests at all: unknown"),
    pytest.param([100, 176], None, 5, None, id="history without the signal: unknown"),
    pytest.param([100, 176], [2.4, 9.6], 0, None, id="lookback 0: disabled"),
])
def test_expected_peak_ratio(n, peaks, lookback, expected):
    ratio, note = expected_peak_ratio(hist(n, peaks, window_s=15.0 if peaks is not None else None),
                                      lookback_intervals=lookback)
    assert ratio == (None if expected is None else pytest.approx(expected))
    assert note.startswith("burst:")


def test_history_classes_weight_each_interval_by_its_requests():
    peaks = recent_peaks(hist([100, 176], [2.4, 9.6]), lookback_intervals=5)
    assert peaks == ((100.0, 2.4), (176.0, 9.6))
    got = history_classes(peaks, window_s=15.0, interval_s=60.0)
    # ratio 1.2: share 1.2 x 15/60 = 0.3 at 2 rps, 0.7 at 70/45 rps; ratio 3.0: 0.75 at 8.8 rps, 0.25 at 44/45 rps;
    # weights x 100/276 and x 176/276
    flat = [x for part in got for x in part]
    assert flat == pytest.approx([30 / 276, 2.0, 70 / 276, 70 / 45, 132 / 276, 8.8, 44 / 276, 44 / 45])


@pytest.mark.parametrize("servers, rps, expected", [
    # cap = (2/3) sqrt(2 x 1 x 0.1 / 2) sqrt(2 x 15 / pi) = (2/3) x 0.31623 x 3.0902 = 0.65147 s
    pytest.param(2, 30.0, 0.65147 + (1.5 - 1.0) * 15 / 2, id="rho 3/2: cap + fluid 0.5 x 15/2 = 4.40 s"),
    pytest.param(2, 20.0, 0.65147, id="rho 1: the cap, where the stationary wait is infinite"),
    pytest.param(2, 10.0, None, id="rho 1/2: the stationary wait (below the cap)"),
])
def test_window_mean_wait(servers, rps, expected):
    stationary = mean_wait_s(servers=servers, arrival_rps=rps, service_s=0.1, variability=1.0)
    got = window_mean_wait_s(servers=servers, arrival_rps=rps, service_s=0.1, variability=1.0, window_s=15.0,
                             stationary_wait_s=stationary)
    assert got == pytest.approx(stationary if expected is None else expected, rel=1e-4)


def test_window_mean_wait_is_continuous_and_rising_in_load():
    waits = []
    for rps in [x * 0.25 for x in range(1, 200)]:
        st = mean_wait_s(servers=4, arrival_rps=rps, service_s=0.1, variability=1.0)
        waits.append(window_mean_wait_s(servers=4, arrival_rps=rps, service_s=0.1, variability=1.0, window_s=15.0,
                                        stationary_wait_s=st))
    assert all(b >= a for a, b in zip(waits, waits[1:]))
    assert all(math.isfinite(w) for w in waits)


def test_classes_one_part_equals_the_single_rate_queue():
    kw = dict(arrival_rps=30.0, service_s=0.1, slack_s=[0.1], share=0.99, variability=1.0, max_utilization_frac=0.9)
    assert replicas_for_ttft(**kw) == replicas_for_ttft(**kw, classes=[(1.0, 30.0)])


def test_a_burst_part_needs_the_servers_its_own_rate_needs():
    kw = dict(service_s=0.1, slack_s=[0.1], share=0.99, variability=1.0, max_utilization_frac=0.9)
    flat, _ = replicas_for_ttft(arrival_rps=10.0, **kw)
    at_peak, _ = replicas_for_ttft(arrival_rps=32.0, **kw)
    # 80% of the requests at 32 rps, 20% at 8/3 rps (mean 10 rps): 99% met needs the 80% met, at 32 rps
    burst, q = replicas_for_ttft(arrival_rps=10.0, classes=[(0.8, 32.0), (0.2, 8.0 / 3.0)], **kw)
    assert flat < burst
    assert burst <= at_peak
    assert q["ttft_met_frac"] >= 0.99 and q["peak_utilization_frac"] == pytest.approx(3.2 / burst)


SLO = SloTarget(ttft_ms=200.0, itl_ms=25.0)


def fc(requests=600.0, **kw) -> Forecast:
    return Forecast(num_requests=requests, avg_isl_tokens=1000.0, avg_osl_tokens=200.0, num_requests_p90=requests,
                    predictor="test", **kw)


def size(forecast, cfg=SizingConfig(replica_startup_s=0.0)):
    return size_prefill(forecast, corrections=Corrections(), profile=linear_prefill(), slo=SLO, cfg=cfg,
                        interval_s=60.0, size_on="mean")


def test_sizing_without_the_signal_is_unchanged():
    plain = size(fc())
    flat_peaks = size(fc(peak_ratio=1.0, peak_window_s=15.0, recent_peaks=((600.0, 10.0),) * 5))
    off = size(fc(peak_ratio=3.2, peak_window_s=15.0, recent_peaks=((690.0, 38.4),)),
               cfg=SizingConfig(replica_startup_s=0.0, burst_basis="off"))
    assert plain.replicas == flat_peaks.replicas == off.replicas
    assert "replicas_for_burst" not in plain.numbers and "burst" not in plain.message


@pytest.mark.parametrize("basis", ["history", "mean", "upper"])
def test_a_burst_raises_prefill_and_says_so(basis):
    # 690 requests in 60 s = 11.5 rps; the last interval's busiest 15 s held 576: (576 - 24) / (690/4) = 3.2
    burst_fc = fc(690.0, peak_ratio=3.2, peak_window_s=15.0, recent_peaks=((690.0, 38.4),))
    plain = size(fc(690.0))
    got = size(burst_fc, cfg=SizingConfig(replica_startup_s=0.0, burst_basis=basis))
    assert got.replicas > plain.replicas
    assert got.numbers["replicas_flat"] == plain.replicas
    assert got.numbers["replicas_for_burst"] == got.replicas
    assert got.numbers["burst_share_frac"] == pytest.approx(0.8)  # 3.2 x 15/60
    assert "80% of requests at 36.8 rps in 15 s peaks" in got.message  # 3.2 x 11.5 rps


def burst_obs(ttft_ms: float, **kw) -> Observation:
    """690 requests (11.5 rps), busiest 15 s at 38.4 rps: ratio (576 - 24) / 172.5 = 3.2."""
    base = dict(taken_at_s=60.0, interval_s=60.0, num_requests=690.0, avg_isl_tokens=1000.0, avg_osl_tokens=200.0,
                avg_ttft_ms=ttft_ms, avg_itl_ms=10.0, peak_rps=38.4, peak_window_s=15.0)
    base.update(kw)
    return Observation(**base)


def _burst_model_ms(k: float, replicas: int) -> float:
    """The burst model's mean TTFT by hand: 80% at 36.8 rps for 15 s, 20% (138) over 45 s, S = k x 100 ms."""
    s = 0.1 * k
    total = 0.0
    for share, rate, window in ((0.8, 36.8, 15.0), (0.2, 138.0 / 45.0, 45.0)):
        st = mean_wait_s(servers=replicas, arrival_rps=rate, service_s=s, variability=1.0)
        total += share * (s + window_mean_wait_s(servers=replicas, arrival_rps=rate, service_s=s, variability=1.0,
                                                 window_s=window, stationary_wait_s=st))
    return 1000.0 * total


@pytest.mark.parametrize("replicas, k", [
    pytest.param(4, 1.0, id="4 replicas, burst at rho 3.68/4 = 0.92: k = 1"),
    pytest.param(3, 1.3, id="3 replicas, burst above capacity (rho 4.78/3 = 1.59): backlog explained, k = 1.3"),
])
def test_burst_queueing_is_not_read_as_slow_engines(replicas, k):
    observed = _burst_model_ms(k, replicas)
    sizing = SizingConfig()
    got = correction_factors(burst_obs(observed), profile=linear_engine(), decode_replicas=2, cfg=CorrectionConfig(),
                             prefill_replicas=replicas, sizing=sizing)
    assert got.prefill == pytest.approx(k, rel=1e-6)
    flat = correction_factors(burst_obs(observed, peak_rps=None), profile=linear_engine(), decode_replicas=2,
                              cfg=CorrectionConfig(), prefill_replicas=replicas, sizing=sizing)
    assert flat.prefill > got.prefill + 0.1  # the flat model blames the engines for the burst's queue
    off = correction_factors(burst_obs(observed), profile=linear_engine(), decode_replicas=2,
                             cfg=CorrectionConfig(burst_aware=False), prefill_replicas=replicas, sizing=sizing)
    assert off.prefill == flat.prefill


def test_burst_correction_clamps_with_a_note():
    got = correction_factors(burst_obs(50_000.0), profile=linear_engine(), decode_replicas=2, cfg=CorrectionConfig(),
                             prefill_replicas=3, sizing=SizingConfig())
    assert got.prefill == 3.0
    assert any("clamped to max_factor 3" in n and "15 s burst at 3.20x" in n for n in got.notes), got.notes


def test_forecast_carries_the_burst_and_a_note():
    o = burst_obs(100.0, history=hist([100, 176], [2.4, 9.6]))
    cfg = PlannerConfig(profile=ProfileConfig(dir="x")).predictor.model_copy(
        update={"name": "constant", "burst_lookback_intervals": 5})
    f = predict_load(o, cfg)
    # (100 x 1.2 + 176 x 3.0) / 276 = 2.348
    assert f.peak_ratio == pytest.approx(648 / 276) and f.peak_window_s == 15.0
    assert f.recent_peaks == ((100.0, 2.4), (176.0, 9.6))
    assert any(n.startswith("burst: peak 15 s rate 2.35x") for n in f.notes)
    last = predict_load(o, cfg.model_copy(update={"burst_lookback_intervals": 1}))  # the default: last interval
    assert last.peak_ratio == pytest.approx(3.0) and last.recent_peaks == ((176.0, 9.6),)
    none = predict_load(dataclasses.replace(o, history=hist([100, 176], None, window_s=None)), cfg)
    assert none.peak_ratio is None and none.recent_peaks == ()
    assert any("no peak-rate signal" in n for n in none.notes)


def test_what_if_scales_peaks_with_the_load():
    o = burst_obs(100.0, history=hist([100, 176], [2.4, 9.6]))
    scaled = apply_what_if(o, WhatIf(load_multiplier=2.0))
    assert scaled.peak_rps == 76.8 and scaled.history.peak_rps == (4.8, 19.2)


def test_missing_signal_plans_as_before(h200_profile_dir):
    from connectors.profiles import load_profile_dir

    profile = load_profile_dir(h200_profile_dir)
    cfg = PlannerConfig(profile=ProfileConfig(dir=str(h200_profile_dir)))
    fleet = FleetState(prefill=PoolState(4, 4), decode=PoolState(2, 2))
    base = Observation(taken_at_s=120.0, interval_s=60.0, num_requests=3000.0, avg_isl_tokens=2000.0,
                       avg_osl_tokens=200.0, avg_ttft_ms=120.0, avg_itl_ms=8.0,
                       history=hist([2000, 3000], None, window_s=None))
    off = cfg.model_copy(update={"sizing": cfg.sizing.model_copy(update={"burst_basis": "off"}),
                                 "correction": cfg.correction.model_copy(update={"burst_aware": False})})
    a = plan_interval(base, fleet, cfg, profile, now_s=120.0)
    b = plan_interval(base, fleet, off, profile, now_s=120.0)
    assert a.sizing == b.sizing and a.corrections == b.corrections and a.decision == b.decision
    bursty = dataclasses.replace(base, peak_rps=150.0, peak_window_s=15.0, history=hist([2000, 3000], [100, 150]))
    c = plan_interval(bursty, fleet, cfg, profile, now_s=120.0)
    # the burst explains part of the 120 ms TTFT (less is blamed on the engines) and sizing sees it
    assert c.corrections.prefill < a.corrections.prefill
    p = c.sizing["prefill"].numbers
    assert p["replicas_for_burst"] > p["replicas_flat"]
