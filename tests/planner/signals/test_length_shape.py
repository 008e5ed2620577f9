"""Measured length spread (planner.signals.length_shape): from a frontend's histograms to the CVs sizing uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flows.config import ReplayInputs
from planner.config import PredictorConfig, SizingConfig, SloTarget
from planner.signals.length_shape import (
    DYNAMO_ISL_BOUNDS_TOKENS,
    DYNAMO_OSL_BOUNDS_TOKENS,
    histogram_from_buckets,
    histogram_moments,
    histogram_of,
    measure_length_shape,
)
from planner.steps import predict_load
from planner.types import Corrections, LengthHistogram, LoadHistory, Observation


def _gamma(cv: float, mean: float, n: int, seed: int) -> np.ndarray:
    shape = 1.0 / cv**2
    return np.random.default_rng(seed).gamma(shape, mean / shape, n)


@pytest.mark.parametrize("cv", [0.3, 0.5, 1.0, 2.0, 3.0])
def test_gamma_prompts_read_back_through_dynamos_buckets(cv):
    """20,000 Gamma prompts (mean 2,000) counted into Dynamo 1.6.1's ISL buckets: the CV within 11%."""
    isl = _gamma(cv, 2000.0, 20_000, seed=1)
    osl = _gamma(1.0, 300.0, 20_000, seed=2)
    shape, note = measure_length_shape(histogram_of(isl, DYNAMO_ISL_BOUNDS_TOKENS, window_s=60.0),
                                       histogram_of(osl, DYNAMO_OSL_BOUNDS_TOKENS, window_s=60.0), min_requests=100)
    ctx = isl + osl / 2.0
    assert shape.isl_cv == pytest.approx(isl.std() / isl.mean(), rel=0.11)
    assert shape.decode_context_cv == pytest.approx(ctx.std() / ctx.mean(), rel=0.11)
    assert shape.requests == 20_000 and shape.window_s == 60.0
    assert f"ISL CV {shape.isl_cv:.2f}" in note and "20000 prompts in the last 60 s" in note


@pytest.mark.parametrize("cv", [0.3, 1.0, 3.0])
def test_vllm_1_2_5_buckets_read_back_too(cv):
    """vLLM's request_prompt_tokens histogram (1, 2, 5, 10, 20, 50, ... buckets) through the same estimate."""
    bounds = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))
    isl = _gamma(cv, 2000.0, 20_000, seed=8)
    shape, _ = measure_length_shape(histogram_of(isl, bounds, window_s=60.0), None, min_requests=100)
    assert shape.isl_cv == pytest.approx(isl.std() / isl.mean(), rel=0.08)


def test_moments_by_hand():
    # 4 prompts of up to 100 tokens (uniform on 0..100: mean 50, E[x^2] 10000/3),
    # 2 in (100, 210] with no non-empty neighbour on the right but one on the left: a power law through both.
    h = LengthHistogram((0.0, 100.0, 210.0), (0.0, 4.0, 4.0, 4.0), None, 60.0)
    assert histogram_moments(h) == pytest.approx((50.0, 10000.0 / 3.0))
    # A single bucket (100, 210] alone is log-uniform: mean (b - a) / ln(b / a).
    lone = LengthHistogram((0.0, 100.0, 210.0), (0.0, 0.0, 3.0, 3.0), None, 60.0)
    mean, second = histogram_moments(lone)
    assert mean == pytest.approx(110.0 / math.log(2.1))
    assert second == pytest.approx((210.0**2 - 100.0**2) / (2 * math.log(2.1)))


