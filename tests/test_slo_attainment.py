"""The share of requests that met the TTFT target, from a frontend TTFT histogram (planner.slo_attainment)."""

import numpy as np
import pytest

from planner.slo_attainment import DYNAMO_TTFT_BOUNDS_S, share_within, ttft_histogram_of
from planner.types import LatencyHistogram

# Bounds 0.1, 0.22, 0.47 s; 10 requests <= 0.1 s, 20 more <= 0.22 s, 10 more <= 0.47 s, 10 above.
H = LatencyHistogram((0.1, 0.22, 0.47), (10.0, 30.0, 40.0, 50.0))


@pytest.mark.parametrize(
    "target_s, share, bucket",
    [
        pytest.param(0.2, (10 + 20 * (0.1 / 0.12)) / 50, (0.1, 0.22), id="inside a bucket: even spread within it"),
        pytest.param(0.22, 30 / 50, (0.1, 0.22), id="on a bound: exactly its count"),
        pytest.param(0.05, 10 * 0.5 / 50, (0.0, 0.1), id="first bucket: from 0"),
        pytest.param(0.0, 0.0, (0.0, 0.1), id="target 0"),
        pytest.param(2.0, 40 / 50, (0.47, float("inf")), id="past the last bound: the share below it, a lower bound"),
    ],
)
def test_share_within_reads_the_bucket_holding_the_target(target_s, share, bucket):
    got = share_within(H, target_s)
    assert got.share == pytest.approx(share) and got.bucket_s == bucket and got.requests == 50


def test_an_empty_histogram_has_no_share_and_a_bad_target_is_named():
    assert share_within(LatencyHistogram((0.1, 0.22), (0.0, 0.0, 0.0)), 0.2) is None
    with pytest.raises(ValueError, match="target must be >= 0 s"):
        share_within(H, -0.1)
    with pytest.raises(ValueError, match="latency histogram: need one count per bound"):
        LatencyHistogram((0.1, 0.22), (1.0, 2.0))
    with pytest.raises(ValueError, match="bounds must rise"):
        LatencyHistogram((0.22, 0.1), (1.0, 2.0, 3.0))


@pytest.mark.parametrize("scale_s", [0.05, 0.15, 0.4])
def test_through_dynamos_buckets_the_share_is_close_to_the_exact_one(scale_s):
    """Gamma TTFTs counted into Dynamo 1.6.1's buckets: the 200 ms share within the 0.1-0.22 s bucket's spread."""
    ttft = np.random.default_rng(0).gamma(2.0, scale_s / 2.0, 20_000)
    got = share_within(ttft_histogram_of(ttft), 0.2)
    exact = float(np.mean(ttft <= 0.2))
    in_bucket = float(np.mean((ttft > 0.1) & (ttft <= 0.22)))
    assert got.bucket_s == (0.1, 0.22) and got.requests == 20_000
    assert abs(got.share - exact) <= 0.25 * in_bucket + 1e-9
    assert ttft_histogram_of(ttft).upper_bounds_s == DYNAMO_TTFT_BOUNDS_S
