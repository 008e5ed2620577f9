"""The planner's TTFT view (planner.latency.ttft_view): tabulated interpolation, and sizing / correction reading it.

Hand prefill profile (tests.support.fixtures_profile): TTFT = 0.1 ms/token over 500..4000 tokens.
Hand views: TTFT proportional to length, so log-log interpolation is exact between points.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.config import CorrectionConfig, PlannerConfig, SizingConfig, SloTarget
from planner.latency.correct import correction_factors
from planner.pipeline import plan_interval
from planner.latency.queueing import prefill_service_points_ms
from planner.sizing.pools import size_prefill
from planner.latency.ttft_view import ProfileTtftView, TabulatedTtftView
from planner.types import Corrections, FleetState, Forecast, Observation, PoolState
from tests.support.fixtures_profile import linear_engine, linear_prefill

ONE_LENGTH = SizingConfig(ttft_quantile=0.95, isl_cv=0.0, replica_startup_s=0.0)


def proportional(mean_ms_per_token: float, p90_ms_per_token: float, *, source: str = "published model t1"):
    """A view with TTFT = k x length at 100 and 10,000 tokens (exact in log-log between them)."""
    return TabulatedTtftView.from_points([100.0, 10_000.0], [mean_ms_per_token * 100, mean_ms_per_token * 10_000],
                                         [p90_ms_per_token * 100, p90_ms_per_token * 10_000], source=source)


@pytest.mark.parametrize("isl, quantile, expected", [
    pytest.param(2000.0, "mean", 20.0, id="log-log between (1000, 10) and (4000, 40): slope 1 -> 20"),
    pytest.param(2000.0, "p90", 40.0, id="p90 column (1000, 20) and (4000, 80) -> 40"),
    pytest.param(500.0, "mean", 10.0, id="below the first point: its TTFT, 10 (fixed per-batch cost)"),
    pytest.param(8000.0, "mean", 80.0, id="beyond the last: linear, 40 x 8000/4000 = 80"),
    pytest.param(1000.0, "p90", 20.0, id="on a point: exact"),
])
def test_tabulated_view_interpolates(isl, quantile, expected):
    view = TabulatedTtftView.from_points([1000, 4000], [10, 40], [20, 80], source="v")
    assert view.ttft_ms_at(isl, quantile=quantile) == pytest.approx(expected)
    assert view.ttft_ms_many(np.array([isl]), quantile=quantile)[0] == pytest.approx(expected)


@pytest.mark.parametrize("isl, mean, p90, message", [
    pytest.param([1000], [10], [20], "isl_tokens needs at least 2 points, got 1", id="one point"),
    pytest.param([1000, 1000], [10, 20], [20, 30], "strictly increasing", id="repeated length"),
    pytest.param([1000, 2000], [10, 0], [20, 30], "mean_ms must be finite and > 0 ms, got 0.0", id="zero TTFT"),
    pytest.param([1000, 2000], [10, 20], [20, float("nan")], "p90_ms must be finite", id="NaN p90"),
    pytest.param([1000, 2000], [10, 20], [20], "p90_ms has 1 points, isl_tokens 2", id="lengths differ"),
])
def test_tabulated_view_refuses_bad_tables(isl, mean, p90, message):
    with pytest.raises(ValueError, match=f"TTFT view v: .*{message}"):
        TabulatedTtftView.from_points(isl, mean, p90, source="v")


def test_profile_view_is_the_profile_with_its_extrapolation():
    """The profile's p90 is its mean; the points are what sizing always used (clip below, linear above)."""
    view = ProfileTtftView(linear_prefill())
    isl = np.array([100.0, 1000.0, 8000.0])
    assert view.ttft_ms_many(isl) == pytest.approx([50.0, 100.0, 800.0])
    assert view.ttft_ms_many(isl, quantile="p90") == pytest.approx([50.0, 100.0, 800.0])
    assert prefill_service_points_ms(linear_prefill(), isl_tokens=3000.0, isl_cv=0.0) == pytest.approx([300.0])
    assert (view.source, view.published) == ("profile", False)


def prefill(view, *, ttft_ms: float, requests: float = 300.0):
    forecast = Forecast(num_requests=requests, num_requests_p90=requests, avg_isl_tokens=1000.0, avg_osl_tokens=200.0,
                        predictor="test")
    return size_prefill(forecast, corrections=Corrections(), profile=linear_prefill(),
                        slo=SloTarget(ttft_ms=ttft_ms, itl_ms=25.0), cfg=ONE_LENGTH, interval_s=60.0, size_on="mean",
                        ttft_view=view)