def test_the_inf_bucket_takes_what_the_sum_leaves():
    # 2 prompts <= 100 (uniform: 50 each by the estimate) and 1 above 130,000; the sum says 200,100 tokens.
    bounds = DYNAMO_ISL_BOUNDS_TOKENS
    counts = (0.0,) + (2.0,) * (len(bounds) - 1) + (3.0,)
    mean, second = histogram_moments(LengthHistogram(bounds, counts, 200_100.0, 60.0))
    assert mean == pytest.approx(200_100.0 / 3.0)
    assert second == pytest.approx((2 * 10000.0 / 3.0 + 200_000.0**2) / 3.0)
    # Without the sum (or with one below it) the tail sits at its lower bound.
    mean_no_sum, _ = histogram_moments(LengthHistogram(bounds, counts, None, 60.0))
    assert mean_no_sum == pytest.approx((100.0 + 130_000.0) / 3.0)


def test_a_counter_reset_never_makes_a_negative_bucket():
    h = LengthHistogram((0.0, 100.0, 210.0), (0.0, 5.0, 4.0, 6.0), None, 60.0)  # 4 < 5: scraped out of step
    mean, second = histogram_moments(h)
    assert math.isfinite(mean) and second >= mean * mean
    assert math.isnan(histogram_moments(LengthHistogram((0.0, 100.0), (0.0, 0.0, 0.0), None, 60.0))[0])


def test_too_few_prompts_leave_the_configured_cvs():
    h = histogram_of([500.0] * 50, DYNAMO_ISL_BOUNDS_TOKENS, window_s=1800.0)
    shape, note = measure_length_shape(h, None, min_requests=200)
    assert shape is None
    assert note == "length shape: 50 prompts in the last 1800 s (< 200); configured CVs used"


def test_without_output_lengths_the_context_cv_is_the_prompts():
    isl = _gamma(2.0, 1000.0, 5000, seed=3)
    shape, note = measure_length_shape(histogram_of(isl, DYNAMO_ISL_BOUNDS_TOKENS, window_s=60.0), None,
                                       min_requests=1)
    assert shape.decode_context_cv == shape.isl_cv > 1.5
    assert "no output lengths" in note


def test_prometheus_buckets_parse_in_bound_order():
    h = histogram_from_buckets({"+Inf": 10.0, "100": 4.0, "0": 0.0, "210": 9.0}, sum_tokens=1234.0, window_s=600.0)
    assert h == LengthHistogram((0.0, 100.0, 210.0), (0.0, 4.0, 9.0, 10.0), 1234.0, 600.0)


