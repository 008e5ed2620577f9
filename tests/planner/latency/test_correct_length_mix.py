"""The prefill factor's expectation: the mean prompt clamped to the profile, unclamped, or the length mix sizing
uses (correction.prefill_expected). Hand profile (see fixtures_profile): TTFT = 0.1 ms/token over its
measured 500..4000 tokens, past 4000 the longest TTFT scaled with length (400 ms x ISL / 4000)."""

from __future__ import annotations

import pytest

from planner.config import CorrectionConfig
from planner.latency.correct import correction_factors, expected_prefill_ms
from planner.latency.ttft_view import ProfileTtftView
from planner.types import Observation
from tests.support.fixtures_profile import linear_engine, linear_prefill

CFG = CorrectionConfig()  # bounds 0.5..3


def obs(isl: float, ttft_ms: float) -> Observation:
    return Observation(taken_at_s=0.0, interval_s=60.0, num_requests=600.0, avg_isl_tokens=isl,
                       avg_osl_tokens=200.0, avg_ttft_ms=ttft_ms, avg_itl_ms=20.0)


@pytest.mark.parametrize("isl, cv, expected_ms", [
    pytest.param(1000.0, 0.0, 100.0, id="one length, in range: 0.1 x 1000 = 100 ms"),
    pytest.param(8000.0, 0.0, 800.0, id="one length past the profile: 400 x 8000/4000 = 800 ms (not 400)"),
    # Gamma, mean 20000, CV 0.5: every one of the 64 points is over 4000 tokens, where TTFT is 0.1 x length,
    # so the mean TTFT is 0.1 x the points' mean (the mean, less the tail the 64 midpoints leave out: < 1%).
    pytest.param(20000.0, 0.5, 2000.0, id="length mix past the profile: 0.1 x 20000 = 2000 ms"),
])
def test_expected_prefill_ms(isl, cv, expected_ms):
    got = expected_prefill_ms(ProfileTtftView(linear_prefill()), isl_tokens=isl, isl_cv=cv)
    assert got == pytest.approx(expected_ms, rel=0.01)


@pytest.mark.parametrize("isl, ttft_ms, isl_cv, expected", [
    pytest.param(8000.0, 800.0, None, 2.0, id="mean prompt clamped to 4000: 800 / 400 = 2 (long prompts read as slow)"),
    pytest.param(8000.0, 800.0, 0.0, 1.0, id="mean prompt extrapolated: 800 / 800 = 1"),
    pytest.param(20000.0, 3000.0, 0.5, 1.5, id="length mix: 3000 / 2000 = 1.5"),
    pytest.param(1000.0, 150.0, 0.0, 1.5, id="in range, one length: 150 / 100 = 1.5, as the clamped rule"),
])
def test_prefill_factor_expectation(isl, ttft_ms, isl_cv, expected):
    c = correction_factors(obs(isl, ttft_ms), profile=linear_engine(), decode_replicas=2, cfg=CFG, isl_cv=isl_cv)
    assert c.prefill == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("isl_cv", [-0.1, float("nan")])
def test_expected_prefill_ms_rejects_bad_cv(isl_cv):
    with pytest.raises(ValueError, match="isl_cv must be a number >= 0"):
        expected_prefill_ms(ProfileTtftView(linear_prefill()), isl_tokens=1000.0, isl_cv=isl_cv)
