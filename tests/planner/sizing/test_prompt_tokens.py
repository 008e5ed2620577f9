"""Prefill sized on the prompt-token forecast (predictor.forecast_prompt_tokens), with hand arithmetic.

Hand prefill (see fixtures_profile): TTFT = 0.1 ms/token, throughput 10,000 tokens/s/GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.config import PredictorConfig, SizingConfig, SloTarget
from planner.predict import forecast_next, prompt_token_series
from planner.sizing.pools import size_prefill, sized_value
from planner.types import Corrections, Forecast, LoadHistory
from tests.support.fixtures_profile import linear_prefill

NAN = float("nan")


def test_prompt_token_series():
    got = prompt_token_series(np.array([10.0, 0.0, NAN, 5.0]), np.array([100.0, NAN, 200.0, 300.0]))
    # 10 x 100; no request: 0 tokens; count missing: unknown; 5 x 300
    np.testing.assert_array_equal(got, [1000.0, 0.0, NAN, 1500.0])


@pytest.mark.parametrize("on, expected", [
    pytest.param(True, 9000.0, id="constant predictor: the last interval's 30 x 300 = 9000 tokens"),
    pytest.param(False, None, id="off: not forecast"),
])
def test_forecast_next_prompt_tokens(on, expected):
    h = LoadHistory(t_s=(60.0, 120.0, 180.0), num_requests=(10.0, 20.0, 30.0), avg_isl_tokens=(100.0, 200.0, 300.0),
                    avg_osl_tokens=(10.0, 10.0, 10.0), interval_s=60.0)
    f = forecast_next(h, PredictorConfig(name="constant", forecast_prompt_tokens=on))
    assert f.prompt_tokens == expected
    if on:
        assert f.prompt_tokens_p90 >= f.prompt_tokens


@pytest.mark.parametrize("mean, upper, size_on, horizon, expected", [
    pytest.param(100.0, 130.0, "mean", 2, 100.0, id="mean: 100"),
    pytest.param(100.0, 130.0, "p90", 1, 130.0, id="p90 next interval: 130"),
    pytest.param(100.0, 130.0, "p90", 4, 160.0, id="p90 4 ahead: 100 + 30 x sqrt(4) = 160"),
    pytest.param(100.0, 90.0, "p90", 4, 100.0, id="upper below the mean: the mean"),
])
def test_sized_value(mean, upper, size_on, horizon, expected):
    assert sized_value(mean, upper, size_on, horizon_intervals=horizon)[0] == pytest.approx(expected)


def fc(*, tokens: float | None, tokens_p90: float | None = None) -> Forecast:
    """600 requests of mean ISL 1000 (600,000 tokens by the count), OSL 200."""
    return Forecast(num_requests=600.0, avg_isl_tokens=1000.0, avg_osl_tokens=200.0, num_requests_p90=600.0,
                    predictor="constant", prompt_tokens=tokens,
                    prompt_tokens_p90=tokens if tokens_p90 is None else tokens_p90)


@pytest.mark.parametrize("forecast, size_on, requests", [
    pytest.param(fc(tokens=None), "mean", 600.0, id="no token forecast: the count, 600"),
    pytest.param(fc(tokens=1_200_000.0), "mean", 1200.0, id="1.2M tokens / ISL 1000 = 1200 requests' work"),
    pytest.param(fc(tokens=600_000.0, tokens_p90=900_000.0), "p90", 900.0, id="p90 tokens: 900,000 / 1000 = 900"),
])
def test_prefill_sized_on_prompt_tokens(forecast, size_on, requests):
    # One prompt length, no startup lead, TTFT 1 s: the load is all that moves the count.
    cfg = SizingConfig(isl_cv=0.0, replica_startup_s=0.0, length_cv="configured", burst_basis="off")
    s = size_prefill(forecast, corrections=Corrections(1.0, 1.0), profile=linear_prefill(),
                     slo=SloTarget(ttft_ms=1000.0, itl_ms=25.0), cfg=cfg, interval_s=60.0, size_on=size_on)
    assert s.numbers["requests"] == pytest.approx(requests)
    assert s.numbers["load_rps"] == pytest.approx(requests / 60.0)
    # offered load = rps x 100 ms; at least that many replicas
    assert s.replicas >= math.ceil(requests / 60.0 * 0.1)
    if forecast.prompt_tokens is not None:
        assert s.numbers["requests_from_count"] == 600.0