@pytest.mark.parametrize("buckets, message", [
    ({}, "no bucket series"),
    ({"100": 4.0, "210": 9.0}, 'no le="+Inf" bucket'),
    ({"abc": 1.0, "+Inf": 2.0}, "bucket bound le='abc' is not a number"),
    ({"100": None, "+Inf": 2.0}, "bucket le='100' has no finite value"),
    ({"+Inf": 2.0}, "length histogram: need one count per bound and the total"),
])
def test_broken_bucket_series_are_named(buckets, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        histogram_from_buckets(buckets, sum_tokens=None, window_s=60.0)


def test_bad_histogram_values_are_refused():
    with pytest.raises(ValueError, match="finite bounds must rise"):
        LengthHistogram((100.0, 100.0), (1.0, 2.0, 3.0), None, 60.0)
    with pytest.raises(ValueError, match="one count per bound"):
        LengthHistogram((100.0,), (1.0,), None, 60.0)


def _observation(isl: np.ndarray, osl: np.ndarray) -> Observation:
    history = LoadHistory(t_s=tuple(60.0 * k for k in range(1, 7)), num_requests=(9000.0,) * 6,
                          avg_isl_tokens=(float(isl.mean()),) * 6, avg_osl_tokens=(float(osl.mean()),) * 6,
                          interval_s=60.0)
    return Observation(
        taken_at_s=360.0, interval_s=60.0, num_requests=9000.0, avg_isl_tokens=float(isl.mean()),
        avg_osl_tokens=float(osl.mean()), avg_ttft_ms=None, avg_itl_ms=None, history=history,
        isl_histogram=histogram_of(isl, DYNAMO_ISL_BOUNDS_TOKENS, window_s=1800.0),
        osl_histogram=histogram_of(osl, DYNAMO_OSL_BOUNDS_TOKENS, window_s=1800.0),
    )


def test_the_forecast_carries_the_measured_shape_and_says_so():
    obs = _observation(_gamma(3.0, 1200.0, 5000, seed=4), _gamma(1.0, 250.0, 5000, seed=5))
    forecast = predict_load(obs, PredictorConfig(name="constant"))
    assert forecast.length_shape is not None and forecast.length_shape.isl_cv > 2.5
    assert any(n.startswith("length shape over 5000 prompts in the last 1800 s") for n in forecast.notes)
    few = predict_load(obs, PredictorConfig(name="constant", length_shape_min_requests=6000))
    assert few.length_shape is None
    assert any("(< 6000); configured CVs used" in n for n in few.notes)


def test_sizing_uses_the_measured_cvs_only_when_asked(h200_profile_dir):
    """A heavy-tailed workload (CV 3) is sized as one, not as the configured CV 1; `configured` ignores it."""
    from connectors.profiles import load_profile_dir
    from planner.sizing.pools import size_decode, size_prefill

    h200_profile = load_profile_dir(h200_profile_dir)
    base = PredictorConfig(name="constant")
    obs = _observation(_gamma(3.0, 1200.0, 5000, seed=4), _gamma(1.0, 250.0, 5000, seed=5))
    forecast = predict_load(obs, base)
    common = dict(corrections=Corrections(), slo=SloTarget(ttft_ms=200.0, itl_ms=10.0), interval_s=60.0)
    measured = size_prefill(forecast, profile=h200_profile.prefill, cfg=SizingConfig(), **common)
    configured = size_prefill(forecast, profile=h200_profile.prefill, cfg=SizingConfig(length_cv="configured"),
                              **common)
    assert measured.numbers["length_cv_measured"] == 1.0 and configured.numbers["length_cv_measured"] == 0.0
    assert f"CV {forecast.length_shape.isl_cv:.3g} measured" in measured.message
    assert "CV 1 configured" in configured.message
    assert measured.numbers["isl_cv"] == pytest.approx(forecast.length_shape.isl_cv)
    # A heavier tail: more prompts too long to meet the target on any fleet, a longer mean service time.
    assert measured.numbers["reachable_frac"] < configured.numbers["reachable_frac"]
    assert measured.numbers["service_ms"] > configured.numbers["service_ms"]
    decode = size_decode(forecast, profile=h200_profile.decode, cfg=SizingConfig(), **common)
    assert f"context CV {forecast.length_shape.decode_context_cv:.3g} measured" in decode.message


def test_an_observation_with_histograms_survives_a_prefect_parameter_round_trip():
    """Flow parameters travel as JSON: the histograms (no +Inf in them) come back equal."""
    obs = _observation(_gamma(1.0, 1000.0, 300, seed=6), _gamma(1.0, 200.0, 300, seed=7))
    again = ReplayInputs.model_validate_json(ReplayInputs(observation=obs, now_s=360.0).model_dump_json())
    assert again.observation.isl_histogram == obs.isl_histogram
    assert again.observation.osl_histogram == obs.osl_histogram



@pytest.mark.parametrize("x, y", [
    ([4.6, 5.3], [-1.0, -2.5]),
    ([4.6, 5.3, 6.1], [-1.0, -2.5, -2.9]),
    ([6.8, 7.5, 8.2], [0.3, 0.3, 0.3]),  # flat: slope 0
    ([7.5, 8.2, 8.9], [-6.0, -3.0, -7.0]),  # a peak in the middle
])
def test_bucket_slope_is_the_least_squares_line_through_its_neighbours(x, y):
    # The power-law exponent of a bucket is the least-squares slope through it and its non-empty neighbours.
    from planner.signals.length_shape import _line_slope

    assert _line_slope(x, y) == pytest.approx(float(np.polyfit(x, y, 1)[0]), rel=1e-12, abs=1e-12)
