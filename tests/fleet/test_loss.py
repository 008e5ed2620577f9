"""The loss model (planner.fleet.loss) is the sizing step's latency model read the other way round.

On the measured H200 Llama-8B profile: at the prefill count sizing chose, the TTFT share is exactly
sizing's own figure (reachable share x share met among them), and at one replica fewer it falls below
the quantile sizing aimed at; the same for decode's ITL quantile. Shares never fall as replicas rise.
"""

from __future__ import annotations

import warnings

import pytest

from connectors.profiles import load_profile_dir
from planner.config import SizingConfig, SloTarget
from planner.fleet.loss import itl_met_fracs, ttft_met_fracs
from planner.latency.ttft_view import ttft_view_of
from planner.sizing.pools import size_decode, size_prefill
from planner.types import Corrections, Forecast

SLO = SloTarget(ttft_ms=200, itl_ms=10)
CFG = SizingConfig()  # p99 of reachable requests within TTFT, p99 ITL, prompt and context CV 1


@pytest.fixture(scope="module")
def h200(h200_profile_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_profile_dir(h200_profile_dir)


def _sized(profile, rps):
    f = Forecast(num_requests=rps * 60, avg_isl_tokens=3000, avg_osl_tokens=300, num_requests_p90=rps * 60,
                 predictor="hand")
    kw = dict(corrections=Corrections(), slo=SLO, cfg=CFG, interval_s=60, size_on="mean")
    return size_prefill(f, profile=profile.prefill, **kw), size_decode(f, profile=profile.decode, **kw)


@pytest.mark.parametrize("rps", [5, 20, 50])
def test_ttft_share_at_sizings_count_is_sizings_own_figure(h200, rps):
    pre, _ = _sized(h200, rps)
    r = pre.replicas
    met = ttft_met_fracs(rps=rps, isl_tokens=3000, isl_cv=1.0, correction=1.0, ttft_target_ms=SLO.ttft_ms,
                         ttft=ttft_view_of(h200.prefill, None), arrival_cv=1.0, service_cv=1.0, up_to=r)
    reachable = pre.numbers["reachable_frac"]
    assert met[r] == pytest.approx(reachable * pre.numbers["ttft_met_frac"], rel=1e-9)
    assert met[r - 1] < reachable * CFG.ttft_quantile  # sizing's count is the fewest reaching the quantile
    assert met[0] == 0.0
    assert all(b >= a for a, b in zip(met, met[1:]))


@pytest.mark.parametrize("rps", [20, 50])
def test_itl_share_reaches_the_quantile_at_sizings_count(h200, rps):
    _, dec = _sized(h200, rps)
    r = dec.replicas
    assert dec.numbers["replicas_for_itl_quantile"] == r  # the ITL quantile binds at these loads
    met = itl_met_fracs(h200.decode, rps=rps, osl_tokens=300, context_tokens=3000 + 150, correction=1.0,
                        itl_target_ms=SLO.itl_ms, context_cv=1.0, arrival_cv=1.0, up_to=r)
    assert met[r] >= CFG.itl_quantile - 1e-6
    assert met[r - 1] < CFG.itl_quantile
    assert all(b >= a for a, b in zip(met, met[1:]))


def test_no_load_meets_everything_and_no_replica_meets_nothing(h200):
    assert ttft_met_fracs(rps=0, isl_tokens=3000, isl_cv=1.0, correction=1.0, ttft_target_ms=200,
                          ttft=ttft_view_of(h200.prefill, None), arrival_cv=1, service_cv=1, up_to=2) == (1.0,) * 3
    assert itl_met_fracs(h200.decode, rps=0, osl_tokens=300, context_tokens=3150, correction=1.0, itl_target_ms=10,
                         context_cv=1.0, arrival_cv=1.0, up_to=2) == (1.0,) * 3
    unreachable = itl_met_fracs(h200.decode, rps=5, osl_tokens=300, context_tokens=3150, correction=1.0,
                                itl_target_ms=0.1, context_cv=1.0, arrival_cv=1.0, up_to=3)
    assert unreachable == (0.0,) * 4  # 0.1 ms is below an idle engine's ITL