def test_sizing_names_its_source_and_the_profile_view_changes_nothing():
    """Profile (None) and the profile's view explicitly: same replicas and numbers; 100 ms at 1000 tokens."""
    default, explicit = prefill(None, ttft_ms=500.0), prefill(ProfileTtftView(linear_prefill()), ttft_ms=500.0)
    assert default.numbers == explicit.numbers and default.replicas == explicit.replicas == 2
    assert default.numbers["ttft_from_published_model"] == 0.0
    assert default.numbers["single_request_ttft_ms"] == pytest.approx(100.0)
    assert default.message.endswith("; TTFT from profile")


def test_sizing_uses_the_model_mean_as_service_time_and_its_p90_for_reachability():
    """Model mean 0.1 ms/token (= the profile), p90 0.13: at 1000 tokens 100 and 130 ms.
    Target 120 ms: the profile's 100 ms fits (reachable); the model's p90 130 does not, so it sizes for
    130 x 1.25 = 162.5 ms, and the service time stays the mean's 100 ms."""
    profile = prefill(None, ttft_ms=120.0)
    model = prefill(proportional(0.1, 0.13), ttft_ms=120.0)
    assert profile.numbers["target_reachable"] == 1.0
    assert model.numbers["target_reachable"] == 0.0
    assert model.numbers["effective_ttft_target_ms"] == pytest.approx(162.5)
    assert model.numbers["service_ms"] == pytest.approx(100.0)
    assert model.numbers["service_p90_ms"] == pytest.approx(130.0)
    assert model.numbers["ttft_from_published_model"] == 1.0
    assert "TTFT target 120 ms unreachable: single-request TTFT 130 ms" in model.message
    assert model.message.endswith("; TTFT from published model t1")


def test_a_slower_model_mean_needs_more_replicas():
    """5 rps; target 500 ms. Profile: S = 100 ms -> 2 replicas (test_sizing's hand case). A model with a mean of
    0.3 ms/token: S = 300 ms, a = 1.5 erlangs. Erlang C: c=3 .2368 -> p95 wait .3/1.5 x ln(.2368/.05) = 311 ms,
    611 ms > 500; c=4 .0746 -> .3/2.5 x ln(.0746/.05) = 48 ms, 348 ms <= 500: 4."""
    assert prefill(None, ttft_ms=500.0).replicas == 2
    slow = prefill(proportional(0.3, 0.3), ttft_ms=500.0)
    assert slow.numbers["service_ms"] == pytest.approx(300.0)
    assert slow.numbers["ttft_quantile_ms"] == pytest.approx(348.0, abs=1.0)
    assert slow.replicas == 4


@pytest.mark.parametrize("view, expected", [
    pytest.param(None, 1.5, id="profile: 150 observed / 100 at 1000 tokens = 1.5"),
    pytest.param(proportional(0.12, 0.2), 1.25, id="model mean 120 ms: 150 / 120 = 1.25 (its p90 plays no part)"),
])
def test_correction_compares_with_the_source_in_use(view, expected):
    obs = Observation(taken_at_s=0.0, interval_s=60.0, num_requests=600.0, avg_isl_tokens=1000.0,
                      avg_osl_tokens=200.0, avg_ttft_ms=150.0, avg_itl_ms=20.0)
    c = correction_factors(obs, profile=linear_engine(), decode_replicas=2, cfg=CorrectionConfig(), ttft_view=view)
    assert c.prefill == pytest.approx(expected)


def test_plan_interval_threads_the_view_to_correct_and_interpolate():
    """The observed 150 ms at 1000 tokens: the profile reads a factor 1.5, a model whose mean is already 150 ms
    reads 1.0, so the prefill service time sizing uses is 150 ms both ways (the correction stays consistent)."""
    cfg = PlannerConfig(profile={"dir": "unused"}, predictor={"name": "constant"}, sizing={"isl_cv": 0.0})
    obs = Observation(taken_at_s=600.0, interval_s=60.0, num_requests=600.0, avg_isl_tokens=1000.0,
                      avg_osl_tokens=200.0, avg_ttft_ms=150.0, avg_itl_ms=20.0)
    fleet = FleetState(prefill=PoolState(0, 0), decode=PoolState(2, 2))
    by_profile = plan_interval(obs, fleet, cfg, linear_engine(), now_s=600.0)
    by_model = plan_interval(obs, fleet, cfg, linear_engine(), now_s=600.0, ttft_view=proportional(0.15, 0.15))
    assert by_profile.corrections.prefill == pytest.approx(1.5)
    assert by_model.corrections.prefill == pytest.approx(1.0)
    p, m = by_profile.sizing["prefill"], by_model.sizing["prefill"]
    assert p.numbers["service_ms"] == pytest.approx(m.numbers["service_ms"], rel=1e-3)
    assert m.message.endswith("TTFT from published model t1") and p.message.endswith("TTFT from profile")
