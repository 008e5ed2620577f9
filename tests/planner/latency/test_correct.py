"""Correction factors: observed / expected latency, bounded; hand-made profile (see fixtures_profile)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from connectors.profiles import load_profile_dir
from planner.config import CorrectionConfig, SizingConfig
from planner.latency.correct import correction_factors
from planner.latency.queueing import mean_wait_s
from planner.types import Observation
from tests.support.fixtures_profile import linear_engine

NAN = float("nan")
CFG = CorrectionConfig()  # bounds 0.5..3, min_requests 10


def obs(**kw) -> Observation:
    """600 requests in 60 s (10 rps), ISL 1000, OSL 200, TTFT 100 ms, ITL 20 ms unless overridden."""
    base = dict(
        taken_at_s=0.0, interval_s=60.0, num_requests=600.0, avg_isl_tokens=1000.0, avg_osl_tokens=200.0,
        avg_ttft_ms=100.0, avg_itl_ms=20.0,
    )
    base.update(kw)
    return Observation(**base)


@pytest.mark.parametrize("kw, expected, note", [
    pytest.param({}, 1.0, None, id="100 ms observed / 100 ms at ISL 1000 = 1"),
    pytest.param({"avg_ttft_ms": 150.0}, 1.5, None, id="150/100 = 1.5"),
    pytest.param({"avg_ttft_ms": 300.0, "avg_isl_tokens": 2000.0}, 1.5, None, id="300 / 200 at ISL 2000 = 1.5"),
    pytest.param({"avg_ttft_ms": 40.0}, 0.5, "clamped to min_factor 0.5", id="40/100 = 0.4 -> min 0.5"),
    pytest.param({"avg_ttft_ms": 1000.0}, 3.0, "clamped to max_factor 3", id="1000/100 = 10 -> max 3"),
    pytest.param({"avg_ttft_ms": None}, 1.0, "avg_ttft_ms missing", id="no TTFT -> 1"),
    pytest.param({"avg_ttft_ms": NAN}, 1.0, "avg_ttft_ms is nan", id="NaN TTFT -> 1"),
    pytest.param({"avg_ttft_ms": 0.0}, 1.0, "avg_ttft_ms is 0", id="zero TTFT -> 1"),
    pytest.param({"avg_isl_tokens": 0.0}, 1.0, "avg_isl_tokens is 0", id="zero ISL -> 1"),
    pytest.param({"avg_ttft_ms": 800.0, "avg_isl_tokens": 8000.0}, 2.0, "ISL 8000 tokens outside profiled 500..4000",
                 id="ISL 8000 beyond 4000: 800 / 400 at 4000 = 2"),
])
def test_prefill_factor(kw, expected, note):
    c = correction_factors(obs(**kw), profile=linear_engine(), decode_replicas=2, cfg=CFG)
    assert c.prefill == pytest.approx(expected)
    if note is None:
        assert not [n for n in c.notes if n.startswith("prefill")]
    else:
        assert any(n.startswith("prefill") and note in n for n in c.notes), c.notes


# running = 10 rps * 200 tokens * ITL_s / 2 replicas; context = 1000 + 200/2 = 1100;
# kv = running * 1100 / 100,000. Both rows are straight lines, row 1000 ITL = 7.5 + 25 kv,
# row 2000 = 17.5 + 25 kv; at 1100, w = (1/1000 - 1/1100)/(1/1000 - 1/2000) = 2/11.
W_1100 = (1 / 1000 - 1 / 1100) / (1 / 1000 - 1 / 2000)


def _itl_1100(kv):
    return 7.5 + 25 * kv + 10 * W_1100


@pytest.mark.parametrize("kw, replicas, cfg, expected, note", [
    pytest.param({}, 2, CFG, 20 / _itl_1100(0.22), None,
                 id="running 10*200*0.02/2 = 20, kv 20*1100/1e5 = 0.22, expected 7.5+5.5+1.818 = 14.82: 20/14.82"),
    pytest.param({"avg_itl_ms": 10.0}, 2, CFG, 10 / _itl_1100(0.11), None,
                 id="ITL 10: running 10, kv 0.11, expected 7.5+2.75+1.818 = 12.07: 10/12.07 = 0.829"),
    pytest.param({"avg_itl_ms": 10.0}, 2, CorrectionConfig(min_factor=0.9), 0.9, "clamped to min_factor 0.9",
                 id="same 0.829 below min_factor 0.9 -> 0.9"),
    pytest.param({"avg_itl_ms": 100.0}, 1, CFG, 3.0, "above profiled",
                 id="running 200, kv 2.2 > 0.9 -> kv 0.9, expected 31.8: 100/31.8 = 3.1 -> max 3"),
    pytest.param({"avg_itl_ms": None}, 2, CFG, 1.0, "avg_itl_ms missing", id="no ITL -> 1"),
    pytest.param({"avg_itl_ms": NAN}, 2, CFG, 1.0, "avg_itl_ms is nan", id="NaN ITL -> 1"),
    pytest.param({"avg_osl_tokens": 0.0}, 2, CFG, 1.0, "avg_osl_tokens is 0", id="zero OSL -> 1"),
    pytest.param({}, 0, CFG, 1.0, "decode_replicas is 0", id="no decode replicas -> 1"),
])
def test_decode_factor(kw, replicas, cfg, expected, note):
    c = correction_factors(obs(**kw), profile=linear_engine(), decode_replicas=replicas, cfg=cfg)
    assert c.decode == pytest.approx(expected, rel=1e-9)
    if note is None:
        assert not [n for n in c.notes if n.startswith("decode")]
    else:
        assert any(n.startswith("decode") and note in n for n in c.notes), c.notes


@pytest.mark.parametrize("o, cfg, note", [
    pytest.param(obs(avg_ttft_ms=1000.0, avg_itl_ms=90.0), CorrectionConfig(enabled=False), "corrections disabled",
                 id="switch off: both 1"),
    pytest.param(obs(num_requests=5.0, avg_ttft_ms=1000.0), CFG, "cold start: 5 requests < min_requests 10",
                 id="cold start 5 < 10: both 1"),
    pytest.param(obs(num_requests=0.0, avg_ttft_ms=1000.0), CFG, "num_requests is 0", id="idle: both 1"),
    pytest.param(obs(num_requests=None), CFG, "num_requests missing", id="no request count: both 1"),
    pytest.param(obs(num_requests=NAN), CFG, "num_requests is nan", id="NaN request count: both 1"),
    pytest.param(obs(avg_ttft_ms=1000.0, stale_reasons=("prometheus: newest sample 340 s old",)), CFG,
                 "stale observation (prometheus: newest sample 340 s old)", id="stale: both 1"),
])
def test_neutral_factors(o, cfg, note):
    c = correction_factors(o, profile=linear_engine(), decode_replicas=2, cfg=cfg)
    assert (c.prefill, c.decode) == (1.0, 1.0)
    assert c.enabled is cfg.enabled
    assert any(note in n for n in c.notes), c.notes


@pytest.mark.parametrize("k", [0.6, 1.0, 1.3, 1.45])
def test_queue_aware_prefill_factor_recovers_the_service_multiplier(k):
    """Observed TTFT = model mean at k x service: the factor is k, not TTFT/service (which includes queueing).

    20 rps on 3 replicas with 100 ms service is stable for k < 3/(20*0.1) = 1.5.
    """
    sizing = SizingConfig()
    o = obs(num_requests=1200.0)  # 20 rps; service at ISL 1000 = 100 ms; 3 replicas
    observed = 1000 * (k * 0.1 + mean_wait_s(servers=3, arrival_rps=20.0, service_s=k * 0.1, variability=1.0))
    c = correction_factors(dataclasses.replace(o, avg_ttft_ms=observed), profile=linear_engine(),
                           decode_replicas=2, cfg=CFG, prefill_replicas=3, sizing=sizing)
    assert c.prefill == pytest.approx(k, rel=1e-5)
    assert observed / 100.0 > k  # the plain ratio would have counted queueing as slowness


def test_queue_aware_factor_falls_back_to_plain_ratio_when_the_model_is_overloaded():
    """20 rps x 100 ms x 0.5 = 1 erlang on 1 replica: unstable even at min_factor, so the plain
    ratio is used: 5000 ms / 100 ms = 50 -> max 3, with notes."""
    o = obs(num_requests=1200.0, avg_ttft_ms=5000.0)
    c = correction_factors(o, profile=linear_engine(), decode_replicas=2, cfg=CFG, prefill_replicas=1,
                           sizing=SizingConfig())
    assert c.prefill == 3.0
    assert any("overloaded" in n for n in c.notes), c.notes
    assert any("clamped to max_factor 3" in n for n in c.notes), c.notes


def test_queue_aware_factor_below_model_is_clamped_to_min():
    """20 rps, 3 replicas: model mean TTFT at k=0.5 is 50 ms + a little wait; 30 ms observed -> 0.5."""
    o = obs(num_requests=1200.0, avg_ttft_ms=30.0)
    c = correction_factors(o, profile=linear_engine(), decode_replicas=2, cfg=CFG, prefill_replicas=3,
                           sizing=SizingConfig())
    assert c.prefill == 0.5
    assert any("clamped to min_factor 0.5" in n for n in c.notes), c.notes


def test_real_profile_factors_are_finite_and_bounded(h200_profile_dir):
    prof = load_profile_dir(h200_profile_dir)
    for ttft in (1e-3, 50.0, 5e5):
        for itl in (1e-3, 10.0, 1e4):
            c = correction_factors(obs(avg_ttft_ms=ttft, avg_itl_ms=itl, avg_isl_tokens=3000.0),
                                   profile=prof, decode_replicas=3, cfg=CFG)
            for f in (c.prefill, c.decode):
                assert math.isfinite(f) and 0.5 <= f <= 3.0
